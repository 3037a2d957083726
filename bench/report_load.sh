#!/usr/bin/env bash
# How fast the report of three GPT-2 124M runs opens (issue 23: under 5 s in Chromium, the
# HTML under 5 MB). Trains, unless OUT already holds them, three short configs/gpt2_small.yaml
# CPU runs on the Tiny Shakespeare GPT-2 shards (the default run prepares them) that differ
# only in attention.backend (baseline, flash, stabilized_flash; BF16, B=4, T=64, 8 steps, a
# checkpoint every 4 steps, hooks every 4: spectral norms, attention statistics, δ drift and
# grad norms at steps 0, 4, 8), writes their report (weights of each run against baseline at
# steps 4 and 8), then opens it 5 times in headless Chromium and prints the HTML size, the
# page's own time from navigation start to drawn (data-ready-ms), and Chromium's wall time
# for the page against its wall time for an empty page.
#   [BIN=build/bin] bash bench/report_load.sh [OUT]   (default runs/report_load; about 9 GB of checkpoints)
set -euo pipefail
bin=${BIN:-build/bin}  # where train and report are
cd "$(dirname "$0")/.."
out=${1:-runs/report_load}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for be in baseline flash stabilized_flash; do
  d="$out/$be"
  if [ -f "$d/ckpt_00000008.bin" ]; then continue; fi
  "$bin/train" --config configs/gpt2_small.yaml --overwrite --set device=cpu --set run.out_dir="$d" \
    --set run.name="$be" --set attention.backend="$be" --set precision.compute=bf16 \
    --set data.train_path='data_cache/tiny_shakespeare/gpt2_train_*.bin' \
    --set data.val_path='data_cache/tiny_shakespeare/gpt2_val_*.bin' \
    --set train.batch_size=4 --set train.seq_len=64 --set train.grad_accum_steps=1 --set train.max_steps=8 \
    --set train.ckpt_every=4 --set train.keep_checkpoints=0 --set train.eval_every=4 --set train.eval_batches=2 \
    --set train.log_every=1 --set train.sample_tokens=0 --set hooks.every=4 >"$out/$be.train.log" 2>&1 \
    || { echo "report_load: training $be failed; see $out/$be.train.log" >&2; exit 1; }
done
t0=$(date +%s.%N)
"$bin/report" "$out/baseline" "$out/flash" "$out/stabilized_flash" -o "$out/report.html" 2>/dev/null
t1=$(date +%s.%N)
printf 'report: %s, %.0f kB, written in %.1f s\n' "$out/report.html" "$(($(stat -c %s "$out/report.html") / 1024))" \
  "$(awk -v s="$t0" -v e="$t1" 'BEGIN { print e - s }')"
printf '<!DOCTYPE html><html><body data-rendered="1"></body></html>\n' >"$out/empty.html"
chrome() {  # PAGE -> prints wall seconds, writes the DOM to $out/dom.html
  local s e
  s=$(date +%s.%N)
  timeout 120 chromium --headless=new --no-sandbox --disable-gpu --no-first-run --disable-extensions \
    --user-data-dir="$out/chromium_profile" --window-size=1400,2400 --dump-dom "file://$1" >"$out/dom.html" 2>/dev/null
  e=$(date +%s.%N)
  awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f\n", e - s }'
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
chrome "$out/empty.html" >/dev/null  # warm the disk cache and the profile
for i in 1 2 3 4 5; do
  empty=$(chrome "$out/empty.html")
  page=$(chrome "$out/report.html")
  ready=$(grep -o 'data-ready-ms="[0-9]*"' "$out/dom.html" | grep -o '[0-9]*')
  errs=$(grep -o 'data-errors="[0-9]*"' "$out/dom.html" | grep -o '[0-9]*')
  panels=$(grep -o 'data-panels="[0-9]*"' "$out/dom.html" | grep -o '[0-9]*')
  printf 'run %d: page drawn %s ms after navigation start (%s panels, %s script errors); chromium wall %.2f s for the report vs %.2f s for an empty page\n' \
    "$i" "$ready" "$panels" "$errs" "$page" "$empty"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
