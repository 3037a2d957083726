#!/usr/bin/env bash
# The one script to run on a GPU machine, from the repository root. README ("Training on a
# GPU") gives the exact device calls and what to carry. It
#   1. probes the machine (GPU, driver, OS, glibc, compilers, CMake, Ninja, where cuBLASLt and
#      NCCL are: the toolkit or PyTorch's nvidia wheels) into probe.txt;
#   2. gets the programs: from the prebuilt bundle .gpu_bundle/stabletrain-gpu.tar.xz
#      (tools/gpu_bundle.sh) when it was built from the sources of this tree, else by
#      building here (CMake, Ninja when present) with the Debian packages carried in
#      .gpu_deps/ (tools/gpu_deps.sh) unpacked into a private prefix; then checks that every
#      program loads (CUDA libraries resolved from the toolkit or the wheels);
#   3. runs the stages named in GPU_CHECK_STAGES (comma-separated, default test,bench,train):
#        build  nothing more (step 2 only; the CI check tools/offline_build_check.sh uses it)
#        test   every gpu test program, one case per process, 120 s each (tools/run_gtests.sh)
#        bench  bench_gpu, bench attention and PyTorch's SDPA beside it, bench train (GPT-2
#               124M tokens/s, MFU) per attention backend, bench_gpu kernels with the cost
#               model's predictions beside them (tools/cost_model_vs_measured.py), PyTorch GEMMs
#        train  configs/gpt2_small.yaml on Tiny Shakespeare (carried data_cache/tiny_shakespeare)
#               with each attention backend, losses side by side
#        bias   which production kernels carry Qiu & Yao's tie bias (apps/bias_kernels.py)
#        study  the one-call 124M study of the amplified failure on the carried corpus
#               (configs/studies/gpt2_small_one_call.yaml); both in tools/gpu_check_study.sh
# A device call runs 10 minutes at most and a session's GPU time is about 15 minutes, starts
# included, so the defaults fit all three stages into one call: every step runs under a
# deadline (its stage's cap, and GPU_CHECK_BUDGET_S from the start less a reserve), the
# results are written even when time runs out, and the whole script runs under `timeout` as
# a last resort.
#
# Environment:
#   OUT                      output folder (default ./gpu_out)
#   GPU_CHECK_STAGES         default test,bench,train
#   GPU_CHECK_BUDGET_S       seconds for this call (default 570; a device call allows 600)
#   GPU_CHECK_TEST_S, GPU_CHECK_BENCH_S, GPU_CHECK_TRAIN_S
#                            caps on each stage (default 240, 300, 240 s), within the budget
#   GPU_CHECK_BUNDLE         auto (default) | require | off
#   GPU_CHECK_BUILD_DIR      build folder (default build-gpu)
#   GPU_CHECK_CUDA_ARCH      CMAKE_CUDA_ARCHITECTURES of a build (default 90)
#   GPU_CHECK_TEST_TIMEOUT_S seconds per test case (default 120)
#   GPU_CHECK_TEST_FILTER    gtest filter (default *)
#   GPU_CHECK_BENCH_FILTER   extended regex: only the benchmark steps whose label matches
#                            (labels as in bench.txt's "## " lines; default all)
#   GPU_CHECK_TRAIN_STEPS    steps per attention backend (default 100)
#   GPU_CHECK_BIAS_S, GPU_CHECK_STUDY_S, GPU_CHECK_STUDY_SEED, GPU_CHECK_CORPUS
#                            the bias and study stages (tools/gpu_check_study.sh)
#   GPU_CHECK_DEPS_PREFIX    where carried packages are unpacked (default /tmp/stabletrain_deps)
# Files in $OUT (each call writes its stages' files; a device call brings back 8 at most):
#   gpu_check.log  everything, in order      probe.txt      the machine
#   build.log      configure + build (when building)
#   tests_gpu.txt  test output               bench.txt      every benchmark's output
#   train.txt      training runs' summary    gpu_results.md summary for bench/results/
#   bias_kernels.md, bias_kernels.csv         study_seed-N.tar.gz (the bias and study stages)
# Exit status: 0 all ran and passed; 1 the programs could not be had (build, bundle, missing
# library) or a gpu test failed; 2 the tests passed or were not run, but a benchmark or a
# training run failed or ran out of time.
# One { } block: bash reads it whole before running it, so editing this file while it runs
# (a long build) cannot change what runs.
{
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
BUDGET="${GPU_CHECK_BUDGET_S:-570}"
if [[ -z "${ST_GPU_CHECK_GUARD:-}" ]] && command -v timeout >/dev/null 2>&1; then
  export ST_GPU_CHECK_GUARD=1  # the last resort: the deadlines below should end it first
  exec timeout -k 10 $((BUDGET + 15)) bash "$0" "$@"
fi
T0="$(date +%s)"
RESERVE=25  # seconds kept for the results file
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu_check.log"
BUILD="${GPU_CHECK_BUILD_DIR:-build-gpu}"
STAGES=",${GPU_CHECK_STAGES:-test,bench,train},"
JOBS="$(nproc 2>/dev/null || echo 8)"
WORK="$(mktemp -d /tmp/stabletrain_gpu_check.XXXXXX)"
: >"$LOG"

say() { echo "[gpu_check $(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*" | tee -a "$LOG" >&2; }
trap 'say "ERROR at line $LINENO: $BASH_COMMAND (a bug in this script: the results file is not written)"' ERR
has_stage() { [[ "$STAGES" == *",$1,"* ]]; }
# Each stage ends by its own cap (GPU_CHECK_TEST_S, _BENCH_S, _TRAIN_S) or the call's end,
# whichever comes first; left() counts down to it.
END=$((T0 + BUDGET - RESERVE))
STAGE_END="$END"
begin_stage() {  # begin_stage CAP_S
  STAGE_END=$(($(date +%s) + $1))
  ((STAGE_END > END)) && STAGE_END="$END"
  return 0
}
left() { echo $((STAGE_END - $(date +%s))); }
# within CAP CMD...: CMD under a timeout of CAP seconds or the time left, whichever is less;
# status 124 when it ran out of time (or was not started: under 10 s left).
within() {
  local cap="$1" l
  shift
  l="$(left)"
  ((l < cap)) && cap="$l"
  if ((cap < 10)); then
    echo "not started: out of time (this stage's cap or GPU_CHECK_BUDGET_S=$BUDGET)"
    return 124
  fi
  timeout -k 10 "$cap" "$@"
}
out_of_time_note() { if [[ "$1" == 124 ]]; then echo " (out of time)"; fi; }
# logged FILE CMD...: CMD's output into FILE (if not -) and the log; CMD's status.
logged() {
  local file="$1"
  shift
  echo "\$ $*" >>"$LOG"
  if [[ "$file" == - ]]; then
    "$@" >>"$LOG" 2>&1
  else
    "$@" 2>&1 | tee -a "$file" >>"$LOG"
  fi
}
# shellcheck source=tools/gpu_lib.sh
source tools/gpu_lib.sh
# shellcheck source=tools/gpu_check_study.sh
source tools/gpu_check_study.sh

# ---- 1. the machine and the code --------------------------------------------------------
DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
COMMIT="unknown (no git history)"
DIRTY="?"
if git rev-parse HEAD >/dev/null 2>&1; then
  COMMIT="$(git rev-parse HEAD)"
  DIRTY="$(git status --porcelain | wc -l | tr -d ' ')"
fi
SRC_HASH="$(source_hash)"
GPU="none"
DRIVER="none"
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU="$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
  DRIVER="$(timeout 30 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
  GPU="${GPU:-none (nvidia-smi found no GPU)}"
  DRIVER="${DRIVER:-none}"
fi
ver() { command -v "$1" >/dev/null 2>&1 && { timeout 20 "$@" 2>&1 | grep -m1 -E '[0-9]+\.[0-9]+' || true; } || echo "not found"; }
{
  echo "date:       $DATE"
  echo "commit:     $COMMIT ($DIRTY uncommitted paths), sources $SRC_HASH"
  echo "host:       $(hostname), $(nproc 2>/dev/null) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo 2>/dev/null)"
  echo "os:         $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), kernel $(uname -r), glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')"
  echo "gpu:        $(command -v nvidia-smi >/dev/null && timeout 30 nvidia-smi -L 2>&1 | tr '\n' ' ' || echo 'nvidia-smi not found')"
  echo "driver:     $DRIVER"
  echo "nvcc:       $(command -v nvcc >/dev/null && ver nvcc --version | sed 's/^.*release/release/' || ver /usr/local/cuda/bin/nvcc --version)"
  echo "g++:        $(ver g++ --version)"
  echo "cmake:      $(ver cmake --version)"
  echo "ninja:      $(ver ninja --version)"
  echo "make:       $(ver make --version)"
  echo "python3:    $(ver python3 --version), torch $(timeout 60 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>/dev/null || echo 'not importable')"
  echo "dpkg:       $(command -v dpkg-deb >/dev/null && echo yes || echo no), ar: $(command -v ar >/dev/null && echo yes || echo no), apt-get: $(command -v apt-get >/dev/null && echo yes || echo no)"
  for lib in libcublasLt.so.13 libcublas.so.13 libnccl.so.2 libcudnn.so.9 libcuda.so.1; do
    printf '%-19s %s\n' "$lib:" "$(d="$(find_lib "$lib")"; echo "${d:-not found}")"
  done
  # cuDNN's runtime version (attention.backend cudnn calls it; the bundle was built against
  # the headers of tools/gpu_bundle.sh's machine).
  echo "cudnn:      $(timeout 30 python3 -c 'import ctypes; v = ctypes.CDLL("libcudnn.so.9").cudnnGetVersion(); print(f"{v // 10000}.{v // 100 % 100}.{v % 100}")' 2>/dev/null || echo 'libcudnn.so.9 not loadable')"
  echo "carried:    .gpu_bundle: $(ls .gpu_bundle 2>/dev/null | tr '\n' ' ' || true)| .gpu_deps: $(ls .gpu_deps/*.deb 2>/dev/null | wc -l) .debs | data_cache/tiny_shakespeare: $(ls data_cache/tiny_shakespeare 2>/dev/null | wc -l) files"
} >"$OUT/probe.txt" 2>&1
cat "$OUT/probe.txt" >>"$LOG"
timeout 30 nvidia-smi >>"$LOG" 2>&1 || true
say "GPU: $GPU, driver $DRIVER; commit $COMMIT; stages:${STAGES//,/ }; budget ${BUDGET} s"

# ---- 2. the programs: a bundle that matches these sources, or a build ---------------------
BIN=""
PROGRAMS_FROM=""
BUNDLE_MODE="${GPU_CHECK_BUNDLE:-auto}"
BUNDLE_FILE=.gpu_bundle/stabletrain-gpu.tar.xz
if [[ "$BUNDLE_MODE" != off && -f "$BUNDLE_FILE" ]]; then
  say "unpacking $BUNDLE_FILE"
  if unpack_txz "$BUNDLE_FILE" "$WORK" 2>>"$LOG" && [[ -f "$WORK/stabletrain-gpu/MANIFEST" ]]; then
    manifest="$WORK/stabletrain-gpu/MANIFEST"
    cat "$manifest" >>"$LOG"
    b_hash="$(awk '$1 == "sources:" { print $2 }' "$manifest")"
    b_glibc="$(awk '$1 == "glibc_required:" { print $2 }' "$manifest")"
    have_glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')"
    if [[ "$b_hash" != "$SRC_HASH" ]]; then
      say "the bundle was built from other sources (bundle $b_hash, this tree $SRC_HASH): not used"
    elif [[ -n "$b_glibc" && -n "$have_glibc" ]] && ! version_ge "$have_glibc" "$b_glibc"; then
      say "the bundle needs glibc $b_glibc, this machine has $have_glibc: not used"
    else
      BIN="$WORK/stabletrain-gpu/bin"
      PROGRAMS_FROM="bundle ($(awk '$1 == "commit:" { print $2 }' "$manifest"), sources $b_hash)"
    fi
  else
    say "cannot unpack $BUNDLE_FILE (see the log)"
  fi
fi
if [[ -z "$BIN" && "$BUNDLE_MODE" == require ]]; then
  say "GPU_CHECK_BUNDLE=require and no usable bundle: build one here with tools/gpu_bundle.sh and carry .gpu_bundle"
elif [[ -z "$BIN" ]]; then
  # The build's dependencies: installed packages, else the carried .debs, else apt-get (an
  # offline machine may hang on it, so it comes last and under a short timeout).
  mapfile -t devpkgs < <(grep -v '^#' tools/debian-packages-gpu.txt | tr ' ' '\n' | grep -- '-dev$')
  missing=()
  for p in "${devpkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})) && ! compgen -G ".gpu_deps/*.deb" >/dev/null &&
    command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    say "no .gpu_deps carried: trying apt-get for ${missing[*]}"
    if logged - within 60 env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      logged - within 300 env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
      missing=()
    else
      say "apt-get could not install them (offline?)"
    fi
  fi
  CMAKE_DEP_ARGS=()
  DEPS_OK=1
  if ((${#missing[@]})); then
    if compgen -G ".gpu_deps/*.deb" >/dev/null; then
      DEPS="${GPU_CHECK_DEPS_PREFIX:-/tmp/stabletrain_deps}"
      rm -rf "$DEPS"
      mkdir -p "$DEPS"
      for deb in .gpu_deps/*.deb; do
        if command -v dpkg-deb >/dev/null 2>&1; then
          dpkg-deb -x "$deb" "$DEPS" 2>>"$LOG" || { say "cannot unpack $deb"; DEPS_OK=0; }
        else  # a .deb is an ar archive holding data.tar.{xz,zst,gz}
          member="$(ar t "$deb" | grep '^data\.tar' || true)"
          (ar p "$deb" "$member" | tar -xa -C "$DEPS" -f - 2>/dev/null ||
            ar p "$deb" "$member" | tar -xJ -C "$DEPS") 2>>"$LOG" || { say "cannot unpack $deb"; DEPS_OK=0; }
        fi
      done
      ARCH=x86_64-linux-gnu
      ARCHLIB="$DEPS/usr/lib/$ARCH"
      # Debian keeps some headers under the multiarch folder (openssl/opensslconf.h, the
      # OpenMP OpenBLAS's cblas.h): both folders go on the include path.
      export CPATH="$DEPS/usr/include:$DEPS/usr/include/$ARCH${CPATH:+:$CPATH}"
      export LIBRARY_PATH="$ARCHLIB${LIBRARY_PATH:+:$LIBRARY_PATH}"
      export LD_LIBRARY_PATH="$ARCHLIB:$ARCHLIB/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      CMAKE_DEP_ARGS=(-DCMAKE_PREFIX_PATH="$DEPS/usr" -DOPENSSL_ROOT_DIR="$DEPS/usr"
        -DST_OPENBLAS_DIR="$ARCHLIB/openblas-openmp" -DCBLAS_INCLUDE_DIR="$DEPS/usr/include/$ARCH/openblas-openmp")
      still=()
      for p in "${missing[@]}"; do compgen -G ".gpu_deps/${p}_*.deb" >/dev/null || still+=("$p"); done
      if ((${#still[@]})); then
        say "MISSING: .gpu_deps lacks ${still[*]} (tools/debian-packages-gpu.txt lists them; rerun tools/gpu_deps.sh)"
        DEPS_OK=0
      fi
      say "using the carried Debian packages, unpacked in $DEPS"
    else
      say "MISSING build dependencies ${missing[*]}: carry .gpu_deps (tools/gpu_deps.sh) or a bundle (tools/gpu_bundle.sh)"
      DEPS_OK=0
    fi
  fi
  # NCCL: the toolkit's, else the one in PyTorch's nvidia-nccl wheel.
  if ! compgen -G "/usr/local/cuda/include/nccl.h" >/dev/null; then
    while IFS= read -r d; do
      if [[ -f "$d/libnccl.so.2" && -f "$d/../include/nccl.h" ]]; then
        CMAKE_DEP_ARGS+=(-DST_NCCL_LIBRARY="$d/libnccl.so.2" -DST_NCCL_INCLUDE_DIR="$(cd "$d/../include" && pwd)")
        say "NCCL from $d"
        break
      fi
    done < <(cuda_lib_dirs)
  fi
  GEN=()
  command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
  if [[ -f "$BUILD/CMakeCache.txt" ]]; then  # an existing build folder keeps its generator
    GEN=(-G "$(awk -F= '/^CMAKE_GENERATOR:/ { print $2 }' "$BUILD/CMakeCache.txt")")
  fi
  # The same configuration as a bundle (tools/gpu_bundle.sh packs this build folder):
  # no -march=native (the programs may run on another CPU), no MPI (the GPU image has no
  # launcher; NCCL ids travel by file or TCP), RPATH $ORIGIN/../lib (the bundle's lib/, set
  # as DT_RPATH so the libraries it loads find theirs too), gtest discovery at test time (a
  # build never runs a GPU program), no SIMT emulator (CPU-only tests; it needs Boost.Context).
  CONFIG=(-DCMAKE_BUILD_TYPE=Release -DSTABLETRAIN_CUDA=ON
    -DCMAKE_CUDA_ARCHITECTURES="${GPU_CHECK_CUDA_ARCH:-90}" -DSTABLETRAIN_NATIVE=OFF
    -DSTABLETRAIN_MPI=OFF -DBUILD_TESTING=ON -DSTABLETRAIN_SIMT=OFF
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN/../lib"
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST)
  if ((DEPS_OK)); then
    say "configure + build the GPU programs ($BUILD, ${GEN[*]:-default generator}, -j$JOBS)"
    : >"$OUT/build.log"
    t_build="$(date +%s)"
    if logged "$OUT/build.log" within 900 cmake -S . -B "$BUILD" ${GEN[@]+"${GEN[@]}"} "${CONFIG[@]}" \
      ${CMAKE_DEP_ARGS[@]+"${CMAKE_DEP_ARGS[@]}"} &&
      logged "$OUT/build.log" within 1800 cmake --build "$BUILD" -j "$JOBS" --target gpu_programs; then
      BIN="$BUILD/bin"
      PROGRAMS_FROM="build here ($BUILD, $(($(date +%s) - t_build)) s)"
      # What a later script (tools/gpu_bundle.sh) needs to find the same libraries.
      {
        for v in CPATH LIBRARY_PATH LD_LIBRARY_PATH; do
          [[ -n "${!v:-}" ]] && printf 'export %s=%q\n' "$v" "${!v}"
        done
      } >"$BUILD/stabletrain_env.sh"
    else
      say "BUILD FAILED (the end of build.log follows)"
      tail -25 "$OUT/build.log" >&2 || true
    fi
  fi
fi

# Every program must load: the CUDA libraries it misses are looked up (toolkit, wheels);
# anything else missing means the build or the bundle is incomplete.
PROGRAMS_OK=0
PROGRAMS=()
if [[ -n "$BIN" ]]; then
  list="$BIN/../gpu_programs.txt"  # written by CMake beside bin/; a bundle keeps it there
  if [[ -f "$list" ]]; then
    for p in $(cat "$list"); do PROGRAMS+=("$BIN/$p"); done
    PROGRAMS_OK=1
    for p in "${PROGRAMS[@]}"; do
      [[ -x "$p" ]] || { say "MISSING program $p"; PROGRAMS_OK=0; }
    done
    if ((PROGRAMS_OK)); then
      resolve_cuda_libs "${PROGRAMS[@]}" || PROGRAMS_OK=0
      still="$(missing_libs "${PROGRAMS[@]}" | tr '\n' ' ')"
      if [[ -n "${still// /}" ]]; then
        say "the programs cannot load: missing $still"
        PROGRAMS_OK=0
      fi
    fi
    if ((PROGRAMS_OK)); then
      for p in "${PROGRAMS[@]}"; do
        if [[ "$(basename "$p")" == test_* ]]; then
          logged - within 60 "$p" --gtest_list_tests || { say "$p does not start (see the log)"; PROGRAMS_OK=0; }
        fi
      done
      logged - within 60 "$BIN/train" --help-config || { say "train does not start"; PROGRAMS_OK=0; }
    fi
  else
    say "no gpu_programs.txt beside $BIN"
  fi
fi
if ((PROGRAMS_OK)); then
  say "programs: ${#PROGRAMS[@]} from the $PROGRAMS_FROM, all load (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
else
  say "NO PROGRAMS: the later stages cannot run"
fi

# ---- 3. gpu tests -------------------------------------------------------------------------
TESTS="not run"
TESTS_OK=1
if has_stage test; then
  begin_stage "${GPU_CHECK_TEST_S:-260}"
  TESTS_OK=0
  if ((PROGRAMS_OK)); then
    tests=()
    for p in "${PROGRAMS[@]}"; do [[ "$(basename "$p")" == test_* ]] && tests+=("$p"); done
    say "gpu tests: ${#tests[@]} programs, one case per process, ${GPU_CHECK_TEST_TIMEOUT_S:-120} s each"
    : >"$OUT/tests_gpu.txt"
    if logged "$OUT/tests_gpu.txt" tools/run_gtests.sh --timeout "${GPU_CHECK_TEST_TIMEOUT_S:-120}" \
      --deadline "$STAGE_END" --filter "${GPU_CHECK_TEST_FILTER:-*}" "${tests[@]}"; then
      TESTS_OK=1
    fi
    TESTS="$(grep -E 'tests passed, ' "$OUT/tests_gpu.txt" | tail -1 || true)"
    [[ -n "$TESTS" ]] || TESTS="no test summary (see tests_gpu.txt)"
    say "tests: $TESTS"
  else
    TESTS="not run (no programs)"
  fi
fi

# ---- 4. benchmarks ------------------------------------------------------------------------
BENCH="not run"
BENCH_OK=1
TORCH="not run"
if has_stage bench && ((PROGRAMS_OK)); then
  begin_stage "${GPU_CHECK_BENCH_S:-300}"
  failed=()
  bench_step() {  # bench_step FILE CAP_S LABEL CMD...: CMD's output appended to FILE and the log
    local file="$1" cap="$2" label="$3" rc=0
    shift 3
    if [[ -n "${GPU_CHECK_BENCH_FILTER:-}" ]] && ! grep -qE -- "$GPU_CHECK_BENCH_FILTER" <<<"$label"; then
      return 0
    fi
    say "$label"
    printf '## %s\n$ %s\n' "$label" "$*" >>"$file"
    echo "\$ $*" >>"$LOG"
    within "$cap" "$@" 2>&1 | tee -a "$file" >>"$LOG" || rc=$?
    ((rc == 0)) || failed+=("$label$(out_of_time_note "$rc")")
    echo >>"$file"
  }
  B="$WORK/bench"
  mkdir -p "$B"
  : >"$B/bench_gpu.txt"
  : >"$B/bench_train.txt"
  : >"$B/bench_attention.txt"
  : >"$B/torch.txt"
  : >"$B/torch_train.txt"
  HAVE_TORCH=0
  timeout 60 python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1 && HAVE_TORCH=1
  bench_step "$B/bench_gpu.txt" 90 "bench_gpu" "$BIN/bench_gpu"
  bench_step "$B/bench_attention.txt" 150 "bench attention" "$BIN/bench" attention
  if ((HAVE_TORCH)); then
    bench_step "$B/torch.txt" 150 "torch attention" python3 apps/bench_torch_attention.py --ours "$B/bench_attention.txt"
  fi
  for attn in baseline flash stabilized_flash cudnn; do
    bench_step "$B/bench_train.txt" 120 "bench train --attention $attn" \
      "$BIN/bench" train --device cuda --attention "$attn"
  done
  # the Hopper flash kernels (attention.cuda_kernel: sm90) in the step
  bench_step "$B/bench_train.txt" 120 "bench train --attention flash --cuda-kernel sm90" \
    "$BIN/bench" train --device cuda --attention flash --cuda-kernel sm90
  bench_step "$B/bench_gpu.txt" 90 "bench_gpu kernels" "$BIN/bench_gpu" kernels
  # the cost model's predictions (made on the CPU before this run) beside the measured rows
  pred="$(ls bench/results/*_cost_model_h200.csv 2>/dev/null | sort | tail -1)"
  if [[ -n "$pred" ]]; then
    bench_step "$B/bench_gpu.txt" 30 "cost model vs measured" \
      python3 tools/cost_model_vs_measured.py "$pred" "$B/bench_gpu.txt"
  fi
  if ((HAVE_TORCH)); then
    bench_step "$B/torch.txt" 90 "torch GEMMs" python3 apps/bench_torch_gemm.py --ours "$B/bench_gpu.txt"
    TORCH="ok"
    for f in ${failed[@]+"${failed[@]}"}; do [[ "$f" == torch* ]] && TORCH="FAILED (see bench.txt)"; done
  else
    TORCH="torch with CUDA not available"
  fi
  bench_step "$B/bench_train.txt" 90 "bench train --attention baseline --recompute gelu_layernorm" \
    "$BIN/bench" train --device cuda --attention baseline --recompute gelu_layernorm --breakdown-steps 0
  if ((HAVE_TORCH)); then
    # The comparison step: PyTorch's GPT-2 124M at bench train's micro-batch, eager, then
    # under torch.compile (its compilation is inside the cap, outside the timed steps).
    tb="$(grep -m1 -oE 'micro-batch B=[0-9]+: fits' "$B/bench_train.txt" | grep -oE '[0-9]+' || echo 64)"
    for comp in 0 1; do
      bench_step "$B/torch_train.txt" 150 "torch GPT-2 step B=$tb compile=$comp" \
        python3 apps/bench_torch_train.py --device cuda --B "$tb" --T 1024 --steps 10 --warmup 3 \
        --compile "$comp" --table
    done
    for f in ${failed[@]+"${failed[@]}"}; do [[ "$f" == torch* ]] && TORCH="FAILED (see bench.txt)"; done
  fi
  if ((${#failed[@]})); then BENCH="FAILED: ${failed[*]}"; BENCH_OK=0; else BENCH="ok"; fi
  for f in bench_gpu bench_attention bench_train torch torch_train; do
    printf '# ==== %s ====\n\n' "$f" >>"$OUT/bench.txt"
    cat "$B/$f.txt" >>"$OUT/bench.txt"
  done
elif has_stage bench; then
  BENCH="not run (no programs)"
  BENCH_OK=0
fi

# ---- 5. training runs: gpt2_small on Tiny Shakespeare, each attention backend -------------
TRAIN="not run"
TRAIN_OK=1
if has_stage train && ((PROGRAMS_OK)); then
  begin_stage "${GPU_CHECK_TRAIN_S:-240}"
  TRAIN_OK=0
  STEPS="${GPU_CHECK_TRAIN_STEPS:-100}"
  DATA=data_cache/tiny_shakespeare
  : >"$OUT/train.txt"
  if ! compgen -G "$DATA/gpt2_train_*.bin" >/dev/null && [[ -f ../shared/data/tinyshakespeare.txt ]]; then
    logged - within 120 "$BIN/prepare_data" --input ../shared/data/tinyshakespeare.txt --output "$DATA" \
      --name gpt2 --tokenizer-dir ../shared/data/gpt2-tokenizer --val-fraction 0.1 || true
  fi
  if compgen -G "$DATA/gpt2_train_*.bin" >/dev/null; then
    tfailed=()
    # Four attention backends (cudnn: cuDNN's fused attention), then data parallelism at world size 1 through the path a
    # multi-node job without MPI takes (RANK / WORLD_SIZE / LOCAL_RANK from the launcher,
    # NCCL's id through a file): NCCL all-reduce, and the ZeRO-1 reduce-scatter / all-gather.
    # At world size 1 both must give the single-process flash run's bits.
    # Last, cpu_side_b1: baseline attention, micro-batch 1, 10 steps, the run whose CPU twin
    # fits a small machine (B=16 needs about 55 GB there): the CPU command and the two loss
    # columns side by side are in bench/results/2026-11-27_gpu_tiny_shakespeare_h200.md.
    runs_=(baseline flash stabilized_flash cudnn nccl_w1 nccl_w1_zero1 cpu_side_b1)
    for i in "${!runs_[@]}"; do
      name="${runs_[$i]}"
      attn="$name"
      extra=()
      envs=()
      steps="$STEPS"
      if [[ "$name" == cpu_side_b1 ]]; then
        attn=baseline
        steps=10
        extra=(--set train.batch_size=1 --set train.eval_every=0 --set train.log_every=1)
      elif [[ "$name" == nccl_w1* ]]; then
        attn=flash
        rdv="/tmp/stabletrain_nccl_id_$name"
        rm -f "$rdv"
        envs=(RANK=0 WORLD_SIZE=1 LOCAL_RANK=0)
        extra=(--set dist.backend=nccl --set dist.nccl_bootstrap=file --set dist.rendezvous="$rdv"
          --set dist.zero="$([[ "$name" == *zero1 ]] && echo 1 || echo 0)")
      fi
      run_dir="runs/gpu_check_$name"
      rm -rf "$run_dir"
      slice=$(($(left) / (${#runs_[@]} - i)))  # an equal share of the time left
      say "train gpt2_small $name, $steps steps (at most ${slice} s)"
      # 124M, B=16, T=1024, one micro-batch per step (16K tokens). Hooks off: they run on
      # the host (power iteration on 124M weights, an FP64 attention recompute at T = 1024)
      # and would take most of a device call; test_gpu_model runs them on the GPU.
      rc=0
      logged - within "$slice" env ${envs[@]+"${envs[@]}"} "$BIN/train" --config configs/gpt2_small.yaml \
        --set run.out_dir="$run_dir" --set run.name="gpu_check_$name" \
        --set data.train_path="$DATA/gpt2_train_*.bin" --set data.val_path="$DATA/gpt2_val_*.bin" \
        --set train.max_steps="$steps" --set train.grad_accum_steps=1 --set train.warmup_steps=50 \
        --set train.lr=6.0e-4 --set train.min_lr=6.0e-5 --set train.ckpt_every=0 \
        --set train.eval_every=50 --set train.eval_batches=4 --set train.log_every=10 \
        --set attention.backend="$attn" --set hooks.every=0 --set device=cuda \
        ${extra[@]+"${extra[@]}"} || rc=$?
      ((rc == 0)) || tfailed+=("$name$(out_of_time_note "$rc")")
    done
    python3 - "$STEPS" >>"$OUT/train.txt" 2>&1 <<'PY' || tfailed+=("summary")
import json, sys
steps = int(sys.argv[1])


def train_rows(name):
    """{step: metrics.jsonl train row} of runs/gpu_check_NAME ({} when it has none)."""
    rows = {}
    try:
        for line in open(f"runs/gpu_check_{name}/metrics.jsonl"):
            try:
                j = json.loads(line)
            except ValueError:
                continue  # a run stopped mid-line
            if "loss" in j:
                rows[j["step"]] = j
    except OSError:
        pass
    return rows


kinds = ("baseline", "flash", "stabilized_flash", "cudnn")
runs = {attn: train_rows(attn) for attn in kinds}
print(f"gpt2_small (124M) on Tiny Shakespeare, B=16 T=1024, {steps} steps planned, bf16; train loss by step")
print("| step | baseline | flash | stabilized_flash | cudnn | flash - baseline | stabilized - baseline "
      "| cudnn - baseline |")
print("|---|---|---|---|---|---|---|---|")
marks = sorted(set(s for r in runs.values() for s in r))
for s in marks:
    v = [runs[a].get(s, {}).get("loss") for a in kinds]
    f = lambda x: "-" if x is None else f"{x:.4f}"
    d = lambda x, y: "-" if x is None or y is None else f"{x - y:+.4f}"
    print(f"| {s} | {f(v[0])} | {f(v[1])} | {f(v[2])} | {f(v[3])} | {d(v[1], v[0])} | "
          f"{d(v[2], v[0])} | {d(v[3], v[0])} |")
# World size 1 through NCCL (all-reduce; ZeRO-1): the flash run's bits, step for step.
status = 0
for name in ("nccl_w1", "nccl_w1_zero1"):
    rows, ref = train_rows(name), runs["flash"]
    common = sorted(set(rows) & set(ref))
    same = [s for s in common if rows[s]["loss"] == ref[s]["loss"]
            and rows[s].get("grad_norm") == ref[s].get("grad_norm")]
    first_diff = next((s for s in common if s not in same), None)
    if not common or first_diff is not None:
        status = 1
    print(f"{name} (flash, dist.backend nccl, world size 1): {len(same)} of {len(common)} common "
          f"steps with the single-process flash run's loss and grad norm bit for bit"
          + ("" if first_diff is None else f"; first difference at step {first_diff}: "
             f"{rows[first_diff]['loss']!r} vs {ref[first_diff]['loss']!r}")
          + f"; reached step {max(rows) if rows else 0} of {steps}")
side = {s: r["loss"] for s, r in train_rows("cpu_side_b1").items()}
print("cpu_side_b1 (baseline, B=1 T=1024, 10 steps; exact losses for the CPU twin): "
      + ", ".join(f"{s}: {side[s]!r}" for s in sorted(side)))
for a, rows in runs.items():
    last = max(rows) if rows else 0
    tps = sorted(r["tokens_per_s"] for r in rows.values() if r.get("tokens_per_s"))
    med = f", median tokens/s {tps[len(tps) // 2]:.0f}" if tps else ""
    print(f"{a}: reached step {last} of {steps}{med}")
sys.exit(status)
PY
    if ((${#tfailed[@]})); then TRAIN="FAILED: ${tfailed[*]}"; else TRAIN_OK=1; TRAIN="ok ($STEPS steps x 4 backends, 2 NCCL world-size-1 runs)"; fi
  else
    TRAIN="no data: carry data_cache/tiny_shakespeare (README, Training on a GPU)"
  fi
elif has_stage train; then
  TRAIN="not run (no programs)"
fi

# ---- 5b. issue 44's stages: the kernels' tie bias, the one-call 124M study ---------------------
if has_stage bias; then
  if ((PROGRAMS_OK)); then run_bias_stage; else BIAS="not run (no programs)"; BIAS_OK=0; fi
fi
if has_stage study; then
  if ((PROGRAMS_OK)); then run_study_stage; else STUDY="not run (no programs)"; STUDY_OK=0; fi
fi

# ---- 6. results file ------------------------------------------------------------------------
{
  echo "# GPU check: $GPU, $DATE"
  echo
  echo "- device: $GPU, driver $DRIVER"
  echo "- commit: $COMMIT ($DIRTY uncommitted paths), sources $SRC_HASH"
  echo "- date: $DATE, host $(hostname); stages:${STAGES//,/ }; $(($(date +%s) - T0)) s of a ${BUDGET} s budget"
  echo "- programs: $([[ $PROGRAMS_OK == 1 ]] && echo "ok, from the $PROGRAMS_FROM" || echo "NONE (see gpu_check.log)")"
  echo
  echo '~~~'
  cat "$OUT/probe.txt"
  echo
  timeout 30 nvidia-smi 2>/dev/null | head -15 || echo "nvidia-smi not available"
  echo '~~~'
  if has_stage test; then
    echo
    echo "## Tests (tools/run_gtests.sh over the gpu test programs): $TESTS"
    if [[ -f "$OUT/tests_gpu.txt" ]]; then
      echo
      grep -E '^[[:space:]]*[0-9]+/[0-9]+ Test #' "$OUT/tests_gpu.txt" | grep -v ' Passed ' |
        sed -E 's/^[[:space:]]*/- NOT PASSED: /' || true
      first="$(grep -m1 -A2 ': Failure$' "$OUT/tests_gpu.txt" | sed -E 's/^[0-9]+: //' || true)"
      if [[ -n "$first" ]]; then printf '\nFirst failure:\n~~~\n%s\n~~~\n' "$first"; fi
      errs="$(grep -E '^[0-9]+: (fp32 -> |int |random |stochastic rounding |arena: )' "$OUT/tests_gpu.txt" | sed -E 's/^[0-9]+: //' || true)"
      if [[ -n "$errs" ]]; then printf '\nConversion mismatches, GEMM errors, stochastic rounding, arena:\n~~~\n%s\n~~~\n' "$errs"; fi
      par="$(grep -E '^[0-9]+: (parity|determinism|trainer gpu) ' "$OUT/tests_gpu.txt" | sed -E 's/^[0-9]+: //' | sort -u || true)"
      if [[ -n "$par" ]]; then
        printf '\n### Parity with the CPU backend, determinism, trainer\n\n~~~\n%s\n~~~\n' "$par"
      fi
    fi
  fi
  if has_stage bench; then
    echo
    echo "## Benchmarks: $BENCH"
    echo
    echo "PyTorch side by side: $TORCH"
    if [[ -f "$OUT/bench.txt" ]]; then
      echo
      grep -E '^(# ==== |## |device:|ceilings|GPT-2|micro-batch|FLOPs|arena:|note|\|)' "$OUT/bench.txt" || echo "(no output)"
    fi
  fi
  if has_stage train; then
    echo
    echo "## Training runs: $TRAIN"
    echo
    cat "$OUT/train.txt" 2>/dev/null || true
  fi
  if has_stage bias; then
    echo
    echo "## Tie bias of the production kernels: $BIAS"
    echo
    cat "$OUT/bias_kernels.md" 2>/dev/null || true
  fi
  if has_stage study; then
    echo
    echo "## The one-call 124M study: $STUDY"
  fi
} >"$OUT/gpu_results.md"
cat "$OUT/gpu_results.md" >>"$LOG"

# ---- 7. summary, last -----------------------------------------------------------------------
STATUS=0
if ((!PROGRAMS_OK || !TESTS_OK)); then
  STATUS=1
elif ((!BENCH_OK || !TRAIN_OK || !BIAS_OK || !STUDY_OK)); then
  STATUS=2
fi
{
  if [[ -f "$OUT/bench.txt" ]]; then
    echo
    echo "== benchmarks =="
    grep -E '^(## |\| (tokens/s|MFU|peak device|PyTorch)|\| [0-9]+ \|)' "$OUT/bench.txt" | head -60 || true
  fi
  [[ -f "$OUT/train.txt" ]] && { echo; echo "== train =="; cat "$OUT/train.txt"; }
  echo
  echo "== gpu_check summary =="
  printf '| %-10s | %s\n' "device" "$GPU (driver $DRIVER)"
  printf '| %-10s | %s\n' "commit" "$COMMIT, sources $SRC_HASH"
  printf '| %-10s | %s\n' "stages" "${STAGES//,/ }"
  printf '| %-10s | %s\n' "programs" "$([[ $PROGRAMS_OK == 1 ]] && echo "ok, from the $PROGRAMS_FROM" || echo FAILED)"
  printf '| %-10s | %s\n' "gpu tests" "$TESTS"
  printf '| %-10s | %s\n' "benchmarks" "$BENCH"
  printf '| %-10s | %s\n' "torch" "$TORCH"
  printf '| %-10s | %s\n' "training" "$TRAIN"
  has_stage bias && printf '| %-10s | %s\n' "bias" "$BIAS"
  has_stage study && printf '| %-10s | %s\n' "study" "$STUDY"
  printf '| %-10s | %s\n' "time" "$(($(date +%s) - T0)) s of ${BUDGET} s"
  printf '| %-10s | %s\n' "results" "$OUT/gpu_results.md (copy to bench/results/$(date -u +%Y-%m-%d)_gpu_check_<stages>.md)"
  printf '| %-10s | %s\n' "status" "$STATUS"
} | tee -a "$LOG"
rm -rf "$WORK"
exit "$STATUS"
}
