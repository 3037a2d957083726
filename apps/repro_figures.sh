#!/usr/bin/env bash
# The figures of docs/reproduction.md: screenshots of a study's report.html in views set by
# its address (README "report": ?only=SECTIONS&SELECT=VALUE), by headless Chromium.
#   bash apps/repro_figures.sh runs/repro_tiny docs/reproduction
# writes OUT/loss.png (runs table, loss, delta loss), OUT/spectral_wq.png, OUT/spectral_wk.png,
# OUT/ties.png (tied_row_frac), OUT/drift.png (delta_drift_cum) and OUT/distance.png.
set -euo pipefail
study=${1:?usage: repro_figures.sh STUDY_DIR OUT_DIR}
out=${2:?usage: repro_figures.sh STUDY_DIR OUT_DIR}
html=$(cd "$study" && pwd)/report.html
[ -f "$html" ] || { echo "repro_figures: error: $html: no report (run the study first)" >&2; exit 1; }
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -n "$chromium" ] || { echo "repro_figures: error: chromium not found (apt-get install chromium)" >&2; exit 1; }
mkdir -p "$out"
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
shot() {  # name height query
  "$chromium" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --user-data-dir="$profile" --virtual-time-budget=5000 --window-size=1400,"$2" \
    --screenshot="$out/$1.png" "file://$html$3" >/dev/null 2>&1
  echo "repro_figures: $out/$1.png"
}
shot loss 2100 "?only=loss"
shot spectral_wq 2000 "?only=spectral&spectral=wq"
shot spectral_wk 2000 "?only=spectral&spectral=wk"
shot ties 2000 "?only=attention&attn=tied_row_frac"
shot drift 2000 "?only=drift&drift=delta_drift_cum"
shot distance 2000 "?only=distance&dist_metric=w1n"
