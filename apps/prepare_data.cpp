// prepare_data: text files -> llm.c token shards (data/prepare.h has the rules).
//   prepare_data --input FILE [--input FILE...] --output DIR [--name NAME]
//                [--tokenizer gpt2|byte] [--tokenizer-dir DIR] [--val-fraction 0.1]
//                [--val-input FILE...] [--doc-separator '\n\n'] [--shard-tokens N] [--overwrite]
// Writes DIR/NAME_train_000000.bin ... and DIR/NAME_val_000000.bin ..., prints a summary.
// User-facing: every error is one line on stderr and a non-zero exit.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <new>
#include <filesystem>

#include "data/prepare.h"

namespace {

// "\n", "\t", "\r", "\\" written on a command line become the characters.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// A progress bar on stderr: redrawn in place on a terminal, a line per 10% otherwise.
class Progress {
 public:
  explicit Progress(bool tty) : tty_(tty) {}
  void operator()(int64_t done, int64_t total) {
    if (done == 0) {  // the start, after the vocabulary is loaded
      t0_ = std::chrono::steady_clock::now();
      return;
    }
    const int pct = total > 0 ? static_cast<int>(100 * done / total) : 100;
    if (pct == last_ || (!tty_ && pct / 10 == last_ / 10 && pct != 100)) return;
    last_ = pct;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    char bar[41];
    for (int i = 0; i < 40; ++i) bar[i] = i < pct * 40 / 100 ? '#' : '.';
    bar[40] = 0;
    std::fprintf(stderr, "%s[%s] %3d%% %.1f/%.1f MB %.1f MB/s%s", tty_ ? "\r" : "", bar, pct,
                 done / 1e6, total / 1e6, s > 0 ? done / s / 1e6 : 0.0,
                 tty_ && pct < 100 ? "" : "\n");
  }

 private:
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
  int last_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"prepare_data: tokenize text files into llm.c token shards (train/val)"};
  st::PrepareOptions o;
  std::string out_dir, name, sep;
  bool progress = false, quiet = false;
  app.add_option("--input", o.inputs, "text file(s); each is a document")->required();
  app.add_option("--val-input", o.val_inputs,
                 "validation text file(s); default: the last --val-fraction of the inputs");
  app.add_option("--output", out_dir, "folder for the shards")->required();
  app.add_option("--name", name, "shard name prefix (default: the first input's stem)");
  app.add_option("--tokenizer", o.tokenizer, "gpt2 (BPE, with <|endoftext|> before each "
                 "document) or byte (token = byte)")
      ->check(CLI::IsMember({"gpt2", "byte"}));
  o.tokenizer_dir = "../shared/data/gpt2-tokenizer";
  app.add_option("--tokenizer-dir", o.tokenizer_dir, "folder with encoder.json and vocab.bpe")
      ->capture_default_str();
  app.add_option("--val-fraction", o.val_fraction, "share of the input bytes held out (0: none)")
      ->capture_default_str();
  app.add_option("--doc-separator", sep,
                 "also cut documents after this string (escapes \\n \\t; llm.c uses '\\n\\n')");
  app.add_option("--shard-tokens", o.shard_tokens, "tokens per shard")->capture_default_str();
  app.add_flag("--overwrite", o.overwrite, "replace existing shards of the same name");
  app.add_flag("--progress", progress, "progress bar even on small inputs");
  app.add_flag("--quiet", quiet, "no progress bar");
  CLI11_PARSE(app, argc, argv);
  try {
    namespace fs = std::filesystem;
    if (name.empty()) name = fs::path(o.inputs.front()).stem().string();
    const std::string base = (fs::path(out_dir) / name).string();
    o.train_pattern = base + "_train_*.bin";
    o.val_pattern = o.val_fraction > 0 || !o.val_inputs.empty() ? base + "_val_*.bin" : "";
    o.doc_separator = unescape(sep);
    int64_t total = 0;
    for (const auto& p : o.inputs) {
      std::error_code ec;
      total += static_cast<int64_t>(fs::file_size(p, ec));
    }
    Progress bar(isatty(2));
    if (!quiet && (progress || total >= (int64_t(16) << 20)))
      o.progress = [&bar](int64_t d, int64_t t) { bar(d, t); };
    const st::PrepareSummary s = st::prepare_shards(o);
    std::fputs(s.text().c_str(), stdout);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "prepare_data: error: out of memory while tokenizing (free memory, or"
                         " split the input into smaller files)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "prepare_data: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
