// GPT-2's byte-level BPE tokenizer (OpenAI's encoder.py; token ids identical to the npm
// package gpt-3-encoder, tested with node), and the byte-level tokenizer (token = byte).
//
// Encoding a text: (1) pre-tokenization with GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written by hand (gpt2_pretokenize) with JavaScript's meaning of \s, \p{L} and \p{N}
// (tables generated from node: data/unicode_tables.inc); (2) each piece's UTF-8 bytes start
// as single-byte tokens and are merged by vocab.bpe rank, every occurrence of the
// lowest-ranked pair in one left-to-right pass, until no pair has a rank.
// Bytes that are not valid UTF-8 are kept, not replaced: each such byte is a character of
// its own outside \s, \p{L} and \p{N}, so decode(encode(x)) == x for any byte string.
// encode() treats "<|endoftext|>" in the text as ordinary text; the EOT token (50256) is
// added by the caller between documents.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace st {

inline constexpr int32_t kGpt2EotToken = 50256;
inline constexpr int kGpt2VocabSize = 50257;

// Character classes of the pre-tokenization pattern.
enum class CharClass : uint8_t { Letter, Number, Space, Other };
CharClass unicode_class(uint32_t cp);  // JavaScript \p{L} / \p{N} / \s, else Other
const char* unicode_tables_version();  // Unicode version of the generated tables

// Number of bytes of `text` that are not part of a valid UTF-8 character.
int64_t invalid_utf8_bytes(std::string_view text);

// Splits text into GPT-2 pre-tokens (consecutive, covering the text), appended to out.
void gpt2_pretokenize(std::string_view text, std::vector<std::string_view>& out);

// GPT-2's bytes_to_unicode(): byte -> the code point that stands for it in encoder.json.
std::array<uint32_t, 256> gpt2_byte_to_unicode();

class Gpt2Tokenizer {
 public:
  // Loads DIR/encoder.json and DIR/vocab.bpe. Errors name the file and what is wrong.
  explicit Gpt2Tokenizer(const std::string& dir);
  Gpt2Tokenizer(const std::string& encoder_json, const std::string& vocab_bpe);

  void encode(std::string_view text, std::vector<int32_t>& out);  // appends
  std::vector<int32_t> encode(std::string_view text);
  std::string decode(const int32_t* ids, size_t n) const;  // throws on an id outside vocab
  std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }

  int vocab_size() const { return static_cast<int>(bytes_.size()); }
  int32_t eot() const { return eot_; }
  const std::string& token_bytes(int32_t id) const { return bytes_.at(id); }
  size_t num_merges() const { return merges_.size(); }

  // BPE of one pre-token's bytes, without the cache. `long_word` picks the heap-driven
  // algorithm used for long pieces (exposed so tests can check both give the same ids).
  void bpe(std::string_view piece, std::vector<int32_t>& out, bool long_word) const;

 private:
  void load(const std::string& encoder_json, const std::string& vocab_bpe);
  struct Merge {
    int32_t rank, id;  // rank in vocab.bpe, token id of the merged pair
  };
  const Merge* find_merge(int32_t a, int32_t b) const {
    auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  void bpe_short(std::vector<int32_t>& w) const;
  void bpe_long(std::vector<int32_t>& w) const;

  std::vector<std::string> bytes_;              // id -> the token's bytes
  std::array<int32_t, 256> byte_token_{};       // byte -> id of its single-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (a << 32 | b) -> merge
  std::unordered_map<std::string, std::vector<int32_t>> cache_;  // piece -> ids
  std::vector<std::string_view> pieces_;        // scratch
  std::string key_;                             // scratch: cache lookup key
  int32_t eot_ = -1;
};

}  // namespace st
