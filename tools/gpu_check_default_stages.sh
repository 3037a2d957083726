# The default stages of tools/gpu_check.sh (test, bench, train), sourced by it (its helpers:
# say, begin_stage, left, within, logged, out_of_time_note; its variables OUT, LOG, WORK, BIN,
# PROGRAMS; the results file and the summary read what these set):
#   run_test_stage   every gpu test program, one case per process (tools/run_gtests.sh)
#                    -> $OUT/tests_gpu.txt; sets TESTS, TESTS_OK
#   run_bench_stage  bench_gpu, bench attention and PyTorch's SDPA beside it, bench train per
#                    attention backend, the cost model beside bench_gpu kernels, PyTorch GEMMs
#                    and GPT-2 steps -> $OUT/bench.txt; sets BENCH, BENCH_OK, TORCH
#   run_train_stage  configs/gpt2_small.yaml on the carried Tiny Shakespeare per attention
#                    backend, two NCCL world-size-1 runs, the CPU twin's run, losses side by
#                    side -> $OUT/train.txt; sets TRAIN, TRAIN_OK
# gpu_check.sh calls each when its stage is asked for (bench and train: and the programs load).

run_test_stage() {
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
}

run_bench_stage() {
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
}

run_train_stage() {
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
}
