#!/usr/bin/env bash
# ctest corpus_linux_script (label cpu, offline, about 2 s): apps/corpus_linux.sh against a
# fake linux-source .deb built here (dpkg-deb --build of a tiny tree), checking its cleaning
# rules on the decompressed output, its up-to-date check and --force, the size cap, the
# tokenizer copied beside the corpus, and its one-line errors for a missing, garbage or
# wrong .deb, a failing apt-get and a missing tokenizer.
# Usage: test_corpus_linux.sh REPO_ROOT
set -uo pipefail
ROOT="$1"
SCRIPT="$ROOT/apps/corpus_linux.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # check DESCRIPTION CONDITION...
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fails=$((fails + 1)); fi
}
one_line_error() {  # one_line_error RC STDERR_FILE PATTERN: failed, one line, naming PATTERN
  test "$1" -ne 0 && test "$(wc -l <"$2")" -eq 1 && grep -qE "^corpus_linux: error: .*$3" "$2"
}

# The tree: what the rules keep, drop and change.
src="$tmp/src/linux-source-6.1"
mkdir -p "$src"/{Documentation/translations/zh_CN,Documentation/devicetree/bindings,kernel,mm,lib,fs,net,drivers}
printf 'Title\r\n=====\r\n\r\n\r\n\r\nSome text.   \r\n' >"$src/Documentation/intro.rst"
printf '\n\n  \nNotes\t\n' >"$src/Documentation/notes.txt"
printf 'not English\n' >"$src/Documentation/translations/zh_CN/intro.rst"
printf 'binding\n' >"$src/Documentation/devicetree/bindings/x.txt"
printf 'a: b\n' >"$src/Documentation/schema.yaml"
printf 'int x;\t \n\n\n\nint y;\f\n\n\n' >"$src/kernel/fork.c"
printf 'int x;\n\nint y;\n' >"$src/mm/copy.h"  # the same as kernel/fork.c once cleaned
printf '/* caf\xc3\xa9 */\nint z;' >"$src/lib/utf8.c"
printf '/* caf\xe9 */\n' >"$src/net/latin1.c"
printf 'a\0b\n' >"$src/net/nul.c"
printf '\n \n\t\n' >"$src/fs/empty.c"
printf 'int d;\n' >"$src/drivers/d.c"
printf 'int o;\n' >"$src/kernel/other.S"
# Kept, cleaned as the rules say, in the order of the SHA-256 of their paths; of the two
# identical files, the one first in that order.
declare -A want=(
  [Documentation/intro.rst]=$'Title\n=====\n\nSome text.\n'
  [Documentation/notes.txt]=$'Notes\n'
  [kernel/fork.c]=$'int x;\n\nint y;\n'
  [mm/copy.h]=$'int x;\n\nint y;\n'
  [lib/utf8.c]=$'/* caf\xc3\xa9 */\nint z;\n'
)
: >"$tmp/expected.txt"
dup=0
while read -r _ rel; do
  if [[ "$rel" == kernel/fork.c || "$rel" == mm/copy.h ]]; then ((dup++)) && continue; fi
  printf '%s\n\n' "${want[$rel]}" >>"$tmp/expected.txt"
done < <(for rel in "${!want[@]}"; do
           echo "$(printf '%s' "$rel" | sha256sum | cut -d' ' -f1) $rel"; done | sort)

export CORPUS_TOKENIZER_DIR="$tmp/tok"  # a stand-in: only copied
mkdir -p "$CORPUS_TOKENIZER_DIR"
echo '{"!": 0}' >"$CORPUS_TOKENIZER_DIR/encoder.json"
echo '#version: 0.2' >"$CORPUS_TOKENIZER_DIR/vocab.bpe"

mkdir -p "$tmp/pkg/DEBIAN" "$tmp/pkg/usr/src" "$tmp/pkg2/DEBIAN"
tar -C "$tmp/src" --owner=0 --group=0 -cJf "$tmp/pkg/usr/src/linux-source-6.1.tar.xz" linux-source-6.1
control='Version: 6.1.0-test\nArchitecture: all\nMaintainer: test <t@example.org>\nDescription: fake\n'
printf "Package: linux-source-6.1\n$control" >"$tmp/pkg/DEBIAN/control"
printf "Package: dict-gcide\n$control" >"$tmp/pkg2/DEBIAN/control"
dpkg-deb -Zgzip --root-owner-group --build "$tmp/pkg" "$tmp/fake.deb" >/dev/null
dpkg-deb -Zgzip --root-owner-group --build "$tmp/pkg2" "$tmp/other.deb" >/dev/null

out="$tmp/out"
bash "$SCRIPT" --deb "$tmp/fake.deb" --out "$out" >"$tmp/log1" 2>&1
rc=$?
cat "$tmp/log1"
check "a fake .deb is turned into a corpus" test "$rc" -eq 0 -a -f "$out/linux.txt.xz"
xz -dc "$out/linux.txt.xz" >"$tmp/got.txt" 2>/dev/null
check "the decompressed text is the cleaning rules' output" cmp "$tmp/expected.txt" "$tmp/got.txt"
check "the counts are printed" grep -q 'files: 4 (documentation 2, code 2); dropped 2 not UTF-8 or with NUL, 1 duplicates' "$tmp/log1"
check "the raw SHA-256 is printed and recorded" \
  grep -q "raw sha256 $(sha256sum <"$tmp/expected.txt" | cut -d' ' -f1)" "$tmp/log1"
check "the tokenizer is copied beside the corpus" \
  diff -r "$CORPUS_TOKENIZER_DIR" "$out/gpt2-tokenizer"
check "the manifest names the package version" grep -qx 'version: 6.1.0-test' "$out/linux.txt.xz.info"
cp "$tmp/got.txt" "$tmp/raw.txt"
check "xz -9e -T1 as documented (same bytes again)" cmp <(xz -9e -T1 -c "$tmp/raw.txt") "$out/linux.txt.xz"

touch -d '2000-01-01' "$out/linux.txt.xz"
bash "$SCRIPT" --deb /nonexistent.deb --out "$out" >"$tmp/log2" 2>&1
rc=$?
check "an existing matching output is kept (no .deb needed)" \
  test "$rc" -eq 0 -a "$(stat -c %Y "$out/linux.txt.xz")" -eq "$(date -d 2000-01-01 +%s)"
check "... and says so" grep -q '^up to date (linux-source-6.1 6.1.0-test' "$tmp/log2"
bash "$SCRIPT" --deb "$tmp/fake.deb" --out "$out" --force >/dev/null 2>&1
check "--force redoes it" test "$(stat -c %Y "$out/linux.txt.xz")" -ne "$(date -d 2000-01-01 +%s)"
printf 'x' >>"$out/linux.txt.xz"
bash "$SCRIPT" --deb "$tmp/fake.deb" --out "$out" >"$tmp/log3" 2>&1
check "a damaged output is redone" cmp <(xz -dc "$out/linux.txt.xz") "$tmp/expected.txt"

bash "$SCRIPT" --deb "$tmp/fake.deb" --out "$tmp/capped" --max-mib 0.00001 >/dev/null 2>"$tmp/err"
rc=$?
cat "$tmp/err"
check "over the cap: one-line error naming the setting" one_line_error "$rc" "$tmp/err" 'over the cap of 0.00001 MiB \(--max-mib'
check "over the cap: nothing written" test ! -e "$tmp/capped/linux.txt.xz"
CORPUS_MAX_MIB=ten bash "$SCRIPT" --deb "$tmp/fake.deb" --out "$tmp/capped" >/dev/null 2>"$tmp/err"
check "a cap that is not a number is refused" one_line_error $? "$tmp/err" "'ten' is not a number"

for case in missing garbage other tarless; do
  case "$case" in
    missing) deb="$tmp/none.deb"; want_msg="no such file \(get one with 'apt-get download linux-source-6.1'" ;;
    garbage) deb="$tmp/garbage.deb"; echo "not a deb" >"$deb"
             want_msg="is not a readable \.deb .*pass the linux-source-6.1 \.deb" ;;
    other) deb="$tmp/other.deb"; want_msg="holds package 'dict-gcide', not linux-source-6.1: pass a linux-source-6.1 \.deb" ;;
    tarless) deb="$tmp/tarless.deb"; rm "$tmp/pkg/usr/src/linux-source-6.1.tar.xz"
             dpkg-deb -Zgzip --root-owner-group --build "$tmp/pkg" "$deb" >/dev/null
             want_msg="cannot read /usr/src/linux-source-6.1.tar.xz from .*Not found in archive\): pass the linux-source-6.1 \.deb" ;;
  esac
  bash "$SCRIPT" --deb "$deb" --out "$tmp/$case" >/dev/null 2>"$tmp/err"
  rc=$?
  cat "$tmp/err"
  check "$case .deb: one-line error naming the fix" one_line_error "$rc" "$tmp/err" "$want_msg"
  check "$case .deb: nothing written" test ! -e "$tmp/$case/linux.txt.xz"
done

CORPUS_TOKENIZER_DIR="$tmp/none" bash "$SCRIPT" --deb "$tmp/fake.deb" --out "$tmp/notok" >/dev/null 2>"$tmp/err"
rc=$?
cat "$tmp/err"
check "no tokenizer: one-line error" one_line_error "$rc" "$tmp/err" "--tokenizer-dir $tmp/none: no encoder.json and vocab.bpe there"

# No network here: a fake apt-get that fails as it does without a package list.
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "Reading package lists..."\necho "E: Unable to locate package $2" >&2\nexit 100\n' >"$tmp/bin/apt-get"
chmod +x "$tmp/bin/apt-get"
PATH="$tmp/bin:$PATH" bash "$SCRIPT" --out "$tmp/apt" >/dev/null 2>"$tmp/err"
rc=$?
cat "$tmp/err"
check "apt-get failing: one-line error naming the fix" one_line_error "$rc" "$tmp/err" \
  "apt-get download linux-source-6.1 failed \(E: Unable to locate package linux-source-6.1\): run 'apt-get update' first, or pass --deb FILE"

echo "$fails failed"
test "$fails" -eq 0
