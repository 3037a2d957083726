// bench tokenizer: GPT-2 BPE throughput (MB/s of UTF-8 input) on a text file, against the
// npm package gpt-3-encoder run with node when it is installed (test_tokenizer_node puts it
// in build/npm). Cold: a fresh tokenizer (empty piece cache); warm: the same text again.
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"

namespace st {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int run_tokenizer_bench(const std::string& input, const std::string& vocab_dir,
                        const std::string& node_pkg, const std::string& node_script, int reps) {
  std::ifstream f(input, std::ios::binary);
  if (!f) fail("bench tokenizer: cannot read '", input, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const double mb = text.size() / 1e6;
  auto t0 = std::chrono::steady_clock::now();
  Gpt2Tokenizer tok(vocab_dir);
  const double load_s = seconds_since(t0);
  std::vector<int32_t> ids;
  t0 = std::chrono::steady_clock::now();
  tok.encode(text, ids);
  const double cold = seconds_since(t0);
  std::vector<double> warm, pre, dec;
  std::vector<std::string_view> pieces;
  for (int r = 0; r < reps; ++r) {
    std::vector<int32_t> again;
    t0 = std::chrono::steady_clock::now();
    tok.encode(text, again);
    warm.push_back(seconds_since(t0));
    ST_CHECK(again == ids, "bench tokenizer: a warm encode differs from the cold one");
    pieces.clear();
    t0 = std::chrono::steady_clock::now();
    gpt2_pretokenize(text, pieces);
    pre.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    const std::string back = tok.decode(ids);
    dec.push_back(seconds_since(t0));
    ST_CHECK(back == text, "bench tokenizer: decode(encode(text)) != text");
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double node_cold = 0, node_warm = 0;
  if (!node_pkg.empty()) {
    const std::string cmd = "node '" + node_script + "' '" + node_pkg + "' bench '" + input + "' 2>/dev/null";
    if (FILE* p = popen(cmd.c_str(), "r")) {
      if (std::fscanf(p, "%lf %lf", &node_cold, &node_warm) != 2) node_cold = node_warm = 0;
      pclose(p);
    }
  }
  std::printf("GPT-2 BPE on %s: %zu bytes -> %zu tokens (%.3f bytes/token); vocabulary load %.3f s\n",
              input.c_str(), text.size(), ids.size(), double(text.size()) / ids.size(), load_s);
  std::printf("%-28s %10s %22s %8s\n", "measurement", "MB/s", "comparison MB/s", "ratio");
  auto row = [&](const char* name, double s, const char* cname, double cs) {
    if (cs > 0)
      std::printf("%-28s %10.2f %14s %7.2f %8.2f\n", name, mb / s, cname, mb / cs, cs / s);
    else
      std::printf("%-28s %10.2f %22s %8s\n", name, mb / s, "-", "-");
  };
  row("encode, cold cache", cold, "node cold", node_cold / 1e3);
  row("encode, warm cache", med(warm), "node warm", node_warm / 1e3);
  row("pre-tokenize only", med(pre), "", 0);
  row("decode", med(dec), "", 0);
  if (node_pkg.empty()) std::printf("(no node comparison: gpt-3-encoder not installed; run test_tokenizer_node once)\n");
  return 0;
}

}  // namespace st
