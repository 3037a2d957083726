// The independent reference for the GPT-2 tokenizer tests: the npm package gpt-3-encoder
// (1.1.4), run unmodified with node.
//   node gpt2_reference.js PKG_DIR encode TEXT_FILE OUT_FILE       ids, one per line
//   node gpt2_reference.js PKG_DIR pretokenize TEXT_FILE OUT_FILE  UTF-8 byte length of each
//                                                                 match of the package's pattern
//   node gpt2_reference.js PKG_DIR classes OUT_FILE                 one byte per code point
//                                                                 0..0x10FFFF: L N S (\s) or O
//   node gpt2_reference.js PKG_DIR bench TEXT_FILE                  milliseconds of encode():
//                                                                 first (cold cache), best of 2 more
// TEXT_FILE is read as UTF-8, as the package's users do.
'use strict';
const fs = require('fs');
const path = require('path');
const [pkg, mode, a, b] = process.argv.slice(2);

if (mode === 'encode' || mode === 'bench') {
  const { encode } = require(path.resolve(pkg));
  const text = fs.readFileSync(a, 'utf-8');
  // encode() appends each piece's ids with `bpe_tokens = bpe_tokens.concat(new_tokens)`,
  // which copies the whole array per piece: quadratic, hours for a megabyte. While it runs,
  // concat with one array argument appends in place instead. Every call site in the package
  // assigns the result back to the array it was called on and never reads the old array, so
  // the ids are the same.
  const concat = Array.prototype.concat;
  Array.prototype.concat = function (...args) {
    if (args.length !== 1 || !Array.isArray(args[0])) return concat.apply(this, args);
    for (const x of args[0]) this.push(x);
    return this;
  };
  let ids;
  const ms = [];
  try {
    for (let i = 0; i < (mode === 'bench' ? 3 : 1); ++i) {
      const t0 = process.hrtime.bigint();
      ids = encode(text);
      ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
  } finally {
    Array.prototype.concat = concat;
  }
  if (mode === 'bench') console.log(ms[0].toFixed(3), Math.min(...ms.slice(1)).toFixed(3));
  else fs.writeFileSync(b, ids.join('\n') + '\n');
} else if (mode === 'pretokenize') {
  // The pattern literal, taken from the package's own source.
  const src = fs.readFileSync(path.join(pkg, 'Encoder.js'), 'utf-8');
  const m = src.match(/const pat = (\/.*\/gu)\s*$/m);
  if (!m) throw new Error('no pattern in Encoder.js');
  const pat = eval(m[1]);
  const text = fs.readFileSync(a, 'utf-8');
  const lens = Array.from(text.matchAll(pat), (x) => Buffer.byteLength(x[0], 'utf-8'));
  fs.writeFileSync(b, lens.join('\n') + '\n');
} else if (mode === 'classes') {
  const out = Buffer.alloc(0x110000);
  for (let cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xd800 && cp <= 0xdfff) { out[cp] = 0x4f; continue; }
    const ch = String.fromCodePoint(cp);
    out[cp] = /\p{L}/u.test(ch) ? 0x4c : /\p{N}/u.test(ch) ? 0x4e : /\s/u.test(ch) ? 0x53 : 0x4f;
  }
  fs.writeFileSync(a, out);
} else {
  console.error('usage: node gpt2_reference.js PKG_DIR encode|pretokenize|classes ...');
  process.exit(2);
}
