// llm.c token shards: a 1024-byte header of 256 little-endian int32 (magic 20240520,
// version 1, token count n, the rest zero) followed by n uint16 tokens; the file is exactly
// 1024 + 2n bytes. Reading maps the file (no copy) and checks the header, the size and
// every token against the vocabulary; each error names the file and the fix.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace st {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderBytes = 1024;
// Token counts that fit a shard: the header stores n as int32.
inline constexpr int64_t kShardMaxTokens = 2147483647;
// Token ids are stored as uint16, in shards and in memory (TokenSet): a vocabulary holds at
// most 65536 tokens (ids 0..65535). The one rule for prepare_data, the text loader and
// train's model.vocab_size, so that none accepts what another refuses.
inline constexpr int kMaxTokenVocab = 65536;
// Throws st::Error naming `what` (the tokenizer file or config key) when a vocabulary of
// `vocab` tokens does not fit the token format.
void check_token_vocab(int64_t vocab, const std::string& what);

// Writes a shard atomically (temporary file + rename). Tokens must be in [0, 65536).
void write_token_shard(const std::string& path, const uint16_t* tokens, int64_t n);

// A read-only shard. tokens() points into a private mapping of the file.
class TokenShard {
 public:
  // vocab > 0: every token must be < vocab. what: the config key or flag, for errors.
  static TokenShard open(const std::string& path, int vocab, const std::string& what = "");
  const uint16_t* tokens() const { return tokens_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::shared_ptr<const void> owner() const { return map_; }

 private:
  std::string path_;
  std::shared_ptr<const void> map_;  // unmaps when the last copy goes
  const uint16_t* tokens_ = nullptr;
  int64_t size_ = 0;
};

// True when the file exists and starts with the shard magic.
bool is_token_shard(const std::string& path);
// True when the path holds glob characters (* ? [).
bool is_glob(const std::string& path);
// Files matching a glob pattern (or the path itself when it has no glob characters and
// exists), sorted by name. Empty when nothing matches.
std::vector<std::string> glob_files(const std::string& pattern);
// Output name of shard `index` for a pattern: its '*' becomes the 6-digit index
// ("x_train_*.bin" -> "x_train_000003.bin"); a pattern without '*' is the single file.
std::string shard_name(const std::string& pattern, int index);

}  // namespace st
