#include "data/prepare.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;

namespace st {
namespace {

class Sink {
 public:
  virtual ~Sink() = default;
  virtual void put(const int32_t* t, size_t n) = 0;
  int64_t count = 0;
};

class MemorySink : public Sink {
 public:
  explicit MemorySink(std::vector<uint16_t>& v) : v_(v) {}
  void put(const int32_t* t, size_t n) override {
    for (size_t i = 0; i < n; ++i) v_.push_back(static_cast<uint16_t>(t[i]));
    count += static_cast<int64_t>(n);
  }

 private:
  std::vector<uint16_t>& v_;
};

class ShardSink : public Sink {
 public:
  ShardSink(std::string pattern, int64_t per_shard) : pattern_(std::move(pattern)), per_(per_shard) {}
  void put(const int32_t* t, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      buf_.push_back(static_cast<uint16_t>(t[i]));
      if (static_cast<int64_t>(buf_.size()) == per_) flush();
    }
    count += static_cast<int64_t>(n);
  }
  void finish() {
    if (!buf_.empty() || written.empty()) flush();
  }
  std::vector<std::string> written;

 private:
  void flush() {
    const std::string name = shard_name(pattern_, static_cast<int>(written.size()));
    write_token_shard(name, buf_.data(), static_cast<int64_t>(buf_.size()));
    written.push_back(name);
    buf_.clear();
  }
  std::string pattern_;
  int64_t per_;
  std::vector<uint16_t> buf_;
};

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(what, ": cannot read '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail(what, ": read error on '", path, "'");
  return ss.str();
}

// Cuts that cannot change GPT-2's pre-tokenization: just after a '\n' that sits between two
// ASCII non-space characters ("x\ny"). No pattern alternative matches across it: the '\n'
// cannot join the piece before it (a non-space run), nor the one after it (a lone
// whitespace character followed by a non-space is a piece of its own).
size_t safe_cut(std::string_view t, size_t from) {
  auto solid = [](unsigned char c) {
    return c < 0x80 && c > ' ' && c != 0x7f;  // ASCII, not whitespace or control
  };
  for (size_t i = std::max<size_t>(from, 1); i + 1 < t.size(); ++i) {
    const void* nl = std::memchr(t.data() + i, '\n', t.size() - 1 - i);
    if (!nl) break;
    i = static_cast<const char*>(nl) - t.data();
    if (solid(t[i - 1]) && solid(t[i + 1])) return i + 1;
  }
  return t.size();
}

class Preparer {
 public:
  explicit Preparer(const PrepareOptions& o) : o_(o) {
    if (o.tokenizer == "gpt2") {
      tok_ = std::make_unique<Gpt2Tokenizer>(o.tokenizer_dir);
      sum_.vocab_size = tok_->vocab_size();
      // Before any token is written: a larger id would wrap silently in a uint16.
      const std::string dir = o.tokenizer_dir.empty() ? "." : o.tokenizer_dir;
      check_token_vocab(sum_.vocab_size, dir + "/encoder.json");
    } else if (o.tokenizer == "byte") {
      sum_.vocab_size = 256;
    } else {
      fail("--tokenizer: expected gpt2 or byte, got '", o.tokenizer, "'");
    }
    sum_.tokenizer = o.tokenizer;
    if (o.inputs.empty()) fail("--input: no input text files given");
    if (!(o.val_fraction >= 0 && o.val_fraction < 1))
      fail("--val-fraction: ", o.val_fraction, " is outside [0, 1)");
  }

  PrepareSummary run(Sink& train, Sink& val) {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t total = 0;
    for (const auto* list : {&o_.inputs, &o_.val_inputs})
      for (const std::string& p : *list) {
        std::error_code ec;
        const auto sz = fs::file_size(p, ec);
        if (ec)
          fail(list == &o_.inputs ? o_.input_what : o_.val_what, ": cannot read '", p, "': ",
               ec.message());
        total += static_cast<int64_t>(sz);
      }
    total_ = total;
    if (o_.progress) o_.progress(0, total_);
    int64_t stream = 0;  // bytes of the train inputs
    for (const std::string& p : o_.inputs) stream += static_cast<int64_t>(fs::file_size(p));
    const int64_t split =
        o_.val_inputs.empty() ? stream - static_cast<int64_t>(stream * o_.val_fraction) : stream;
    int64_t offset = 0;
    for (const std::string& p : o_.inputs) {
      const std::string text = read_text(p, o_.input_what);
      ++sum_.input_files;
      for (std::string_view doc : documents(text)) {
        sum_.documents += !doc.empty();
        const int64_t d0 = offset, d1 = offset + static_cast<int64_t>(doc.size());
        offset = d1;
        if (split > d0 && split < d1) {
          size_t cut = static_cast<size_t>(split - d0);
          while (tok_ && cut < doc.size() && (static_cast<unsigned char>(doc[cut]) & 0xc0) == 0x80) ++cut;
          emit(doc.substr(0, cut), train, sum_.train_bytes);
          emit(doc.substr(cut), val, sum_.val_bytes);
        } else {
          emit(doc, d0 < split ? train : val, d0 < split ? sum_.train_bytes : sum_.val_bytes);
        }
      }
    }
    for (const std::string& p : o_.val_inputs) {
      const std::string text = read_text(p, o_.val_what);
      ++sum_.input_files;
      for (std::string_view doc : documents(text)) {
        sum_.documents += !doc.empty();
        emit(doc, val, sum_.val_bytes);
      }
    }
    sum_.input_bytes = total;
    sum_.train_tokens = train.count;
    sum_.val_tokens = val.count;
    if (sum_.train_tokens == 0)
      fail(o_.input_what, ": the training split holds no tokens (empty input?)");
    sum_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return sum_;
  }

 private:
  std::vector<std::string_view> documents(std::string_view text) const {
    std::vector<std::string_view> docs;
    const std::string& sep = o_.doc_separator;
    size_t start = 0;
    if (!sep.empty())
      for (size_t at; (at = text.find(sep, start)) != std::string_view::npos;) {
        docs.push_back(text.substr(start, at + sep.size() - start));
        start = at + sep.size();
      }
    if (start < text.size() || docs.empty()) docs.push_back(text.substr(start));
    return docs;
  }

  void emit(std::string_view doc, Sink& sink, int64_t& bytes) {
    if (doc.empty()) return;
    bytes += static_cast<int64_t>(doc.size());
    sum_.invalid_utf8_bytes += invalid_utf8_bytes(doc);
    if (!tok_) {
      for (size_t i = 0; i < doc.size();) {  // in slices, for the progress callback
        const size_t n = std::min<size_t>(doc.size() - i, 1 << 20);
        ids_.resize(n);
        for (size_t k = 0; k < n; ++k) ids_[k] = static_cast<unsigned char>(doc[i + k]);
        sink.put(ids_.data(), n);
        advance(n);
        i += n;
      }
      return;
    }
    const int32_t eot = tok_->eot();
    sink.put(&eot, 1);
    for (size_t i = 0; i < doc.size();) {
      const size_t j = safe_cut(doc, i + (1 << 20));
      ids_.clear();
      tok_->encode(doc.substr(i, j - i), ids_);
      sink.put(ids_.data(), ids_.size());
      advance(j - i);
      i = j;
    }
  }

  void advance(size_t n) {
    done_ += static_cast<int64_t>(n);
    if (o_.progress) o_.progress(done_, total_);
  }

  const PrepareOptions& o_;
  std::unique_ptr<Gpt2Tokenizer> tok_;
  PrepareSummary sum_;
  std::vector<int32_t> ids_;
  int64_t done_ = 0, total_ = 0;
};

void remove_outputs(const std::string& pattern, bool overwrite) {
  for (const std::string& f : glob_files(pattern)) {
    if (!overwrite)
      fail("output '", f, "' already exists (pass --overwrite to replace the shards matching '",
           pattern, "')");
    fs::remove(f);
  }
}

}  // namespace

std::string PrepareSummary::text() const {
  std::ostringstream os;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "input:      %lld file(s), %lld bytes, %lld document(s)%s\n"
                "tokenizer:  %s (vocabulary %d)\n",
                (long long)input_files, (long long)input_bytes, (long long)documents,
                invalid_utf8_bytes ? "" : ", valid UTF-8", tokenizer.c_str(), vocab_size);
  os << buf;
  if (invalid_utf8_bytes)
    os << "warning:    " << invalid_utf8_bytes
       << " byte(s) are not valid UTF-8; each was tokenized as itself (lossless)\n";
  auto split = [&](const char* name, int64_t tokens, int64_t bytes,
                   const std::vector<std::string>& shards) {
    std::snprintf(buf, sizeof buf, "%-11s %lld tokens from %lld bytes (%.3f bytes/token)",
                  name, (long long)tokens, (long long)bytes,
                  tokens ? double(bytes) / double(tokens) : 0.0);
    os << buf;
    if (!shards.empty())
      os << ", " << shards.size() << " shard(s): " << shards.front()
         << (shards.size() > 1 ? " ... " + shards.back() : "");
    os << "\n";
  };
  split("train:", train_tokens, train_bytes, train_shards);
  if (val_tokens > 0 || !val_shards.empty()) split("val:", val_tokens, val_bytes, val_shards);
  std::snprintf(buf, sizeof buf, "time:       %.2f s (%.2f MB/s)\n", seconds,
                seconds > 0 ? input_bytes / seconds / 1e6 : 0.0);
  os << buf;
  return os.str();
}

PrepareSummary prepare_shards(const PrepareOptions& o) {
  if (o.train_pattern.empty()) fail("prepare: no output path for the training shards");
  if (o.val_pattern.empty() && (o.val_fraction > 0 || !o.val_inputs.empty()))
    fail("prepare: no output path for the validation shards");
  if (o.shard_tokens < 1 || o.shard_tokens > kShardMaxTokens)
    fail("--shard-tokens: ", o.shard_tokens, " is outside [1, ", kShardMaxTokens, "]");
  Preparer p(o);  // loads the tokenizer: its errors come before anything is deleted
  remove_outputs(o.train_pattern, o.overwrite);
  if (!o.val_pattern.empty()) remove_outputs(o.val_pattern, o.overwrite);
  ShardSink train(o.train_pattern, o.shard_tokens);
  ShardSink val(o.val_pattern, o.shard_tokens);
  PrepareSummary s = p.run(train, val);
  train.finish();
  if (!o.val_pattern.empty()) val.finish();
  s.train_shards = train.written;
  s.val_shards = val.written;
  return s;
}

PrepareSummary tokenize_texts(const PrepareOptions& o, std::vector<uint16_t>& train,
                              std::vector<uint16_t>& val) {
  Preparer p(o);
  MemorySink ts(train), vs(val);
  return p.run(ts, vs);
}

}  // namespace st
