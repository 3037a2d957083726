#!/usr/bin/env bash
# Installs the reference GPT-2 encoder (npm gpt-3-encoder 1.1.4) into PREFIX (a git-ignored
# build folder) when it is not there yet. Used by test_tokenizer_node; needs node, npm and the
# npm registry the first time.
set -euo pipefail
prefix=${1:?usage: install_gpt3_encoder.sh PREFIX}
pkg="$prefix/node_modules/gpt-3-encoder"
[ -f "$pkg/Encoder.js" ] && [ -f "$pkg/.stabletrain-ok" ] && exit 0
for tool in node npm; do
  command -v "$tool" >/dev/null || {
    echo "install_gpt3_encoder: '$tool' not found; the GPT-2 tokenizer reference test runs the npm package gpt-3-encoder with node (Debian: apt-get install nodejs npm)" >&2
    exit 1
  }
done
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error gpt-3-encoder@1.1.4 >&2
[ -f "$pkg/Encoder.js" ] || { echo "install_gpt3_encoder: npm did not install $pkg" >&2; exit 1; }
touch "$pkg/.stabletrain-ok"
