#!/usr/bin/env bash
# Tied maxima 2..5 (issue 21, finding 1): flash, stabilized flash with the beta shift, with
# tie_shift exact_sum, and with l kept in FP32 (lsum fp32), BF16 O~ (the paper's
# implementation), V ~ N(0.7, 0.3), d 32, 512 keys, tiles of 64, ties inside one tile.
# Every row's maximum drawn from U(4, 6) (--top-spread 2), so P~ of the tied entries differs
# between rows. Writes bench/results/attn_bias_ties/ties<K>_<variant>.csv (+ .json) and
# prints one markdown table. Usage: bash bench/plans/bias_ties.sh [BIN] (about 20 s).
set -euo pipefail
bin=${1:-build/bin/attn_deviation}
out=bench/results/attn_bias_ties
mkdir -p "$out"
common=(bias --v normal:0.7:0.3 --kinds tied_tile --accums bf16_accum --betas 2,7 --no-deltas
        --no-baseline --rows 8192 --top-spread 2 --threads 2 --seed 1)
echo "| ties | variant | backend | mean signed error of O ± SE (z) |"
echo "|---|---|---|---|"
for t in 2 3 4 5; do
  for variant in beta exact_sum lsum_fp32; do
    extra=()
    case $variant in
      exact_sum) extra=(--tie-shift exact_sum) ;;
      lsum_fp32) extra=(--lsum fp32) ;;
    esac
    "$bin" "${common[@]}" --ties "$t" "${extra[@]}" --csv "$out/ties${t}_${variant}.csv" >/dev/null 2>&1
    awk -F, -v t="$t" -v v="$variant" 'NR > 1 && $4 == "o" && $3 != "fp64_rounded" &&
        !(v != "beta" && $3 == "flash") {
      printf "| %s | %s | %s | %+.3e ± %.1e (%.1f) |\n", t, v, $3, $9, $10, $11 }' \
      "$out/ties${t}_${variant}.csv"
  done
done
