#!/usr/bin/env bash
# The one script to run on a GPU machine (from the repo root; $OUT = output folder, default
# ./gpu_out). It records the machine, builds the CUDA backend, and runs the stages named in
# GPU_CHECK_STAGES (comma-separated; default all: build,test,bench,train). A device call is
# limited to 10 minutes, so a session usually runs it in two or three calls, e.g.
#   GPU_CHECK_STAGES=build,test   then   GPU_CHECK_STAGES=bench,train
# (the build is incremental: every stage first builds what it needs).
#   build  configure + build the GPU tests, bench_gpu, bench, train, prepare_data, compare
#   test   ctest -L gpu: conversions, GEMMs, the CUDA-vs-CPU parity table of every Backend
#          method, baseline attention (test_gpu_attention), flash and stabilized flash
#          (test_gpu_flash), the whole model and the trainer (test_gpu_model)
#   bench  bench_gpu (GEMMs, conversions), bench_gpu kernels (every Backend method),
#          bench train (GPT-2 124M tokens/s, MFU, breakdown, memory; baseline, flash,
#          stabilized), bench attention (TFLOP/s, memory vs T, delta modes) and the PyTorch
#          side-by-sides (cuBLAS GEMMs, scaled_dot_product_attention FLASH) when torch has CUDA
#   train  configs/gpt2_small.yaml on Tiny Shakespeare (carried data_cache/tiny_shakespeare:
#          run with carry ["data_cache/tiny_shakespeare", ".gpu_deps"]), GPU_CHECK_TRAIN_STEPS
#          (default 300) steps with each attention backend, losses side by side
# Files in $OUT (at most 8 come back from a device call):
#   gpu_check.log    everything, in order (nvidia-smi output included)
#   ctest_gpu.txt    test output (verbose)          bench_gpu.txt  bench_gpu + kernels output
#   bench_train.txt  bench train outputs            bench_attention.txt  bench attention output
#   torch.txt        torch comparisons              train.txt      the training runs' summary
#   gpu_results.md   summary to commit to bench/results/ (device, driver, commit, date)
# A short summary table is printed last.
# Exit status: 0 all passed; 1 the GPU targets did not build or the gpu tests failed; 2 the
# tests passed (or were not run) but a benchmark or training run failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu_check.log"
BUILD="${GPU_CHECK_BUILD_DIR:-build-gpu}"
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
STAGES=",${GPU_CHECK_STAGES:-build,test,bench,train},"
has_stage() { [[ "$STAGES" == *",$1,"* ]]; }
say "stages: ${STAGES//,/ }"
BUILD_OK=0
GPU_TARGETS=(bench_gpu bench train prepare_data compare)
if [[ "$BUILD_TESTING" == ON ]]; then
  GPU_TARGETS+=(test_gpu_kernels test_gpu_attention test_gpu_flash test_gpu_model)
fi
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
TESTS_OK=1
if has_stage test; then
  TESTS_OK=0
  if ((BUILD_OK)) && [[ "$BUILD_TESTING" == ON ]]; then
    say "ctest -L gpu"
    if logged "$OUT/ctest_gpu.txt" ctest --test-dir "$BUILD" -L gpu --output-on-failure -V \
      --timeout 900; then
      TESTS_OK=1
    fi
    TESTS="$(grep -E 'tests passed' "$OUT/ctest_gpu.txt" | tail -1 || true)"
    [[ -n "$TESTS" ]] || TESTS="no test summary (see ctest_gpu.txt)"
    if grep -q 'No tests were found' "$OUT/ctest_gpu.txt"; then
      TESTS_OK=0
      TESTS="no gpu tests found"
    fi
    say "tests: $TESTS"
  else
    TESTS="not run (build failed or GoogleTest missing)"
  fi
fi

# ---- 5. benchmarks ------------------------------------------------------------------------
BENCH="not run"
BENCH_OK=1
TORCH="not run"
if has_stage bench && ((BUILD_OK)); then
  BENCH_OK=0
  failed=()
  bench_step() {  # bench_step FILE LABEL CMD...: CMD's output appended to FILE and the log
    local file="$1" label="$2"
    shift 2
    say "$label"
    printf '## %s\n$ %s\n' "$label" "$*" >>"$file"
    echo "\$ $*" >>"$LOG"
    if ! "$@" 2>&1 | tee -a "$file" >>"$LOG"; then failed+=("$label"); fi
    echo >>"$file"
  }
  : >"$OUT/bench_gpu.txt"
  : >"$OUT/bench_train.txt"
  : >"$OUT/bench_attention.txt"
  bench_step "$OUT/bench_gpu.txt" "bench_gpu" "$BUILD/bin/bench_gpu"
  bench_step "$OUT/bench_gpu.txt" "bench_gpu kernels" "$BUILD/bin/bench_gpu" kernels
  for attn in baseline flash stabilized_flash; do
    bench_step "$OUT/bench_train.txt" "bench train --attention $attn" \
      "$BUILD/bin/bench" train --device cuda --attention "$attn"
  done
  bench_step "$OUT/bench_train.txt" "bench train --attention baseline --recompute gelu_layernorm" \
    "$BUILD/bin/bench" train --device cuda --attention baseline --recompute gelu_layernorm --breakdown-steps 0
  bench_step "$OUT/bench_attention.txt" "bench attention" "$BUILD/bin/bench" attention
  if ((${#failed[@]})); then BENCH="FAILED: ${failed[*]}"; else BENCH_OK=1; BENCH="ok"; fi
  TORCH="torch with CUDA not available"
  if command -v python3 >/dev/null 2>&1 &&
    python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    : >"$OUT/torch.txt"
    tfail=()
    bench_step "$OUT/torch.txt" "torch GEMMs" python3 tools/bench_torch_gemm.py --ours "$OUT/bench_gpu.txt"
    bench_step "$OUT/torch.txt" "torch attention" python3 tools/bench_torch_attention.py --ours "$OUT/bench_attention.txt"
    TORCH="ok"
    for f in "${failed[@]}"; do [[ "$f" == torch* ]] && TORCH="FAILED (see torch.txt)"; done
  else
    echo "$TORCH" >"$OUT/torch.txt"
  fi
fi

# ---- 6. training runs: gpt2_small on Tiny Shakespeare, each attention backend -----------------
TRAIN="not run"
TRAIN_OK=1
if has_stage train && ((BUILD_OK)); then
  TRAIN_OK=0
  STEPS="${GPU_CHECK_TRAIN_STEPS:-300}"
  DATA=data_cache/tiny_shakespeare
  : >"$OUT/train.txt"
  if ! compgen -G "$DATA/gpt2_train_*.bin" >/dev/null && [[ -f ../shared/data/tinyshakespeare.txt ]]; then
    logged - "$BUILD/bin/prepare_data" --input ../shared/data/tinyshakespeare.txt --output "$DATA" \
      --name gpt2 --tokenizer-dir ../shared/data/gpt2-tokenizer --val-fraction 0.1 || true
  fi
  if compgen -G "$DATA/gpt2_train_*.bin" >/dev/null; then
    tfailed=()
    for attn in baseline flash stabilized_flash; do
      run_dir="runs/gpu_check_$attn"
      rm -rf "$run_dir"
      say "train gpt2_small $attn, $STEPS steps"
      # 124M, B=16, T=1024, one micro-batch per step (16K tokens). Hooks off: they run on
      # the host (power iteration on 124M weights, an FP64 attention recompute at T = 1024)
      # and would take most of a device call; test_gpu_model runs them on the GPU.
      if logged - "$BUILD/bin/train" --config configs/gpt2_small.yaml \
        --set run.out_dir="$run_dir" --set run.name="gpu_check_$attn" \
        --set data.train_path="$DATA/gpt2_train_*.bin" --set data.val_path="$DATA/gpt2_val_*.bin" \
        --set train.max_steps="$STEPS" --set train.grad_accum_steps=1 --set train.warmup_steps=50 \
        --set train.lr=6.0e-4 --set train.min_lr=6.0e-5 --set train.ckpt_every=0 \
        --set train.eval_every=100 --set train.eval_batches=4 --set train.log_every=25 \
        --set attention.backend="$attn" --set hooks.every=0 --set device=cuda; then
        :
      else
        tfailed+=("$attn")
      fi
    done
    python3 - "$STEPS" >>"$OUT/train.txt" 2>&1 <<'PY' || tfailed+=("summary")
import json, sys
steps = int(sys.argv[1])
runs = {}
for attn in ("baseline", "flash", "stabilized_flash"):
    rows = {}
    try:
        for line in open(f"runs/gpu_check_{attn}/metrics.jsonl"):
            j = json.loads(line)
            if "loss" in j:
                rows[j["step"]] = j
    except OSError:
        pass
    runs[attn] = rows
print(f"gpt2_small (124M) on Tiny Shakespeare, B=16 T=1024, {steps} steps, bf16; train loss by step")
print("| step | baseline | flash | stabilized_flash | flash - baseline | stabilized - baseline |")
print("|---|---|---|---|---|---|")
marks = sorted(s for s in set([1, 10, 25, 50] + list(range(100, steps + 1, 50)) + [steps]) if s <= steps)
for s in marks:
    v = [runs[a].get(s, {}).get("loss") for a in ("baseline", "flash", "stabilized_flash")]
    f = lambda x: "-" if x is None else f"{x:.4f}"
    d = lambda x, y: "-" if x is None or y is None else f"{x - y:+.4f}"
    print(f"| {s} | {f(v[0])} | {f(v[1])} | {f(v[2])} | {d(v[1], v[0])} | {d(v[2], v[0])} |")
for a, rows in runs.items():
    tps = [r.get("tokens_per_s") for r in rows.values() if r.get("tokens_per_s")]
    if tps:
        tps = sorted(tps)[len(tps) // 2]
        print(f"{a}: median tokens/s {tps:.0f}")
PY
    if ((${#tfailed[@]})); then TRAIN="FAILED: ${tfailed[*]}"; else TRAIN_OK=1; TRAIN="ok ($STEPS steps x 3 backends)"; fi
  else
    TRAIN="no data: carry data_cache/tiny_shakespeare (or have ../shared/data)"
  fi
fi

# ---- 7. results file ------------------------------------------------------------------------
table_of() { grep -E '^\|' "$1" 2>/dev/null || echo "(none)"; }
{
  echo "# GPU check: $GPU, $DATE"
  echo
  echo "- device: $GPU, driver $DRIVER"
  echo "- commit: $COMMIT ($DIRTY uncommitted paths)"
  echo "- date: $DATE, host $(hostname); stages: ${STAGES//,/ }"
  echo "- build of the GPU targets: $([[ $BUILD_OK == 1 ]] && echo ok || echo FAILED)"
  echo
  echo '~~~'
  nvidia-smi 2>/dev/null | head -15 || echo "nvidia-smi not available"
  echo '~~~'
  if has_stage test; then
    echo
    echo "## Tests (ctest -L gpu): $TESTS"
    if [[ -f "$OUT/ctest_gpu.txt" ]]; then
      echo
      grep -E '^[[:space:]]*[0-9]+ - .*\((Failed|Not Run|Timeout|SEGFAULT|Exception)' "$OUT/ctest_gpu.txt" |
        sed -E 's/^[[:space:]]*/- FAILED: /' || true
      first="$(grep -m1 -A2 ': Failure$' "$OUT/ctest_gpu.txt" | sed -E 's/^[0-9]+: //' || true)"
      if [[ -n "$first" ]]; then printf '\nFirst failure:\n~~~\n%s\n~~~\n' "$first"; fi
      errs="$(grep -E '^[0-9]+: (fp32 -> |int |random |stochastic rounding |arena: )' "$OUT/ctest_gpu.txt" | sed -E 's/^[0-9]+: //' || true)"
      if [[ -n "$errs" ]]; then printf '\nConversion mismatches, GEMM errors, stochastic rounding, arena:\n~~~\n%s\n~~~\n' "$errs"; fi
      par="$(grep -E '^[0-9]+: (parity|determinism|trainer gpu) ' "$OUT/ctest_gpu.txt" | sed -E 's/^[0-9]+: //' | sort -u || true)"
      if [[ -n "$par" ]]; then
        printf '\n### Parity with the CPU backend, determinism, trainer\n\n~~~\n%s\n~~~\n' "$par"
      fi
    fi
  fi
  if has_stage bench; then
    echo
    echo "## Benchmarks: $BENCH"
    for f in bench_gpu bench_train bench_attention; do
      [[ -f "$OUT/$f.txt" ]] || continue
      echo
      echo "### $f"
      echo
      grep -E '^(## |device:|ceilings|GPT-2|micro-batch|FLOPs|arena:|\|)' "$OUT/$f.txt" || echo "(no output)"
    done
    echo
    echo "## PyTorch side by side: $TORCH"
    echo
    grep -E '^(## |\||note)' "$OUT/torch.txt" 2>/dev/null || echo "(none)"
  fi
  if has_stage train; then
    echo
    echo "## Training runs: $TRAIN"
    echo
    cat "$OUT/train.txt" 2>/dev/null || true
  fi
} >"$OUT/gpu_results.md"
cat "$OUT/gpu_results.md" >>"$LOG"

# ---- 8. summary, last -----------------------------------------------------------------------
STATUS=0
if ((!BUILD_OK || !TESTS_OK)); then
  STATUS=1
elif ((!BENCH_OK || !TRAIN_OK)); then
  STATUS=2
fi
{
  for f in bench_train bench_attention; do
    if [[ -f "$OUT/$f.txt" ]]; then
      echo
      echo "== $f =="
      grep -E '^(## |\| (tokens/s|MFU|peak device)|\| [0-9]+ \|)' "$OUT/$f.txt" | head -40 || true
    fi
  done
  [[ -f "$OUT/train.txt" ]] && { echo; echo "== train =="; cat "$OUT/train.txt"; }
  echo
  echo "== gpu_check summary =="
  printf '| %-9s | %s\n' "device" "$GPU (driver $DRIVER)"
  printf '| %-9s | %s\n' "commit" "$COMMIT"
  printf '| %-9s | %s\n' "stages" "${STAGES//,/ }"
  printf '| %-9s | %s\n' "build" "$([[ $BUILD_OK == 1 ]] && echo ok || echo FAILED)"
  printf '| %-9s | %s\n' "gpu tests" "$TESTS"
  printf '| %-9s | %s\n' "benchmarks" "$BENCH"
  printf '| %-9s | %s\n' "torch" "$TORCH"
  printf '| %-9s | %s\n' "training" "$TRAIN"
  printf '| %-9s | %s\n' "results" "$OUT/gpu_results.md (copy to bench/results/$(date -u +%Y-%m-%d)_gpu_check.md)"
  printf '| %-9s | %s\n' "status" "$STATUS"
} | tee -a "$LOG"
exit "$STATUS"
