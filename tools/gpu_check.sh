#!/usr/bin/env bash
# The one script to run on a GPU machine (from the repo root; $OUT = output folder,
# default ./gpu_out). It records the machine, builds the CUDA backend, runs the gpu-labelled
# tests (conversions, GEMMs, the CUDA-vs-CPU parity table of every Backend method,
# run-to-run determinism, stochastic rounding, the memory arena), bench_gpu (GEMMs and
# conversions) and `bench_gpu kernels` (every Backend method in GB/s or TFLOP/s against the
# copy bandwidth and cuBLAS BF16 rate measured in the same run), plus a PyTorch
# side-by-side when torch with CUDA is installed, and writes into $OUT (7 files):
#   gpu_check.log    everything, in order (nvidia-smi output included)
#   ctest_gpu.txt    test output (verbose)       ctest_gpu.xml    JUnit results
#   bench_gpu.txt    bench_gpu output            bench_kernels.txt  bench_gpu kernels output
#   torch.txt        torch comparison
#   gpu_results.md   summary to commit to bench/results/ (device, driver, commit, date)
# A short summary table is printed last.
# Exit status: 0 all passed; 1 the GPU targets did not build or the gpu tests failed / did
# not run; 2 the tests passed but a benchmark or the full project build failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu_check.log"
BUILD=build-gpu
JOBS="$(nproc 2>/dev/null || echo 8)"
: >"$LOG"

say() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
# logged FILE CMD...: run CMD, its output into FILE (if not -) and the log; CMD's status.
logged() {
  local file="$1"
  shift
  echo "\$ $*" >>"$LOG"
  if [[ "$file" == - ]]; then
    "$@" >>"$LOG" 2>&1
  else
    "$@" 2>&1 | tee "$file" >>"$LOG"
  fi
}

# ---- 1. the machine and the code --------------------------------------------------------
DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
COMMIT="unknown (no git history)"
DIRTY="?"
if git rev-parse HEAD >/dev/null 2>&1; then
  COMMIT="$(git rev-parse HEAD)"
  DIRTY="$(git status --porcelain | wc -l | tr -d ' ')"
fi
say "date $DATE, commit $COMMIT ($DIRTY uncommitted paths), host $(hostname)"
GPU="unknown"
DRIVER="unknown"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi >>"$LOG" 2>&1 || true
  GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo unknown)"
  DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || echo unknown)"
else
  echo "nvidia-smi not found" >>"$LOG"
fi
say "GPU: $GPU, driver $DRIVER"

# ---- 2. build dependencies (best effort: the machine may be offline) --------------------
mapfile -t pkgs < <(grep -v '^#' tools/debian-packages.txt | tr ' ' '\n' | grep .)
missing=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  say "installing missing build dependencies: ${missing[*]}"
  SUDO=()
  if [[ "$(id -u)" != 0 ]] && command -v sudo >/dev/null 2>&1; then SUDO=(sudo -n); fi
  if command -v apt-get >/dev/null 2>&1 &&
    logged - ${SUDO[@]+"${SUDO[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update &&
    logged - ${SUDO[@]+"${SUDO[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; then
    say "installed: ${missing[*]}"
  else
    say "WARNING: could not install ${missing[*]} (no apt-get, no root, or offline); continuing"
  fi
fi
# Offline machine: Debian packages carried in .gpu_deps/ (tools/gpu_deps.sh) are unpacked
# into a private prefix and handed to CMake and the loader. Unverified until a GPU session.
CMAKE_DEP_ARGS=()
if [[ -d .gpu_deps ]] && compgen -G ".gpu_deps/*.deb" >/dev/null && ! dpkg -s libyaml-cpp-dev >/dev/null 2>&1; then
  DEPS=/tmp/stabletrain_deps
  mkdir -p "$DEPS"
  for deb in .gpu_deps/*.deb; do
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$deb" "$DEPS" 2>>"$LOG" || say "WARNING: could not unpack $deb"
    else  # a non-Debian image: a .deb is an ar archive holding data.tar.xz
      (ar p "$deb" data.tar.xz | tar -xJ -C "$DEPS") 2>>"$LOG" || say "WARNING: could not unpack $deb"
    fi
  done
  ARCHLIB="$DEPS/usr/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$ARCHLIB:$ARCHLIB/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
  CMAKE_DEP_ARGS=(-DCMAKE_PREFIX_PATH="$DEPS/usr" -DST_OPENBLAS_DIR="$ARCHLIB/openblas-openmp"
    -DCBLAS_INCLUDE_DIR="$DEPS/usr/include/x86_64-linux-gnu/openblas-openmp")
  say "using carried Debian packages unpacked in $DEPS"
fi
command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]] ||
  say "WARNING: nvcc not found in PATH or /usr/local/cuda/bin: the CUDA build will fail"
BUILD_TESTING=ON
if ! dpkg -s libgtest-dev >/dev/null 2>&1 && [[ ! -f /usr/include/gtest/gtest.h ]]; then
  say "WARNING: GoogleTest is not installed: building without tests (bench only)"
  BUILD_TESTING=OFF
fi

# ---- 3. configure and build -------------------------------------------------------------
# The GPU targets first, so unrelated breakage elsewhere cannot stop the GPU check; the
# rest of the project is built last (step 6) and reported separately.
BUILD_OK=0
GPU_TARGETS=(bench_gpu)
if [[ "$BUILD_TESTING" == ON ]]; then GPU_TARGETS+=(test_gpu_kernels); fi
say "configure + build ${GPU_TARGETS[*]} ($BUILD, -j$JOBS)"
if logged - cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSTABLETRAIN_CUDA=ON ${CMAKE_DEP_ARGS[@]+"${CMAKE_DEP_ARGS[@]}"} \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_TESTING="$BUILD_TESTING" &&
  logged - cmake --build "$BUILD" -j "$JOBS" --target "${GPU_TARGETS[@]}"; then
  BUILD_OK=1
  say "build ok"
else
  say "BUILD FAILED (see $LOG)"
fi

# ---- 4. gpu tests -------------------------------------------------------------------------
TESTS="not run"
TESTS_OK=0
if ((BUILD_OK)) && [[ "$BUILD_TESTING" == ON ]]; then
  say "ctest -L gpu"
  if logged "$OUT/ctest_gpu.txt" ctest --test-dir "$BUILD" -L gpu --output-on-failure -V \
    --output-junit "$OUT/ctest_gpu.xml"; then
    TESTS_OK=1
  fi
  TESTS="$(grep -E 'tests passed' "$OUT/ctest_gpu.txt" | tail -1 || true)"
  [[ -n "$TESTS" ]] || TESTS="no test summary (see ctest_gpu.txt)"
  if grep -q 'No tests were found' "$OUT/ctest_gpu.txt"; then
    TESTS_OK=0
    TESTS="no gpu tests found"
  fi
  say "tests: $TESTS"
fi

# ---- 5. benchmarks ------------------------------------------------------------------------
BENCH="not run"
BENCH_OK=0
KBENCH="not run"
KBENCH_OK=0
if ((BUILD_OK)); then
  say "bench_gpu"
  if logged "$OUT/bench_gpu.txt" "$BUILD/bin/bench_gpu"; then
    BENCH_OK=1
    BENCH="ok"
  else
    BENCH="FAILED (see bench_gpu.txt)"
  fi
  say "bench_gpu kernels"
  if logged "$OUT/bench_kernels.txt" "$BUILD/bin/bench_gpu" kernels; then
    KBENCH_OK=1
    KBENCH="ok"
  else
    KBENCH="FAILED (see bench_kernels.txt)"
  fi
fi
TORCH="torch with CUDA not available"
if command -v python3 >/dev/null 2>&1 &&
  python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  say "torch side-by-side"
  ours=()
  ((BENCH_OK)) && ours=(--ours "$OUT/bench_gpu.txt")
  if logged "$OUT/torch.txt" python3 tools/bench_torch_gemm.py ${ours[@]+"${ours[@]}"}; then
    TORCH="ok"
  else
    TORCH="FAILED (see torch.txt)"
  fi
else
  echo "$TORCH" >"$OUT/torch.txt"
fi

# ---- 6. the rest of the project, with CUDA on ------------------------------------------------
# GPU_CHECK_FULL_BUILD=0 skips it (a device call is limited to 10 minutes).
FULL="not run"
if [[ "${GPU_CHECK_FULL_BUILD:-1}" == 0 ]]; then
  FULL="skipped (GPU_CHECK_FULL_BUILD=0)"
  say "full build: $FULL"
elif ((BUILD_OK)); then
  say "full build"
  if logged - cmake --build "$BUILD" -j "$JOBS"; then FULL="ok"; else FULL="FAILED (see gpu_check.log)"; fi
  say "full build: $FULL"
fi

# ---- 7. results file ------------------------------------------------------------------------
table_of() { grep -E '^\|' "$1" 2>/dev/null || echo "(none)"; }
{
  echo "# GPU check: $GPU, $DATE"
  echo
  echo "- device: $GPU, driver $DRIVER"
  echo "- $(grep -m1 '^device:' "$OUT/bench_gpu.txt" 2>/dev/null || echo 'bench_gpu: no device line')"
  echo "- commit: $COMMIT ($DIRTY uncommitted paths)"
  echo "- date: $DATE, host $(hostname)"
  echo "- build of the GPU targets: $([[ $BUILD_OK == 1 ]] && echo ok || echo FAILED); full build: $FULL"
  echo
  echo "## Tests (ctest -L gpu)"
  echo
  echo "$TESTS"
  if [[ -f "$OUT/ctest_gpu.txt" ]]; then
    echo
    grep -E '^[[:space:]]*[0-9]+ - .*\((Failed|Not Run|Timeout|SEGFAULT|Exception)' "$OUT/ctest_gpu.txt" |
      sed -E 's/^[[:space:]]*/- FAILED: /' || true
    first="$(grep -m1 -A2 ': Failure$' "$OUT/ctest_gpu.txt" | sed -E 's/^[0-9]+: //' || true)"
    if [[ -n "$first" ]]; then printf '\nFirst failure:\n~~~\n%s\n~~~\n' "$first"; fi
    errs="$(grep -E '^[0-9]+: (fp32 -> |int |random |stochastic rounding |arena: )' "$OUT/ctest_gpu.txt" | sed -E 's/^[0-9]+: //' || true)"
    if [[ -n "$errs" ]]; then printf '\nConversion mismatches, GEMM errors, stochastic rounding, arena:\n~~~\n%s\n~~~\n' "$errs"; fi
    par="$(grep -E '^[0-9]+: parity ' "$OUT/ctest_gpu.txt" | sed -E 's/^[0-9]+: //' || true)"
    if [[ -n "$par" ]]; then
      printf '\n### Parity: CUDA vs the CPU backend, every Backend method (max abs / max rel / norm-wise rel error)\n\n~~~\n%s\n~~~\n' "$par"
    fi
    det="$(grep -cE '^[0-9]+: determinism .* bit-identical' "$OUT/ctest_gpu.txt" || true)"
    printf '\nDeterminism: %s bf16 cases printed bit-identical over two runs (all precisions are checked; failures are listed above).\n' "${det:-0}"
  fi
  echo
  echo "## bench_gpu ($BENCH)"
  echo
  head -2 "$OUT/bench_gpu.txt" 2>/dev/null || true
  echo
  table_of "$OUT/bench_gpu.txt"
  echo
  echo "## bench_gpu kernels ($KBENCH)"
  echo
  grep -E '^ceilings' "$OUT/bench_kernels.txt" 2>/dev/null || true
  echo
  table_of "$OUT/bench_kernels.txt"
  echo
  grep -E '^arena:' "$OUT/bench_kernels.txt" 2>/dev/null || true
  echo
  echo "## PyTorch side by side ($TORCH)"
  echo
  table_of "$OUT/torch.txt"
} >"$OUT/gpu_results.md"
cat "$OUT/gpu_results.md" >>"$LOG"

# ---- 8. summary, last -----------------------------------------------------------------------
STATUS=0
if ((!BUILD_OK || !TESTS_OK)); then
  STATUS=1
elif ((!BENCH_OK)) || ((!KBENCH_OK)) || [[ "$FULL" != ok && "$FULL" != skipped* ]]; then
  STATUS=2
fi
{
  if [[ -f "$OUT/bench_kernels.txt" ]]; then
    echo
    echo "== bench_gpu kernels =="
    grep -E '^ceilings' "$OUT/bench_kernels.txt" || true
    table_of "$OUT/bench_kernels.txt"
  fi
  echo
  echo "== gpu_check summary =="
  printf '| %-9s | %s\n' "device" "$GPU (driver $DRIVER)"
  printf '| %-9s | %s\n' "commit" "$COMMIT"
  printf '| %-9s | %s\n' "build" "$([[ $BUILD_OK == 1 ]] && echo ok || echo FAILED) (GPU targets); full build $FULL"
  printf '| %-9s | %s\n' "gpu tests" "$TESTS"
  printf '| %-9s | %s\n' "bench_gpu" "$BENCH"
  printf '| %-9s | %s\n' "kernels" "$KBENCH"
  printf '| %-9s | %s\n' "torch" "$TORCH"
  printf '| %-9s | %s\n' "results" "$OUT/gpu_results.md (copy to bench/results/$(date -u +%Y-%m-%d)_gpu_check.md)"
  printf '| %-9s | %s\n' "status" "$STATUS"
} | tee -a "$LOG"
exit "$STATUS"
