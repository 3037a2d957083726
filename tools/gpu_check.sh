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
#      (step 2 is tools/gpu_check_build.sh; test, bench, train tools/gpu_check_default_stages.sh)
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
# (a long build) cannot change what runs; the files it sources are read at its start too.
{
set -Eeuo pipefail  # -E: the ERR trap below fires in the stage functions too

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
# shellcheck source=tools/gpu_check_build.sh
source tools/gpu_check_build.sh
# shellcheck source=tools/gpu_check_default_stages.sh
source tools/gpu_check_default_stages.sh
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
get_programs

# ---- 3. gpu tests -------------------------------------------------------------------------
TESTS="not run"
TESTS_OK=1
if has_stage test; then run_test_stage; fi

# ---- 4. benchmarks ------------------------------------------------------------------------
BENCH="not run"
BENCH_OK=1
TORCH="not run"
if has_stage bench && ((PROGRAMS_OK)); then
  run_bench_stage
elif has_stage bench; then
  BENCH="not run (no programs)"
  BENCH_OK=0
fi

# ---- 5. training runs: gpt2_small on Tiny Shakespeare, each attention backend -------------
TRAIN="not run"
TRAIN_OK=1
if has_stage train && ((PROGRAMS_OK)); then
  run_train_stage
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
