#include "data/dataset.h"

#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "data/excerpt.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;

namespace st {

void TokenSet::add(std::vector<uint16_t> tokens) {
  auto owned = std::make_shared<std::vector<uint16_t>>(std::move(tokens));
  spans_.push_back({owned->data(), static_cast<int64_t>(owned->size())});
  owners_.push_back(owned);
}

void TokenSet::add(const uint16_t* data, int64_t size, std::shared_ptr<const void> owner) {
  spans_.push_back({data, size});
  owners_.push_back(std::move(owner));
}

int64_t TokenSet::size() const {
  int64_t n = 0;
  for (const TokenSpan& s : spans_) n += s.size;
  return n;
}

std::vector<int32_t> TokenSet::to_vector() const {
  std::vector<int32_t> v;
  v.reserve(static_cast<size_t>(size()));
  for (const TokenSpan& s : spans_) v.insert(v.end(), s.data, s.data + s.size);
  return v;
}

bool reads_as_shards(const std::string& path, const std::string& format) {
  if (format == "shards") return true;
  if (format == "text") return false;
  const size_t n = path.size();
  return is_glob(path) || (n > 4 && path.compare(n - 4, 4, ".bin") == 0);
}

namespace {

// The vocabulary tokens are checked against: 256 for bytes; for gpt2 the vocabulary of
// data.tokenizer_dir's encoder.json when it is there (a vocabulary other than GPT-2's, up
// to kMaxTokenVocab tokens, as prepare_data accepts), else GPT-2's 50257.
int tokenizer_vocab(const DataSpec& spec) {
  if (spec.tokenizer == "byte") return 256;
  if (spec.tokenizer != "gpt2")
    fail("data.tokenizer: expected byte or gpt2, got '", excerpt(spec.tokenizer), "'");
  const std::string dir = spec.tokenizer_dir.empty() ? "." : spec.tokenizer_dir;
  std::error_code ec;
  if (!fs::is_regular_file(dir + "/encoder.json", ec)) return kGpt2VocabSize;
  const int v = Gpt2Tokenizer(dir).vocab_size();
  check_token_vocab(v, "data.tokenizer_dir: " + dir + "/encoder.json");
  return v;
}

// Every shard matching `pattern`, checked against the vocabulary.
std::string load_shards(TokenSet& set, const std::string& pattern, int vocab, const char* key) {
  const std::vector<std::string> files = glob_files(pattern);
  if (files.empty())
    fail(key, ": no token shard matches '", pattern, "' (write shards with prepare_data, or set "
         "data.prepare_from to a text file to prepare them from)");
  for (const std::string& f : files) {
    const TokenShard s = TokenShard::open(f, vocab, key);
    set.add(s.tokens(), s.size(), s.owner());
  }
  return std::to_string(files.size()) + " shard(s)";
}

void prepare_missing(const DataSpec& spec, const std::function<void(const std::string&)>& log) {
  const bool train_missing = glob_files(spec.train_path).empty();
  const bool val_missing = !spec.val_path.empty() && glob_files(spec.val_path).empty();
  if (!train_missing && !val_missing) return;
  if (spec.val_path.empty() || !reads_as_shards(spec.val_path, spec.format))
    fail("data.prepare_from needs data.val_path to name the validation shards to write "
         "(e.g. data_cache/x_val_*.bin)");
  PrepareOptions o;
  o.inputs = {spec.prepare_from};
  o.input_what = "data.prepare_from";
  o.tokenizer = spec.tokenizer;
  o.tokenizer_dir = spec.tokenizer_dir;
  o.val_fraction = spec.val_fraction;
  o.train_pattern = spec.train_path;
  o.val_pattern = spec.val_path;
  o.overwrite = true;  // the config's own outputs: a partial set is rewritten whole
  if (log) log("preparing " + spec.train_path + " and " + spec.val_path + " from " + spec.prepare_from);
  const PrepareSummary s = prepare_shards(o);
  if (log) {
    std::istringstream lines(s.text());
    for (std::string l; std::getline(lines, l);) log(l);
  }
}

}  // namespace

TokenData load_token_data(const DataSpec& spec, const std::function<void(const std::string&)>& log) {
  TokenData d;
  d.tokenizer = spec.tokenizer;
  if (spec.tokenizer != "byte" && spec.tokenizer != "gpt2")
    fail("data.tokenizer: expected byte or gpt2, got '", excerpt(spec.tokenizer), "'");
  const bool train_shards = reads_as_shards(spec.train_path, spec.format);
  if (!spec.prepare_from.empty()) {
    if (!train_shards)
      fail("data.prepare_from is set but data.train_path '", spec.train_path, "' is not a shard "
           "path (name the shards to write, e.g. data_cache/x_train_*.bin)");
    prepare_missing(spec, log);
  }
  if (train_shards) {
    if (spec.val_path.empty())
      fail("data.val_path: token shards need their own validation shards (set data.val_path, "
           "e.g. to the _val_ shards prepare_data wrote)");
    d.vocab_size = tokenizer_vocab(spec);
    const std::string tr = load_shards(d.train, spec.train_path, d.vocab_size, "data.train_path");
    std::string va;
    if (reads_as_shards(spec.val_path, spec.format)) {
      va = load_shards(d.val, spec.val_path, d.vocab_size, "data.val_path");
    } else {
      fail("data.val_path: '", spec.val_path, "' is a text file but data.train_path holds token "
           "shards; give both as shards (prepare_data writes both)");
    }
    d.description = spec.train_path + " (" + tr + "): " + std::to_string(d.train.size()) +
                    " train / " + std::to_string(d.val.size()) + " val tokens (" +
                    spec.tokenizer + ")";
    return d;
  }
  PrepareOptions o;
  o.inputs = {spec.train_path};
  o.input_what = "data.train_path";
  o.val_what = "data.val_path";
  if (!spec.val_path.empty()) o.val_inputs = {spec.val_path};
  o.tokenizer = spec.tokenizer;
  o.tokenizer_dir = spec.tokenizer_dir;
  o.val_fraction = spec.val_fraction;
  std::vector<uint16_t> train, val;
  const PrepareSummary s = tokenize_texts(o, train, val);
  d.vocab_size = s.vocab_size;  // the tokenizer's, checked against the token format
  d.train.add(std::move(train));
  d.val.add(std::move(val));
  char bpt[32];
  std::snprintf(bpt, sizeof bpt, "%.3f", s.train_tokens ? double(s.train_bytes) / s.train_tokens : 0.0);
  d.description = spec.train_path + ": " + std::to_string(d.train.size()) + " train / " +
                  std::to_string(d.val.size()) + " val tokens (" + spec.tokenizer + ", " + bpt +
                  " bytes/token" +
                  (s.invalid_utf8_bytes ? ", " + std::to_string(s.invalid_utf8_bytes) +
                                              " bytes not valid UTF-8, kept as bytes"
                                        : "") +
                  ")";
  return d;
}

std::string decode_bytes(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) s.push_back(static_cast<char>(t & 0xff));
  return s;
}

}  // namespace st
