#!/usr/bin/env bash
# Installs the build dependencies (Debian packages, when missing) and builds into build/.
# Idempotent: a second run only rebuilds what changed.
#   STABLETRAIN_CUDA=ON|OFF|AUTO (default AUTO: the CUDA backend is built when nvcc exists)
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t pkgs < <(cat tools/debian-packages.txt tools/debian-packages-test.txt | grep -v '^#' |
  tr ' ' '\n' | grep .)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTABLETRAIN_CUDA="${STABLETRAIN_CUDA:-AUTO}" >build.cmake.log \
  || { cat build.cmake.log; exit 1; }
cmake --build build -j "$(nproc)"
