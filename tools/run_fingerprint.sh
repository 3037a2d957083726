#!/usr/bin/env bash
# SHA-256 of everything a run directory records that must not change when the code is
# restructured: checkpoints, the hooks' CSVs, events.jsonl, config.yaml and metrics.jsonl
# without its wall-clock fields ("elapsed", "tokens_per_s": the only values that differ
# between two runs of the same config). train.log (timestamps) and train.lock are skipped.
# Two runs of one config on one build print identical lines; a refactor that changes no
# arithmetic prints identical lines before and after (docs/ARCHITECTURE.md).
#   usage: tools/run_fingerprint.sh RUN_DIR
set -euo pipefail
dir=${1:?usage: tools/run_fingerprint.sh RUN_DIR}
[ -f "$dir/metrics.jsonl" ] || { echo "run_fingerprint: $dir/metrics.jsonl not found (not a run directory?)" >&2; exit 1; }
cd "$dir"
for f in $(ls | LC_ALL=C sort); do
  case "$f" in
    train.log|train.lock) continue ;;
    metrics.jsonl)
      h=$(sed -E 's/,"(elapsed|tokens_per_s)":[^,}]*//g' "$f" | sha256sum | cut -d' ' -f1)
      echo "$h  $f (without elapsed, tokens_per_s)" ;;
    *) [ -f "$f" ] && sha256sum "$f" ;;
  esac
done
