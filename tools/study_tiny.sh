#!/usr/bin/env bash
# The Golden et al. weight-divergence study at small scale (README "Side-by-side runs"):
# the tiny config in BF16 with baseline and with flash attention (the pair under study),
# plus the reference pairs: the same run again (noise floor), another seed, and FP32.
# Then `compare` and `report`. Usage: bash tools/study_tiny.sh [OUT_DIR]  (default
# runs/study); every run keeps a checkpoint every 50 steps for the W1 curves.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/study}
mkdir -p "$out"
train() {  # NAME [--set ...]
  local name=$1; shift
  build/bin/train --config configs/tiny_shakespeare.yaml --set run.out_dir="$out/$name" --set run.name="$name" \
    --set train.ckpt_every=50 --set train.keep_checkpoints=0 --set train.log_every=100 "$@"
}
train baseline_bf16 --set precision.compute=bf16
train flash_bf16 --set precision.compute=bf16 --set attention.backend=flash \
  --set hooks.reference_run="$out/baseline_bf16"
train baseline_bf16_again --set precision.compute=bf16
train baseline_bf16_seed2 --set precision.compute=bf16 --set run.seed=2
train baseline_fp32 --set precision.compute=fp32
build/bin/compare "$out/baseline_bf16" "$out/flash_bf16" "$out/baseline_bf16_again" \
  "$out/baseline_bf16_seed2" "$out/baseline_fp32" -o "$out/compare.csv"
build/bin/report "$out/baseline_bf16" "$out/flash_bf16" "$out/baseline_bf16_seed2" \
  "$out/baseline_fp32" -o "$out/report.html"
echo "study: $out/compare.csv, $out/report.html"
