#!/usr/bin/env bash
# Run HERE (a machine that reaches Debian's registry) before tools/gpu_check.sh on the
# offline GPU machine: downloads the packages of tools/debian-packages-gpu.txt into
# .gpu_deps/ (git-ignored, about 15 MB). Carry ".gpu_deps" in the device call: gpu_check.sh
# unpacks them into a private prefix (never into /) when the machine lacks them. Only the
# fallback build needs them: a prebuilt bundle (tools/gpu_bundle.sh) carries its libraries.
#   GPU_DEPS_DIR   where to put them (default .gpu_deps)
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t pkgs < <(grep -v '^#' tools/debian-packages-gpu.txt | tr ' ' '\n' | grep .)
dest="${GPU_DEPS_DIR:-.gpu_deps}"
mkdir -p "$dest"
cd "$dest"
rm -f ./*.deb
# apt-get download needs the package lists; a machine where setup.sh found everything
# installed may never have fetched them.
if ! apt-get download "${pkgs[@]}" >/dev/null 2>&1; then
  apt-get update -qq
  apt-get download "${pkgs[@]}" >/dev/null
fi
n=$(ls ./*.deb | wc -l)
[[ "$n" -eq "${#pkgs[@]}" ]] || { echo "gpu_deps: expected ${#pkgs[@]} packages, got $n" >&2; exit 1; }
echo "gpu_deps: $n packages, $(du -sh . | cut -f1) in $(pwd)"
