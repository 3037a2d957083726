// GPT-2 BPE: pre-tokenizer, vocabulary loading and merges. See tokenizer.h for the rules.
#include "data/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "data/excerpt.h"

namespace st {
namespace {

struct CodeRange {
  uint32_t first, last;
};
#include "data/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&r)[N], uint32_t cp) {
  const CodeRange* it = std::upper_bound(r, r + N, cp, [](uint32_t c, const CodeRange& x) {
    return c < x.first;
  });
  return it != r && cp <= (it - 1)->last;
}

// ASCII classes, precomputed from the same tables.
struct AsciiClasses {
  CharClass c[128];
  AsciiClasses() {
    for (uint32_t i = 0; i < 128; ++i)
      c[i] = in_ranges(kLetterRanges, i)   ? CharClass::Letter
             : in_ranges(kNumberRanges, i) ? CharClass::Number
             : in_ranges(kSpaceRanges, i)  ? CharClass::Space
                                           : CharClass::Other;
  }
};
const AsciiClasses kAscii;

constexpr uint32_t kInvalid = 0xffffffffu;  // a byte that is not part of valid UTF-8

// Decodes the character at s[0..n) (n >= 1): its length in bytes and code point, or
// (1, kInvalid) for a byte that does not start a valid, shortest-form, non-surrogate
// sequence.
inline int utf8_char(const unsigned char* s, size_t n, uint32_t& cp) {
  const unsigned char b = s[0];
  if (b < 0x80) return cp = b, 1;
  int len;
  uint32_t c, min;
  if ((b & 0xe0) == 0xc0) len = 2, c = b & 0x1f, min = 0x80;
  else if ((b & 0xf0) == 0xe0) len = 3, c = b & 0x0f, min = 0x800;
  else if ((b & 0xf8) == 0xf0) len = 4, c = b & 0x07, min = 0x10000;
  else return cp = kInvalid, 1;
  if (n < static_cast<size_t>(len)) return cp = kInvalid, 1;
  for (int i = 1; i < len; ++i) {
    if ((s[i] & 0xc0) != 0x80) return cp = kInvalid, 1;
    c = (c << 6) | (s[i] & 0x3f);
  }
  if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return cp = kInvalid, 1;
  return cp = c, len;
}

inline CharClass class_of(uint32_t cp) {
  return cp < 128 ? kAscii.c[cp] : cp == kInvalid ? CharClass::Other : unicode_class(cp);
}

std::string read_file(const std::string& path, const char* what) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    fail(what, ": cannot read '", path, "': not a regular file (a directory, FIFO or device?);",
         " point the tokenizer directory at a copy of GPT-2's encoder.json and vocab.bpe");
  std::ifstream f(path, std::ios::binary);
  if (!f)
    fail(what, ": cannot read '", path, "': ", std::strerror(errno),
         " (point the tokenizer directory at a copy of GPT-2's encoder.json and vocab.bpe)");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

CharClass unicode_class(uint32_t cp) {
  if (cp < 128) return kAscii.c[cp];
  if (in_ranges(kLetterRanges, cp)) return CharClass::Letter;
  if (in_ranges(kNumberRanges, cp)) return CharClass::Number;
  if (in_ranges(kSpaceRanges, cp)) return CharClass::Space;
  return CharClass::Other;
}

int64_t invalid_utf8_bytes(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  int64_t bad = 0;
  for (size_t i = 0; i < text.size();) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp;
    i += utf8_char(s + i, text.size() - i, cp);
    bad += cp == kInvalid;
  }
  return bad;
}

const char* unicode_tables_version() { return ST_UNICODE_VERSION; }

void gpt2_pretokenize(std::string_view text, std::vector<std::string_view>& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // Class and length of the character at byte i (i < n).
  auto at = [&](size_t i, CharClass& cls) {
    uint32_t cp;
    const int len = utf8_char(s + i, n - i, cp);
    cls = class_of(cp);
    return static_cast<size_t>(len);
  };
  // End of the run of class `cls` starting at byte i.
  auto run = [&](size_t i, CharClass cls) {
    CharClass c;
    while (i < n) {
      const size_t len = at(i, c);
      if (c != cls) break;
      i += len;
    }
    return i;
  };
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    // 's|'t|'re|'ve|'m|'ll|'d
    if (s[i] == '\'' && i + 1 < n) {
      const unsigned char a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
      if (len) {
        out.emplace_back(text.data() + start, len);
        i += len;
        continue;
      }
    }
    CharClass cls;
    const size_t len = at(i, cls);
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : an optional U+0020, then a run of one class.
    if (s[i] == ' ' && i + 1 < n) {
      CharClass next;
      at(i + 1, next);
      if (next != CharClass::Space) {
        i = run(i + 1, next);
        out.emplace_back(text.data() + start, i - start);
        continue;
      }
    }
    if (cls != CharClass::Space) {
      i = run(i, cls);
      out.emplace_back(text.data() + start, i - start);
      continue;
    }
    // \s+(?!\S) | \s+ : a whitespace run that ends the text is taken whole; one followed by
    // a non-space character gives up its last character (which then starts the next piece)
    // unless it is only one character long.
    size_t last = i, j = i;
    CharClass c = cls;
    size_t l = len;
    while (j < n && c == CharClass::Space) {
      last = j;
      j += l;
      if (j < n) l = at(j, c);
    }
    i = (j == n || last == start) ? j : last;
    out.emplace_back(text.data() + start, i - start);
  }
}

std::array<uint32_t, 256> gpt2_byte_to_unicode() {
  std::array<uint32_t, 256> m{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xa1; b <= 0xac; ++b) printable[b] = true;
  for (int b = 0xae; b <= 0xff; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) m[b] = printable[b] ? b : next++;
  return m;
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  load(d + "/encoder.json", d + "/vocab.bpe");
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& encoder_json, const std::string& vocab_bpe) {
  load(encoder_json, vocab_bpe);
}

void Gpt2Tokenizer::load(const std::string& encoder_path, const std::string& bpe_path) {
  // encoder.json: {"token": id}; each token's characters stand for bytes (bytes_to_unicode).
  const std::array<uint32_t, 256> b2u = gpt2_byte_to_unicode();
  std::vector<int> u2b(324, -1);
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = b;
  const std::string enc_text = read_file(encoder_path, "GPT-2 vocabulary");
  const std::string bpe_text = read_file(bpe_path, "GPT-2 merges");
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(enc_text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte: where parsing stopped (1-based); at the end for a file cut short.
    const bool at_end = e.byte >= enc_text.size();
    fail(encoder_path, ": not a JSON object of token -> id: invalid JSON at byte ", e.byte, " of ",
         enc_text.size(), at_end ? " (the file ends early: truncated?)" : "",
         "; restore GPT-2's encoder.json");
  } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range: a number like 1e999
    fail(encoder_path, ": not a JSON object of token -> id: ", e.what(),
         "; restore GPT-2's encoder.json");
  }
  if (!enc.is_object() || enc.empty())
    fail(encoder_path, ": not a JSON object of token -> id (is this GPT-2's encoder.json?)");
  bytes_.assign(enc.size(), std::string());
  std::vector<bool> seen(enc.size(), false);
  std::unordered_map<std::string, int32_t> id_of;
  id_of.reserve(enc.size());
  for (auto it = enc.begin(); it != enc.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= static_cast<int64_t>(enc.size()))
      fail(encoder_path, ": token '", excerpt(it.key()), "' has id ", excerpt(it.value().dump()),
           ", expected an integer in [0, ", enc.size(), ")");
    const int32_t id = it.value().get<int32_t>();
    if (seen[id]) fail(encoder_path, ": id ", id, " is used twice");
    seen[id] = true;
    const std::string& key = it.key();
    std::string bytes;
    for (size_t i = 0; i < key.size();) {
      uint32_t cp;
      i += utf8_char(reinterpret_cast<const unsigned char*>(key.data()) + i, key.size() - i, cp);
      if (cp == kInvalid || cp >= u2b.size() || u2b[cp] < 0)
        fail(encoder_path, ": token '", excerpt(key), "' (id ", id,
             ") holds a character outside GPT-2's byte alphabet");
      bytes.push_back(static_cast<char>(u2b[cp]));
    }
    bytes_[id] = bytes;
    id_of.emplace(key, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string key;
    const uint32_t cp = b2u[b];
    if (cp < 0x80) key.push_back(static_cast<char>(cp));
    else key += {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
    auto it = id_of.find(key);
    if (it == id_of.end())
      fail(encoder_path, ": no token for byte ", b, " ('", key, "'): not a byte-level vocabulary");
    byte_token_[b] = it->second;
  }
  auto eot = id_of.find("<|endoftext|>");
  if (eot == id_of.end()) fail(encoder_path, ": no <|endoftext|> token");
  eot_ = eot->second;

  // vocab.bpe: "#version: ..." then one "left right" merge per line, best first. The last
  // line must end with its newline: a file cut mid-line can still read as a valid pair
  // ("Ġre gard" cut to "Ġre g") and would silently change the tokenization.
  if (!bpe_text.empty() && bpe_text.back() != '\n') {
    const size_t nl = bpe_text.find_last_of('\n');
    const size_t start = nl == std::string::npos ? 0 : nl + 1;
    fail(bpe_path, ":", std::count(bpe_text.begin(), bpe_text.end(), '\n') + 1,
         ": the last line ('", excerpt(std::string_view(bpe_text).substr(start)),
         "') has no newline: the file is truncated (restore GPT-2's vocab.bpe)");
  }
  std::istringstream lines(bpe_text);
  std::string line;
  int lineno = 0;
  int32_t rank = 0;
  merges_.reserve(enc.size());
  while (std::getline(lines, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string::npos)
      fail(bpe_path, ":", lineno, ": expected two tokens separated by one space, got '",
           excerpt(line), "'");
    const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    auto ia = id_of.find(a), ib = id_of.find(b), iab = id_of.find(a + b);
    if (ia == id_of.end() || ib == id_of.end() || iab == id_of.end())
      fail(bpe_path, ":", lineno, ": merge '", excerpt(line), "' names a token missing from ",
           encoder_path, " (the two files do not belong together)");
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges_.emplace(key, Merge{rank++, iab->second});  // a repeated pair keeps its best rank
  }
  if (merges_.empty()) fail(bpe_path, ": no merges");
}

void Gpt2Tokenizer::bpe_short(std::vector<int32_t>& w) const {
  // encoder.py's loop: the lowest-ranked adjacent pair, merged everywhere left to right.
  std::vector<int32_t> next;
  while (w.size() > 1) {
    const Merge* best = nullptr;
    int32_t a = 0, b = 0;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      const Merge* m = find_merge(w[i], w[i + 1]);
      if (m && (!best || m->rank < best->rank)) best = m, a = w[i], b = w[i + 1];
    }
    if (!best) break;
    next.clear();
    for (size_t i = 0; i < w.size();) {
      if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
        next.push_back(best->id);
        i += 2;
      } else {
        next.push_back(w[i++]);
      }
    }
    w.swap(next);
  }
}

void Gpt2Tokenizer::bpe_long(std::vector<int32_t>& w) const {
  // The same merges in O(n log n): a linked list of symbols and a heap of candidate pairs
  // (rank, position), checked when popped. All candidates of the lowest rank are applied in
  // position order, which is encoder.py's left-to-right pass over that pair.
  const int n = static_cast<int>(w.size());
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  using Cand = std::pair<int32_t, int>;  // rank, left position
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    if (const Merge* m = find_merge(w[i], w[next[i]])) heap.push({m->rank, i});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<int> pos;
  while (!heap.empty()) {
    const int32_t r = heap.top().first;
    pos.clear();
    while (!heap.empty() && heap.top().first == r) {
      pos.push_back(heap.top().second);
      heap.pop();
    }
    std::sort(pos.begin(), pos.end());
    pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    for (int i : pos) {
      if (!alive[i] || next[i] < 0) continue;
      const Merge* m = find_merge(w[i], w[next[i]]);
      if (!m || m->rank != r) continue;  // stale: the pair changed since it was pushed
      const int j = next[i];
      w[i] = m->id;
      alive[j] = false;
      next[i] = next[j];
      if (next[j] >= 0) prev[next[j]] = i;
      push(prev[i]);
      push(i);
    }
  }
  std::vector<int32_t> out;
  for (int i = 0; i >= 0; i = next[i]) out.push_back(w[i]);
  w.swap(out);
}

void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out, bool long_word) const {
  std::vector<int32_t> w(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) w[i] = byte_token_[static_cast<unsigned char>(piece[i])];
  if (long_word) bpe_long(w);
  else bpe_short(w);
  out.insert(out.end(), w.begin(), w.end());
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  constexpr size_t kLong = 64;          // bytes; longer pieces take the O(n log n) path
  constexpr size_t kCacheMax = 1 << 20;  // entries; the cache is dropped when full
  pieces_.clear();
  gpt2_pretokenize(text, pieces_);
  for (std::string_view p : pieces_) {
    if (p.size() == 1) {
      out.push_back(byte_token_[static_cast<unsigned char>(p[0])]);
      continue;
    }
    if (p.size() > kLong) {
      bpe(p, out, true);
      continue;
    }
    key_.assign(p.data(), p.size());  // reuses its buffer: no allocation per lookup
    auto it = cache_.find(key_);
    if (it == cache_.end()) {
      if (cache_.size() >= kCacheMax) cache_.clear();
      std::vector<int32_t> ids;
      bpe(p, ids, false);
      it = cache_.emplace(key_, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

std::string Gpt2Tokenizer::decode(const int32_t* ids, size_t n) const {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size())
      fail("GPT-2 decode: token ", ids[i], " at position ", i, " is outside the vocabulary [0, ",
           vocab_size(), ")");
    s += bytes_[ids[i]];
  }
  return s;
}

}  // namespace st
