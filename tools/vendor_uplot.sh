#!/usr/bin/env bash
# The chart library of `report`'s HTML page: uPlot, pinned, from the npm registry, committed
# under third_party/uplot/ and compiled into the report binary (apps/report/embed_assets.cmake),
# so the page stays one offline file and the build needs no network.
#   bash tools/vendor_uplot.sh           download the pinned version again (npm checks the
#                                        tarball against the registry's sha512) and copy its
#                                        dist files into third_party/uplot/
#   bash tools/vendor_uplot.sh --check   the same download, compared byte for byte with the
#                                        committed files (exit 1 on any difference)
# Needs node, npm and the npm registry. To move to another version: change VERSION and
# INTEGRITY (`npm view uplot@X dist.integrity`), run without --check, rebuild, run test_report.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.6.32
INTEGRITY='sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=='
FILES=(dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE)
mode=${1:-}
[[ -z "$mode" || "$mode" == --check ]] || { echo "usage: vendor_uplot.sh [--check]" >&2; exit 2; }
command -v npm >/dev/null || { echo "vendor_uplot: npm not found (Debian: apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "uplot@$VERSION" >/dev/null)
tgz="$tmp/uplot-$VERSION.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
[ "$got" == "$INTEGRITY" ] || { echo "vendor_uplot: uplot-$VERSION.tgz has integrity $got, expected $INTEGRITY" >&2; exit 1; }
tar -xzf "$tgz" -C "$tmp"
status=0
for f in "${FILES[@]}"; do
  dst="third_party/uplot/$(basename "$f")"
  if [ "$mode" == --check ]; then
    if cmp -s "$tmp/package/$f" "$dst"; then echo "vendor_uplot: $dst = uplot@$VERSION $f"
    else echo "vendor_uplot: $dst differs from uplot@$VERSION $f" >&2; status=1; fi
  else
    cp "$tmp/package/$f" "$dst"
    echo "vendor_uplot: $dst <- uplot@$VERSION $f"
  fi
done
exit $status
