# The stages of tools/gpu_check.sh for issue 44, sourced by it (its helpers: begin_stage,
# left, within, logged, say, out_of_time_note; its variables OUT, BIN, WORK, LOG):
#   bias   apps/bias_kernels.py --device cuda: Qiu & Yao's tied-maximum inputs through
#          PyTorch SDPA's flash, efficient, cuDNN and math backends and our baseline, flash,
#          stabilized flash and cudnn, mean signed error against FP64 with its standard error
#          -> $OUT/bias_kernels.md, $OUT/bias_kernels.csv
#   study  configs/studies/gpt2_small_one_call.yaml (GPT-2 124M, the amplified tie bias,
#          baseline / flash / stabilized flash trained at once) on the carried corpus
#          (data_cache/corpus: apps/corpus_linux.sh), seed GPU_CHECK_STUDY_SEED (default 1),
#          stopped by SIGTERM at the stage's deadline (every run checkpoints and stops) ->
#          $OUT/study_seed-N.tar.gz: each run's metrics.jsonl, events.jsonl, train.log,
#          config.yaml and hook CSVs (not the checkpoints), and the resolved study.yaml.
#          Here: tar -xzf it under runs/ and `build/bin/report runs/gpt2_small_one_call_seed-N/*
#          --no-checkpoints -o report.html` (docs/reproduction.md, "At 124M on one GPU").
# Caps: GPU_CHECK_BIAS_S (default 240 s), GPU_CHECK_STUDY_S (default 480 s), within the call's
# budget like every stage.

BIAS="not run"
BIAS_OK=1
STUDY="not run"
STUDY_OK=1

run_bias_stage() {
  begin_stage "${GPU_CHECK_BIAS_S:-240}"
  BIAS_OK=0
  if ! python3 -c 'import numpy' >/dev/null 2>&1; then
    BIAS="not run: python3 cannot import numpy"
    return
  fi
  local dir="$WORK/bias_kernels" rc=0
  say "bias: apps/bias_kernels.py --device cuda (at most $(left) s)"
  logged - within "${GPU_CHECK_BIAS_S:-240}" python3 apps/bias_kernels.py --device cuda \
    --attn-deviation "$BIN/attn_deviation" --rows "${GPU_CHECK_BIAS_ROWS:-4096}" --ties 2,3,5 \
    --seed 1 --time-limit $(($(left) - 30)) --out "$dir" || rc=$?
  cp "$dir/bias_kernels.md" "$dir/bias_kernels.csv" "$OUT/" 2>/dev/null || true
  if ((rc == 0)) && [[ -f "$OUT/bias_kernels.md" ]]; then
    BIAS_OK=1
    BIAS="ok ($OUT/bias_kernels.md)"
  else
    BIAS="FAILED (exit status $rc$(out_of_time_note "$rc"); gpu_check.log)"
  fi
}

run_study_stage() {
  begin_stage "${GPU_CHECK_STUDY_S:-480}"
  STUDY_OK=0
  local seed="${GPU_CHECK_STUDY_SEED:-1}" xz="${GPU_CHECK_CORPUS:-data_cache/corpus/linux.txt.xz}"
  local data=data_cache/corpus_linux tok=data_cache/corpus/gpt2-tokenizer
  local name="gpt2_small_one_call_seed-$seed" rc=0
  [[ -d "$tok" ]] || tok=../shared/data/gpt2-tokenizer
  if ! compgen -G "$data/linux_train_*.bin" >/dev/null; then
    if [[ ! -f "$xz" ]]; then
      STUDY="no corpus: run apps/corpus_linux.sh here and carry data_cache/corpus (README, Training on a GPU)"
      return
    fi
    say "study: unpacking and tokenizing $xz"
    # xz may be missing from the GPU image: Python's lzma then (the same bytes).
    logged - within 120 bash -c "xz -dc -T0 '$xz' >'$WORK/linux.txt' || python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], \"wb\"))' '$xz' '$WORK/linux.txt'" || rc=$?
    ((rc == 0)) && { logged - within 240 "$BIN/prepare_data" --input "$WORK/linux.txt" --output "$data" \
      --name linux --tokenizer-dir "$tok" --val-fraction 0.005 --doc-separator '\n\n\n' \
      --overwrite || rc=$?; }
    rm -f "$WORK/linux.txt"
    if ((rc != 0)); then
      STUDY="FAILED: the corpus could not be unpacked or tokenized (exit status $rc; gpu_check.log)"
      return
    fi
  fi
  # The study file with this call's seed (its set: holds run.seed: 1).
  sed -E "s/^  run\.seed: [0-9]+$/  run.seed: $seed/" configs/studies/gpt2_small_one_call.yaml \
    >"$WORK/study.yaml"
  grep -q "^  run.seed: $seed\$" "$WORK/study.yaml" || { STUDY="FAILED: no run.seed line in the study file"; return; }
  rm -rf "runs/$name"
  # The deadline's SIGTERM goes to study, which passes it to every train: each finishes its
  # step, writes its checkpoint (about 1.5 GB) and stops; 30 s later timeout would kill.
  local slice=$(($(left) - 45))
  if ((slice < ${GPU_CHECK_STUDY_MIN_S:-60})); then
    STUDY="not started: out of time (${slice} s left for the runs)"
    return
  fi
  say "study: $name, 3 runs at once, stopped after ${slice} s at most"
  rc=0
  logged - timeout -k 30 "$slice" "$BIN/study" "$WORK/study.yaml" --out "runs/$name" \
    --train-bin "$BIN/train" || rc=$?
  # 124: the deadline came (study and each train stopped with a checkpoint: resumable).
  (cd runs && find "$name" -maxdepth 2 -type f \( -name '*.jsonl' -o -name '*.csv' -o -name 'train.log' \
    -o -name '*.yaml' \) -print0 | tar --null -T - -czf "$OUT/study_seed-$seed.tar.gz") || true
  local steps="" r last
  for r in baseline flash stabilized_flash; do
    last="$(grep -o '"step":[0-9]*' "runs/$name/$r/metrics.jsonl" 2>/dev/null | tail -1 | cut -d: -f2 || true)"
    steps+="$r ${last:-none}; "
  done
  if [[ -f "$OUT/study_seed-$seed.tar.gz" ]] && ((rc == 0 || rc == 124 || rc == 143)); then
    STUDY_OK=1
    STUDY="ok: seed $seed, last logged step: ${steps}(study exit status $rc$(out_of_time_note "$rc")); $OUT/study_seed-$seed.tar.gz"
  else
    STUDY="FAILED (study exit status $rc; last logged step: ${steps}gpu_check.log)"
  fi
}
