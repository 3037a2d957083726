#!/usr/bin/env bash
# The GPU machine's offline build, simulated here (CI runs it from .ci/run).
#
# The lent GPU machine is a fresh image with nvcc, CMake and Python but none of our Debian
# libraries, and no network: only what a device call carries (.gpu_deps/, a bundle) can
# serve. This script runs a command in that situation on this machine, as root:
#   - a private mount and network namespace (unshare --mount --net): no registry reachable;
#   - an overlay on /usr whose upper layer (a tmpfs) whites out every file installed by the
#     packages of tools/debian-packages.txt and tools/debian-packages-gpu.txt (headers,
#     libraries, CMake files), and by the other BLAS/LAPACK, GoogleTest-source and MPI
#     packages a build could fall back on; the toolchain (cmake, g++, make, nvcc under
#     /usr/local/cuda) and libssl3 (in every base image) stay;
#   - a dpkg status without those packages, and apt-get / apt that refuse to install;
#   - .gpu_deps/ holding the carried .debs (tools/gpu_deps.sh fetches them when missing).
# The simulation checks itself before the command runs (a hidden header, dpkg, DNS) and
# refuses to go on if a package is still visible, so the check cannot pass vacuously.
#
# Usage: bash tools/offline_build_check.sh [--drop PKG]... [--expect-failure REGEX]
#                                         [--build-dir DIR] [-- CMD...]
#   CMD          default: bash tools/gpu_bundle.sh --build-dir DIR — the GPU build stage of
#                tools/gpu_check.sh (probe, carried packages, configure, build, load check)
#                and the bundle made from it, unpacked into a fresh folder and run there.
#   --drop PKG   leave PKG's .deb out of the carried set (a fresh build dir): the command
#                must then fail. --expect-failure REGEX: exit 0 only if it failed AND its
#                output matches REGEX (grep -E), so it cannot pass by failing for another
#                reason.
#   --build-dir  default build-offline (build-offline-drop with --drop)
# Exit status: the command's (inverted with --expect-failure); 3 the simulation failed.
# One { } block: bash reads it whole before running it, so editing this file while it runs
# (a long build) cannot change what runs.
{
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

drop=()
expect_failure=""
build_dir=""
cmd=()
while (($#)); do
  case "$1" in
    --drop) drop+=("$2"); shift 2 ;;
    --expect-failure) expect_failure="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --) shift; cmd=("$@"); break ;;
    *) echo "offline_build_check: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [[ -z "$build_dir" ]]; then
  build_dir=build-offline
  ((${#drop[@]})) && build_dir=build-offline-drop
fi
((${#cmd[@]})) || cmd=(bash tools/gpu_bundle.sh --build-dir "$build_dir")
say() { echo "[offline_build_check] $*"; }
fail_sim() { echo "[offline_build_check] SIMULATION FAILED: $*" >&2; exit 3; }

[[ "$(id -u)" == 0 ]] || fail_sim "needs root (mount and network namespaces)"
command -v unshare >/dev/null || fail_sim "unshare (util-linux) not found"
command -v dpkg >/dev/null || fail_sim "dpkg not found: the simulation hides Debian packages"

# The carried packages (fetched once; .gpu_deps/ is git-ignored).
if ! compgen -G ".gpu_deps/*.deb" >/dev/null; then
  say "no .gpu_deps/: fetching it (tools/gpu_deps.sh)"
  bash tools/gpu_deps.sh
fi
deps_dir=.gpu_deps
if ((${#drop[@]})); then
  deps_dir="$(mktemp -d /tmp/st_gpu_deps_drop.XXXXXX)"
  cp .gpu_deps/*.deb "$deps_dir/"
  for p in "${drop[@]}"; do
    compgen -G "$deps_dir/${p}_*.deb" >/dev/null || fail_sim "--drop $p: no such .deb in .gpu_deps/"
    rm -f "$deps_dir/${p}"_*.deb
    say "dropped $p from the carried packages"
  done
  rm -rf "$build_dir"
fi

# Packages to hide: both lists, plus what a build could silently fall back on.
mapfile -t listed < <(cat tools/debian-packages.txt tools/debian-packages-gpu.txt | grep -v '^#' |
  tr ' ' '\n' | grep . | sort -u)
extra=(libopenblas-dev libopenblas0 libopenblas-pthread-dev libopenblas0-pthread
  libopenblas64-dev libblas-dev libblas3 liblapack-dev liblapack3 libatlas-base-dev
  googletest libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libmpich-dev mpich)
keep=" cmake g++ make libssl3 "
hide=()
for p in $(printf '%s\n' "${listed[@]}" "${extra[@]}" | sort -u); do
  [[ "$keep" == *" $p "* ]] && continue
  dpkg -s "$p" >/dev/null 2>&1 && hide+=("$p")
done
say "hiding ${#hide[@]} installed packages: ${hide[*]}"

# Their files under /usr (Debian 12 has merged /usr: /lib is /usr/lib).
list="$(mktemp /tmp/st_offline_files.XXXXXX)"
for p in "${hide[@]}"; do dpkg -L "$p"; done |
  sed -E 's#^/(lib|lib64|bin|sbin)/#/usr/\1/#' | grep '^/usr/' | sort -u >"$list"
status="$(mktemp /tmp/st_offline_status.XXXXXX)"
# The dpkg status without the hidden packages' stanzas.
awk -v hide=" ${hide[*]} " '
  BEGIN { RS = ""; ORS = "\n\n" }
  { if (match($0, /(^|\n)Package: [^\n]+/)) {
      name = substr($0, RSTART, RLENGTH); sub(/^\n?Package: /, "", name)
      if (index(hide, " " name " ")) next
    }
    print }' /var/lib/dpkg/status >"$status"

export ST_OFFLINE_FILES="$list" ST_OFFLINE_STATUS="$status" ST_OFFLINE_DEPS="$deps_dir"
export ST_OFFLINE_PROBE_PKG="${hide[0]:-}"
output="$(mktemp /tmp/st_offline_output.XXXXXX)"
set +e
unshare --mount --net --propagation private bash -s -- "${cmd[@]}" 2>&1 <<'INNER' | tee "$output"
set -euo pipefail
fail_sim() { echo "[offline_build_check] SIMULATION FAILED: $*" >&2; exit 3; }
tmp="$(mktemp -d /tmp/st_offline_ns.XXXXXX)"
mount -t tmpfs tmpfs "$tmp" || fail_sim "cannot mount a tmpfs"
mkdir -p "$tmp/upper" "$tmp/work"
# Whiteouts (character devices 0/0) for every file and link of the hidden packages.
while IFS= read -r f; do
  if [[ -L "$f" || -f "$f" ]]; then
    rel="${f#/usr}"
    mkdir -p "$tmp/upper$(dirname "$rel")"
    mknod "$tmp/upper$rel" c 0 0
  fi
done <"$ST_OFFLINE_FILES"
mount -t overlay overlay -o "lowerdir=/usr,upperdir=$tmp/upper,workdir=$tmp/work" /usr ||
  fail_sim "cannot mount an overlay on /usr"
mount --bind "$ST_OFFLINE_STATUS" /var/lib/dpkg/status || fail_sim "cannot bind the dpkg status"
for a in apt-get apt aptitude; do
  printf '#!/bin/sh\necho "%s: no package registry on this (simulated offline GPU) machine" >&2\nexit 100\n' \
    "$a" >"/usr/bin/$a"
  chmod +x "/usr/bin/$a"
done
# .gpu_deps/ as the device call would carry it (a --drop run uses a reduced copy).
if [[ "$ST_OFFLINE_DEPS" != .gpu_deps ]]; then
  mount --bind "$ST_OFFLINE_DEPS" .gpu_deps || fail_sim "cannot bind the reduced .gpu_deps"
fi

# The simulation checks itself: nothing of a hidden package may still serve.
[[ ! -e /usr/include/yaml-cpp/yaml.h ]] || fail_sim "/usr/include/yaml-cpp/yaml.h still visible"
[[ ! -e /usr/include/x86_64-linux-gnu/openssl/opensslconf.h ]] || fail_sim "opensslconf.h still visible"
[[ ! -e /usr/include/gtest/gtest.h ]] || fail_sim "gtest.h still visible"
[[ -z "$ST_OFFLINE_PROBE_PKG" ]] || ! dpkg -s "$ST_OFFLINE_PROBE_PKG" >/dev/null 2>&1 ||
  fail_sim "dpkg still lists $ST_OFFLINE_PROBE_PKG"
! getent hosts deb.debian.org >/dev/null 2>&1 || fail_sim "the network is reachable"
! apt-get install -y libyaml-cpp-dev >/dev/null 2>&1 || fail_sim "apt-get can install"
command -v cmake >/dev/null && command -v g++ >/dev/null || fail_sim "toolchain hidden"
echo "[offline_build_check] simulated offline GPU image ready: no network, $(wc -l <"$ST_OFFLINE_FILES") package files hidden, .gpu_deps: $(ls .gpu_deps/*.deb | wc -l) .debs"
echo "[offline_build_check] \$ $*"
"$@"
INNER
rc=${PIPESTATUS[0]}
set -e
rm -f "$list" "$status"
((${#drop[@]})) && rm -rf "$deps_dir"
((rc == 3)) && exit 3
if [[ -n "$expect_failure" ]]; then
  matched=0
  grep -Eq -- "$expect_failure" "$output" && matched=1
  rm -f "$output"
  if ((rc == 0)); then
    say "FAILED: the command succeeded although ${drop[*]:-nothing} was dropped"
    exit 1
  elif ((!matched)); then
    say "FAILED: the command failed (status $rc), but its output never says /$expect_failure/: it failed for another reason"
    exit 1
  fi
  say "ok: the command failed (status $rc) as it must without ${drop[*]:-the dropped package}, saying /$expect_failure/"
  exit 0
fi
rm -f "$output"
if ((rc == 0)); then say "ok: the command succeeded offline"; else say "FAILED (status $rc)"; fi
exit "$rc"
}
