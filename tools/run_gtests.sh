#!/usr/bin/env bash
# Runs GoogleTest programs one test case per process, each under a timeout — what ctest does
# with gtest_discover_tests — without ctest's files, which hold the build machine's absolute
# paths and so cannot serve a prebuilt bundle (tools/gpu_bundle.sh).
#
# Usage: run_gtests.sh [--timeout S] [--deadline EPOCH_S] [--filter PATTERN] BIN...
#   --timeout   seconds per test case (default 120); a case still running is killed
#   --deadline  wall-clock time (seconds since 1970) after which no case starts: the rest
#               are reported "Not Run (out of time)" and count as failures
#   --filter    gtest filter for every program (default '*')
# Prints each case's output prefixed "N: " (as ctest -V), a line per case
#   "N/M Test #N: Suite.Case ....   Passed  1.23 sec"  (or Failed, Timeout, Skipped, Not Run)
# and last "P% tests passed, F tests failed out of M". A case passes only when it exits 0
# and gtest reports exactly one test passed (a filter that matched nothing fails; so does a
# skipped test: the gpu label fails, never skips). Exit status 0 when all passed, else 8.
set -uo pipefail

timeout_s=120
deadline=""
filter='*'
bins=()
while (($#)); do
  case "$1" in
    --timeout) timeout_s="$2"; shift 2 ;;
    --deadline) deadline="$2"; shift 2 ;;
    --filter) filter="$2"; shift 2 ;;
    -*) echo "run_gtests: unknown option $1" >&2; exit 2 ;;
    *) bins+=("$1"); shift ;;
  esac
done
((${#bins[@]})) || { echo "run_gtests: no test programs given" >&2; exit 2; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Every case as "BIN<TAB>Suite.Case"; a program that cannot list its tests is one failed case.
cases=()
list_failed=()
for bin in "${bins[@]}"; do
  if ! timeout -k 5 60 "$bin" --gtest_list_tests --gtest_filter="$filter" >"$tmp/list" 2>&1; then
    list_failed+=("$bin")
    echo "0: $(basename "$bin") --gtest_list_tests failed:"
    sed 's/^/0: /' "$tmp/list"
    continue
  fi
  while IFS= read -r name; do cases+=("$bin"$'\t'"$name"); done < <(awk '
    /^[^ ]/ { suite = ($1 ~ /\.$/) ? $1 : ""; next }  # "Suite." ("# TypeParam ..." may follow)
    /^  [^ ]/ && suite != "" { print suite $1 }     # "  Case" ("# GetParam() ..." may follow)
  ' "$tmp/list")
done

total=$((${#cases[@]} + ${#list_failed[@]}))
passed=0
failed_names=()
width=${#total}
n=0
for c in "${cases[@]}"; do
  n=$((n + 1))
  bin="${c%%$'\t'*}"
  name="${c#*$'\t'}"
  label="$(basename "$bin"):$name"
  status="Passed"
  t0="$(date +%s.%N)"
  if [[ -n "$deadline" ]] && (($(date +%s) >= deadline)); then
    status="Not Run (out of time)"
    : >"$tmp/out"
  else
    timeout -k 5 "$timeout_s" "$bin" --gtest_filter="$name" --gtest_color=no >"$tmp/out" 2>&1
    rc=$?
    if ((rc == 124 || rc == 137)); then
      status="Timeout (${timeout_s} s)"
    elif grep -q '^\[  SKIPPED \]' "$tmp/out"; then
      status="Skipped"
    elif ((rc != 0)); then
      status="Failed (status $rc)"
    elif ! grep -q '^\[  PASSED  \] 1 test\.' "$tmp/out"; then
      status="Failed (the filter ran no single test)"
    fi
  fi
  secs="$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')"
  sed "s/^/$n: /" "$tmp/out"
  printf '%*d/%d Test #%d: %s %s %s %s sec\n' "$width" "$n" "$total" "$n" "$label" \
    "$(printf '%*s' $((60 - ${#label} > 3 ? 60 - ${#label} : 3)) '' | tr ' ' '.')" "$status" "$secs"
  if [[ "$status" == Passed ]]; then
    passed=$((passed + 1))
  else
    failed_names+=("$label ($status)")
  fi
done
for bin in "${list_failed[@]}"; do failed_names+=("$(basename "$bin") (cannot list its tests)"); done

failed=$((total - passed))
pct=0
((total > 0)) && pct=$((100 * passed / total))
echo
if ((failed)); then
  echo "The following tests FAILED:"
  for f in "${failed_names[@]}"; do echo "	$f"; done
fi
echo "$pct% tests passed, $failed tests failed out of $total"
((total > 0 && failed == 0)) || exit 8
