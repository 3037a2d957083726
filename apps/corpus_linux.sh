#!/usr/bin/env bash
# corpus_linux.sh: a real training corpus that travels to the offline GPU machine (issue 44):
# the English documentation and the core C sources of Debian's linux-source-6.1 package
# (GPL-2.0), cleaned into one UTF-8 text file and compressed to data_cache/corpus/linux.txt.xz
# (about 21 MiB, 55M GPT-2 tokens: bench/results/2026-11-29_corpus_linux.md says why this one).
# Runs on the development machine; the .xz is carried to the GPU machine (README, "Training
# on a GPU"), where `xz -dk` and prepare_data --doc-separator '\n\n\n' turn it into shards
# with the GPT-2 tokenizer copied beside it (that machine has no ../shared).
#
#   bash apps/corpus_linux.sh [--deb FILE] [--package NAME] [--out DIR] [--max-mib N]
#                              [--tokenizer-dir DIR] [--force]
#
#   --deb FILE     use this .deb instead of `apt-get download` (env CORPUS_DEB; offline use)
#   --package NAME the Debian package (env CORPUS_PACKAGE, default linux-source-6.1); it holds
#                  /usr/src/NAME.tar.xz with the tree under NAME/
#   --out DIR      output folder (default data_cache/corpus in the repository)
#   --max-mib N    refuse a compressed corpus over N MiB (env CORPUS_MAX_MIB, default 25)
#   --tokenizer-dir DIR  encoder.json and vocab.bpe to copy to DIR/gpt2-tokenizer (env
#                  CORPUS_TOKENIZER_DIR, default ../shared/data/gpt2-tokenizer)
#   --force        redo even when the output exists and matches its manifest
#
# Writes DIR/linux.txt.xz (xz -9e -T1: the same bytes for the same input and xz version),
# DIR/linux.txt.xz.info (package, version, rules, sizes, SHA-256 of the raw text) and
# DIR/gpt2-tokenizer/ (1.5 MB; copied on every run, it is cheap). When the first two
# exist, the rules are this script's, and the decompressed text has the recorded SHA-256, it
# only prints the numbers (a newer package version is picked up only with --force).
#
# Cleaning rules (RULES below names them; change it whenever they change):
#   - files: Documentation/**/*.rst and *.txt except Documentation/translations/ (not
#     English) and Documentation/devicetree/ (binding boilerplate); *.c and *.h under kernel,
#     mm, lib, block, ipc, init, security, crypto, fs, net (not drivers, arch, sound, tools,
#     include: the cap);
#   - a file that is not valid UTF-8 or holds a NUL byte is dropped; so is an exact
#     duplicate of a file kept before it;
#   - CRLF becomes LF; trailing spaces, tabs, CR, FF and VT are cut from every line; runs of
#     blank lines become one blank line; leading and trailing blank lines go; each file ends
#     with one '\n'; a file left empty is dropped; nothing else changes (reStructuredText
#     markup and comments stay as written);
#   - order: by the SHA-256 of the file's path under NAME/ (a fixed shuffle, so the last
#     0.5% that prepare_data holds out samples every part), each file followed by "\n\n":
#     "\n\n\n" ends every file and occurs nowhere else, so --doc-separator '\n\n\n' makes each
#     file a document (one <|endoftext|> before each).
# Errors: one line on stderr, exit 1. Tested offline: tests/scripts/test_corpus_linux.sh.
# One { } block: bash reads it whole before running it, so editing this file while it runs
# (five minutes) cannot change what runs.
{
set -euo pipefail

RULES="corpus_linux v1"
die() { echo "corpus_linux: error: $*" >&2; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEB="${CORPUS_DEB:-}"
PKG="${CORPUS_PACKAGE:-linux-source-6.1}"
OUT="$ROOT/data_cache/corpus"
MAX_MIB="${CORPUS_MAX_MIB:-25}"
TOK_DIR="${CORPUS_TOKENIZER_DIR:-$ROOT/../shared/data/gpt2-tokenizer}"
FORCE=0
while (($#)); do
  case "$1" in
    --deb) DEB="${2:?--deb needs a file}"; shift 2 ;;
    --package) PKG="${2:?--package needs a name}"; shift 2 ;;
    --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
    --max-mib) MAX_MIB="${2:?--max-mib needs a number}"; shift 2 ;;
    --tokenizer-dir) TOK_DIR="${2:?--tokenizer-dir needs a folder}"; shift 2 ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,/^# Errors:/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
MAX_BYTES="$(awk -v m="$MAX_MIB" 'BEGIN { if (m !~ /^[0-9]+(\.[0-9]*)?$/) exit 1;
                                          printf "%d", m * 1048576 }')" ||
  die "--max-mib: '$MAX_MIB' is not a number of MiB"
for tool in dpkg-deb tar xz python3 sha256sum; do
  command -v "$tool" >/dev/null || die "$tool not found (apt-get install dpkg tar xz-utils python3 coreutils)"
done

# The GPT-2 tokenizer travels with the corpus: the GPU machine's prepare_data needs it.
[[ -f "$TOK_DIR/encoder.json" && -f "$TOK_DIR/vocab.bpe" ]] ||
  die "--tokenizer-dir $TOK_DIR: no encoder.json and vocab.bpe there (GPT-2's, as in ../shared/data/gpt2-tokenizer)"
mkdir -p "$OUT/gpt2-tokenizer"
for f in encoder.json vocab.bpe LICENSE; do
  [[ ! -f "$TOK_DIR/$f" ]] || cmp -s "$TOK_DIR/$f" "$OUT/gpt2-tokenizer/$f" ||
    install -m 644 "$TOK_DIR/$f" "$OUT/gpt2-tokenizer/$f"
done

XZ="$OUT/linux.txt.xz"
INFO="$XZ.info"
field() { sed -n "s/^$1: //p" "$2"; }
report() {  # report RAW_BYTES XZ_BYTES SHA
  awk -v r="$1" -v c="$2" -v s="$3" -v f="$XZ" 'BEGIN {
    printf "%s: raw %d bytes (%.1f MB), compressed %d bytes (%.2f MiB), raw sha256 %s\n",
           f, r, r / 1e6, c, c / 1048576, s }'
}

# Up to date: the manifest's rules and package are ours and the text has its SHA-256.
if ((!FORCE)) && [[ -f "$XZ" && -f "$INFO" ]] &&
   [[ "$(field rules "$INFO")" == "$RULES" && "$(field package "$INFO")" == "$PKG" ]] &&
   [[ "$(field xz_bytes "$INFO")" == "$(stat -c %s "$XZ")" ]] &&
   [[ "$(xz -dc "$XZ" 2>/dev/null | sha256sum | cut -d' ' -f1)" == "$(field raw_sha256 "$INFO")" ]]; then
  echo "up to date ($(field package "$INFO") $(field version "$INFO"); --force redoes it)"
  report "$(field raw_bytes "$INFO")" "$(field xz_bytes "$INFO")" "$(field raw_sha256 "$INFO")"
  exit 0
fi

tmp="$(mktemp -d -t corpus_linux.XXXXXX)"  # about 300 MB in $TMPDIR (default /tmp)
trap 'rm -rf "$tmp"' EXIT

if [[ -n "$DEB" ]]; then
  [[ -f "$DEB" ]] || die "--deb $DEB: no such file (get one with 'apt-get download $PKG', or omit --deb to fetch it)"
else
  echo "fetching $PKG with apt-get download ..."
  (cd "$tmp" && apt-get download "$PKG") >"$tmp/apt.log" 2>&1 ||
    die "apt-get download $PKG failed ($(grep -m1 '^E:' "$tmp/apt.log" || tail -n1 "$tmp/apt.log")): run 'apt-get update' first, or pass --deb FILE (a $PKG .deb)"
  DEB="$(ls "$tmp"/*.deb)"
fi
got="$(dpkg-deb -f "$DEB" Package 2>"$tmp/deb.log")" ||
  die "$DEB is not a readable .deb ($(head -n1 "$tmp/deb.log")): pass the $PKG .deb from 'apt-get download $PKG', or omit --deb"
[[ "$got" == "$PKG" ]] || die "$DEB holds package '$got', not $PKG: pass a $PKG .deb ('apt-get download $PKG'), or --package $got if it is another linux-source"
VERSION="$(dpkg-deb -f "$DEB" Version)"
echo "extracting and cleaning $PKG $VERSION ..."

read -r -d '' CLEAN <<'PY' || true
import hashlib, sys, tarfile
pkg, out = sys.argv[1], sys.argv[2]
CODE = {"kernel", "mm", "lib", "block", "ipc", "init", "security", "crypto", "fs", "net"}
def wanted(rel):
    top = rel.split("/", 1)[0]
    if top == "Documentation":
        return rel.endswith((".rst", ".txt")) and not rel.startswith(
            ("Documentation/translations/", "Documentation/devicetree/"))
    return top in CODE and rel.endswith((".c", ".h"))
def clean(text):
    lines, blank = [], True  # True: drops leading blank lines
    for line in text.replace("\r\n", "\n").split("\n"):
        line = line.rstrip(" \t\r\f\v")
        if line or not blank:
            lines.append(line)
        blank = not line
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""
files, dropped = {}, 0
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz") as tar:
    for m in tar:
        name = m.name[2:] if m.name.startswith("./") else m.name
        if not (m.isfile() and name.startswith(pkg + "/") and wanted(name[len(pkg) + 1:])):
            continue
        try:
            text = tar.extractfile(m).read().decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or "\0" in text:
            dropped += 1
            continue
        text = clean(text)
        if text:
            files[name[len(pkg) + 1:]] = text
while sys.stdin.buffer.read(1 << 20):  # to the end, so tar -xO never writes into a closed pipe
    pass
if not files:
    sys.exit(f"no file of the selection under {pkg}/ in the tarball")
seen, kept, docs = set(), [], 0
for rel in sorted(files, key=lambda r: hashlib.sha256(r.encode()).hexdigest()):
    digest = hashlib.sha256(files[rel].encode()).digest()
    if digest not in seen:
        seen.add(digest)
        kept.append(files[rel] + "\n\n")
        docs += rel.startswith("Documentation/")
with open(out, "w", encoding="utf-8", newline="") as f:
    f.write("".join(kept))
print(f"files: {len(kept)} (documentation {docs}, code {len(kept) - docs}); dropped "
      f"{dropped} not UTF-8 or with NUL, {len(files) - len(kept)} duplicates")
PY

if ! dpkg-deb --fsys-tarfile "$DEB" 2>"$tmp/x.log" | tar -xOf - "./usr/src/$PKG.tar.xz" 2>>"$tmp/x.log" |
     python3 -c "$CLEAN" "$PKG" "$tmp/linux.txt" >"$tmp/files.txt" 2>>"$tmp/x.log"; then
  die "cannot read /usr/src/$PKG.tar.xz from $DEB ($(grep -v -e '^ ' -e '^Traceback' "$tmp/x.log" | head -n1)): pass the $PKG .deb from 'apt-get download $PKG'"
fi
cat "$tmp/files.txt"
RAW_BYTES="$(stat -c %s "$tmp/linux.txt")"
SHA="$(sha256sum "$tmp/linux.txt" | cut -d' ' -f1)"
echo "compressing $RAW_BYTES bytes with xz -9e -T1 (1.5-2 s per MB here) ..."
xz -9e -T1 -c "$tmp/linux.txt" >"$tmp/linux.txt.xz"
XZ_BYTES="$(stat -c %s "$tmp/linux.txt.xz")"
((XZ_BYTES <= MAX_BYTES)) || die "the compressed corpus is $XZ_BYTES bytes, over the cap of $MAX_MIB MiB (--max-mib or CORPUS_MAX_MIB; the carry holds 64 MiB in all)"

mkdir -p "$OUT"
printf '%s\n' "corpus: linux" "rules: $RULES" "package: $PKG" "version: $VERSION" \
  "$(cat "$tmp/files.txt")" "raw_bytes: $RAW_BYTES" "raw_sha256: $SHA" "xz_bytes: $XZ_BYTES" \
  "made: $(date -u +%Y-%m-%dT%H:%MZ) by apps/corpus_linux.sh" >"$tmp/info"
rm -f "$INFO"  # a half-written pair never passes the up-to-date check
mv "$tmp/linux.txt.xz" "$XZ"
mv "$tmp/info" "$INFO"
report "$RAW_BYTES" "$XZ_BYTES" "$SHA"
exit 0
}
