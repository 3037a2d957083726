// Token data for training: the train and validation splits, each a list of token spans
// (one per llm.c shard, mapped from disk, or one in memory for tokenized text).
//
// Where the tokens come from (data: section of the config):
//   - llm.c token shards: a path ending in .bin or a glob ("dir/x_train_*.bin"), read with
//     every header, size and token checked (data/shards.h);
//   - a text file, tokenized on load with the byte-level tokenizer (token = byte, vocabulary
//     256) or GPT-2's BPE; without val_path the last val_fraction of the file's bytes is the
//     validation split (data/prepare.h has the exact rule).
// With prepare_from set, shards that are missing are first written from that text file.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace st {

struct TokenSpan {
  const uint16_t* data = nullptr;
  int64_t size = 0;
};

// One split: spans whose memory is kept alive by the set (shared between copies).
class TokenSet {
 public:
  void add(std::vector<uint16_t> tokens);  // takes ownership
  void add(const uint16_t* data, int64_t size, std::shared_ptr<const void> owner);
  const std::vector<TokenSpan>& spans() const { return spans_; }
  int64_t size() const;  // tokens in all spans
  std::vector<int32_t> to_vector() const;  // all tokens, concatenated (tests, small data)

 private:
  std::vector<TokenSpan> spans_;
  std::vector<std::shared_ptr<const void>> owners_;
};

struct TokenData {
  TokenSet train, val;
  // Of the tokenizer, every token below it: 256 byte; gpt2: the size of the encoder.json in
  // data.tokenizer_dir (50257 for GPT-2's, at most kMaxTokenVocab; 50257 when shards are
  // read and the folder has no encoder.json).
  int vocab_size = 0;
  std::string tokenizer;     // byte | gpt2
  std::string description;   // for logs
};

// The data: section, as the loader needs it.
struct DataSpec {
  std::string train_path, val_path;
  std::string format = "auto";        // auto | text | shards
  std::string tokenizer = "byte";     // byte | gpt2
  std::string tokenizer_dir;          // encoder.json + vocab.bpe (gpt2)
  std::string prepare_from;           // text file that missing shards are prepared from
  double val_fraction = 0.1;
};

// Loads (and, with prepare_from, first prepares) the data. Errors name the config key and
// the file. `log` receives progress lines (preparation).
TokenData load_token_data(const DataSpec& spec,
                          const std::function<void(const std::string&)>& log = {});

// True when `path` is read as token shards under format `format` (auto: glob or *.bin).
bool reads_as_shards(const std::string& path, const std::string& format);

// Kept for the byte-level path: token = byte.
std::string decode_bytes(const std::vector<int32_t>& tokens);

}  // namespace st
