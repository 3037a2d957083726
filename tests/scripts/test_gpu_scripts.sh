#!/usr/bin/env bash
# ctest gpu_scripts (label cpu): the shell tools the GPU machine depends on, checked here
# where a failure costs nothing — tools/run_gtests.sh (the gpu test runner) against a fake
# GoogleTest program that passes, fails, hangs and skips, and a real one; tools/gpu_lib.sh's
# helpers. Usage: test_gpu_scripts.sh REPO_ROOT A_REAL_GTEST_PROGRAM
set -uo pipefail
ROOT="$1"
REAL="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
not() { ! "$@"; }
check() {  # check DESCRIPTION CONDITION...
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fails=$((fails + 1)); fi
}

# A fake GoogleTest program: the list format (with a parameterised case) and four outcomes.
fake="$tmp/fake_gtest"
cat >"$fake" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *--gtest_list_tests*) printf 'Fake.\n  Passes\n  Fails\n  Hangs\nParam/Fake.\n  Skips/0  # GetParam() = 0\n' ;;
  *--gtest_filter=Fake.Passes*) echo "[  PASSED  ] 1 test." ;;
  *--gtest_filter=Fake.Fails*) echo "fake.cpp:7: Failure"; echo "[  FAILED  ] 1 test"; exit 1 ;;
  *--gtest_filter=Fake.Hangs*) sleep 60; echo "[  PASSED  ] 1 test." ;;
  *--gtest_filter=Param/Fake.Skips/0*) echo "[  SKIPPED ] 1 test"; echo "[  PASSED  ] 0 tests." ;;
  *) echo "unexpected arguments: $*"; exit 3 ;;
esac
EOF
chmod +x "$fake"

passing="$tmp/passing_gtest"  # one case that passes
printf '#!/bin/sh\ncase "$*" in *--gtest_list_tests*) printf "Ok.\\n  Case\\n" ;; *) echo "[  PASSED  ] 1 test." ;; esac\n' >"$passing"
chmod +x "$passing"

out="$tmp/out1"
t0=$(date +%s)
"$ROOT/tools/run_gtests.sh" --timeout 2 "$fake" >"$out" 2>&1
rc=$?
t1=$(date +%s)
cat "$out"
check "status 8 when a case fails" test "$rc" -eq 8
check "passing case reported Passed" grep -qE '^1/4 Test #1: fake_gtest:Fake.Passes \.+ Passed ' "$out"
check "failing case reported with its status" grep -qE 'Fake.Fails \.+ Failed \(status 1\)' "$out"
check "hanging case killed at the timeout" grep -qE 'Fake.Hangs \.+ Timeout \(2 s\)' "$out"
check "the hang cost about the timeout, not 60 s" test $((t1 - t0)) -lt 20
check "a skipped case is not a pass" grep -qE 'Param/Fake.Skips/0 \.+ Skipped' "$out"
check "case output prefixed with its number" grep -qE '^2: fake.cpp:7: Failure$' "$out"
check "summary line" grep -qx '25% tests passed, 3 tests failed out of 4' "$out"

out="$tmp/out2"
"$ROOT/tools/run_gtests.sh" --deadline $(($(date +%s) - 1)) "$fake" >"$out" 2>&1
rc=$?
check "past the deadline no case starts and all count as failed" \
  test "$rc" -eq 8 -a "$(grep -cE 'Test #.* Not Run \(out of time\)' "$out")" -eq 4
out="$tmp/out3"
"$ROOT/tools/run_gtests.sh" "$passing" /bin/false >"$out" 2>&1
rc=$?
check "a program that cannot list its tests is a failure" \
  grep -qx '50% tests passed, 1 tests failed out of 2' "$out"
out="$tmp/out4"
"$ROOT/tools/run_gtests.sh" --filter 'Tensor*' "$REAL" >"$out" 2>&1
rc=$?
n="$(grep -cE '^ *[0-9]+/[0-9]+ Test #[0-9]+: .* Passed ' "$out")"
check "a real gtest program: status 0, every case passed ($n)" test "$rc" -eq 0 -a "$n" -ge 2
check "a real gtest program: summary" grep -qE '^100% tests passed, 0 tests failed out of [0-9]+$' "$out"
"$ROOT/tools/run_gtests.sh" --filter 'NoSuchTest*' "$REAL" >"$out" 2>&1
rc=$?
check "a filter that matches nothing is a failure, not a pass" test "$rc" -ne 0

# gpu_lib.sh
say() { echo "$*"; }
source "$ROOT/tools/gpu_lib.sh"
check "CUDA libraries recognised" is_cuda_lib libcublasLt.so.13
check "NCCL recognised" is_cuda_lib libnccl.so.2
check "yaml-cpp is not a CUDA library" not is_cuda_lib libyaml-cpp.so.0.7
check "version_ge 2.39 2.36" version_ge 2.39 2.36
check "not version_ge 2.35 2.36" not version_ge 2.35 2.36
check "version_ge 2.36 2.36" version_ge 2.36 2.36
h1="$(source_hash)"
h2="$(source_hash)"
check "source_hash is 16 hex digits and stable ($h1)" test "${#h1}" -eq 16 -a "$h1" == "$h2"
mkdir -p "$tmp/tree" && cp -r "$ROOT/CMakeLists.txt" "$ROOT/core" "$tmp/tree/"
h3="$(ROOT="$tmp/tree" source_hash)"
echo "// changed" >>"$tmp/tree/core/dtype.cpp"
h4="$(ROOT="$tmp/tree" source_hash)"
check "source_hash changes with a source file" test "$h3" != "$h4"
g="$(glibc_required "$REAL")"
check "glibc_required reads a version from $REAL ($g)" grep -qE '^2\.[0-9]+$' <<<"$g"

# unpack_txz without xz on the PATH (python3's tarfile), keeping the executable bit.
mkdir -p "$tmp/pack/b" "$tmp/nox" "$tmp/unpacked"
printf '#!/bin/sh\necho hi\n' >"$tmp/pack/b/prog" && chmod +x "$tmp/pack/b/prog"
tar -C "$tmp/pack" -cJf "$tmp/a.tar.xz" b
for t in tar bash; do ln -s "$(command -v "$t")" "$tmp/nox/$t"; done
ln -s /usr/bin/python3 "$tmp/nox/python3"
PATH="$tmp/nox" bash -c "source '$ROOT/tools/gpu_lib.sh'; unpack_txz '$tmp/a.tar.xz' '$tmp/unpacked'"
check "unpack_txz without xz unpacks an executable" test -x "$tmp/unpacked/b/prog"

echo
if ((fails)); then echo "$fails checks FAILED"; exit 1; fi
echo "all checks passed"
