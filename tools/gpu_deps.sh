#!/usr/bin/env bash
# Run HERE (a machine with Debian's registry) before tools/gpu_check.sh on the offline GPU
# machine: downloads the Debian packages the build needs into .gpu_deps/ (git-ignored).
# Then, with the device tool: run "bash tools/gpu_check.sh" with carry [".gpu_deps"];
# gpu_check.sh unpacks them into a private prefix (never into /) when they are missing there.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libgtest-dev libgmock-dev libopenblas-openmp-dev libopenblas0-openmp libgfortran5
      libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
      nlohmann-json3-dev libcli11-dev libssl-dev libssl3)
mkdir -p .gpu_deps
cd .gpu_deps
rm -f ./*.deb
apt-get download "${pkgs[@]}"
du -sh .
