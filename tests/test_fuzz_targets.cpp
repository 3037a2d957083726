// The fuzzer's targets: each parser under test (checkpoints, config YAML, llm.c and
// safetensors weights, tokenizer files, token shards, the run files `report` reads, the
// stability hooks' resume, `compare` as a subprocess), with its integer fields for the
// field-overwrite mutation and its fix-up after mutating. The loop: test_fuzz.cpp.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/error.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "fuzz_harness.h"
#include "io/checkpoint.h"
#include "io/weights.h"
#include "model/gpt2.h"
#include "test_util.h"
#include "apps/report/html_report.h"
#include "apps/report/run_data.h"
#include "apps/report/text_report.h"
#include "train/config.h"
#include "train/hooks.h"

namespace fs = std::filesystem;

namespace st {
using namespace fuzz;
namespace {

std::vector<uint8_t> hex_bytes(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

// The checkpoint trailer (payload length, SHA-256) recomputed for the bytes before it.
void fix_checkpoint_trailer(std::string& c) {
  if (c.size() < 52) return;
  const uint64_t payload = c.size() - 40;
  std::memcpy(&c[payload], &payload, 8);
  const auto h = hex_bytes(sha256_hex(c.data(), c.size() - 32));
  std::memcpy(&c[c.size() - 32], h.data(), 32);
}

// Offsets of the values of the checkpoint's i32/i64 records (walks the records while they
// parse).
std::vector<std::pair<size_t, int>> checkpoint_int_fields(const std::string& c) {
  std::vector<std::pair<size_t, int>> f = {{8, 4}};  // version
  size_t p = 12;
  while (p + 2 <= c.size() && c.size() >= 40 && p < c.size() - 40) {
    uint16_t nl;
    std::memcpy(&nl, &c[p], 2);
    const size_t tp = p + 2 + nl;
    if (tp + 9 > c.size()) break;
    const uint8_t type = uint8_t(c[tp]);
    uint64_t vl;
    std::memcpy(&vl, &c[tp + 1], 8);
    f.push_back({tp + 1, 8});  // the value length itself
    if (type == 1) f.push_back({tp + 9, 4});
    if (type == 2) f.push_back({tp + 9, 8});
    if (vl > c.size()) break;
    p = tp + 9 + vl;
  }
  if (c.size() >= 40) f.push_back({c.size() - 40, 8});  // payload length
  return f;
}

std::vector<std::pair<size_t, int>> header_int32s(int count) {
  std::vector<std::pair<size_t, int>> f;
  for (int i = 0; i < count; ++i) f.push_back({size_t(4 * i), 4});
  return f;
}

const char* const kCompareBin = ST_COMPARE_BIN;

// Runs `compare A B -o OUT` on a mutated run A against the unmutated first seed as run B:
// exit status 0, 1 or 2 with a message is fine; a signal (an uncaught exception aborts) or
// a hang is not.
void run_compare(const fs::path& dir) {
  const fs::path ref = dir.parent_path() / "compare_ref";
  if (!fs::exists(ref)) {
    const auto seeds = read_entries(fs::path(ST_FUZZ_CORPUS_DIR) / "compare");
    write_bundle(ref, seeds.at(0).second);
  }
  const fs::path out = dir.parent_path() / "compare_out";
  fs::create_directories(out);
  const std::string log = (out / "stderr.txt").string();
  const std::string cmd = "timeout -s KILL 30 " + std::string(kCompareBin) + " '" + dir.string() +
                          "' '" + ref.string() + "' -o '" + (out / "c.csv").string() +
                          "' >/dev/null 2>'" + log + "'";
  const int st = std::system(cmd.c_str());
  // Under tools/sanitize.sh a sanitizer's report ends compare with exit status 1 too.
  const std::string err_text = test::slurp(log);
  const bool sanitizer = err_text.find("Sanitizer") != std::string::npos ||
                         err_text.find("runtime error:") != std::string::npos;
  if (WIFEXITED(st) && WEXITSTATUS(st) <= 2 && !sanitizer) return;
  std::string why = WIFEXITED(st) ? "exit status " + std::to_string(WEXITSTATUS(st))
                                  : "signal " + std::to_string(WTERMSIG(st));
  if (WIFEXITED(st) && WEXITSTATUS(st) == 137) why = "killed after 30 s (hang)";
  std::string err = err_text;
  if (sanitizer) why = "a sanitizer report";
  if (err.size() > 400) err = err.substr(0, 400) + "...";
  throw std::logic_error("compare " + why + ": " + err);
}

// The stability hooks of a tiny model resuming in a run directory: the hook CSVs and
// events.jsonl cut back to the checkpoint's step (truncate_after), the checkpoint's
// hooks_state blob, and hooks.reference_run's config.yaml (check_reference_run).
std::string hooks_yaml(const fs::path& ref) {
  std::string y = kTinyYaml;
  const std::string h = "hooks:\n";
  return y.insert(y.find(h) + h.size(), "  reference_run: " + ref.string() + "\n");
}
}  // namespace

namespace fuzz {

std::unique_ptr<StabilityHooks> tiny_hooks(const fs::path& dir, const fs::path& ref) {
  static std::unique_ptr<Backend> be = make_cpu_backend(1);
  static GPT2 model(tiny_model(), *be, DType::F32);
  const Config cfg = parse_config(hooks_yaml(ref), "fuzz hooks config");
  return std::make_unique<StabilityHooks>(cfg, model, dir.string(),
                                          std::make_shared<spdlog::logger>("fuzz"));
}

}  // namespace fuzz

namespace {

void run_hooks(const fs::path& dir) {
  const fs::path ref = dir / "ref";
  fs::create_directories(ref);
  if (fs::exists(dir / "ref_config.yaml"))
    fs::copy_file(dir / "ref_config.yaml", ref / "config.yaml", fs::copy_options::overwrite_existing);
  const std::string st = test::slurp(dir / "hooks_state.bin");
  auto h = tiny_hooks(dir, ref);
  h->resume(4, std::vector<uint8_t>(st.begin(), st.end()));
  (void)h->state();
}

}  // namespace

namespace fuzz {

std::vector<Target> targets() {
  std::vector<Target> t;
  t.push_back({"checkpoint",
               [](const std::string&, const std::string& b) { return checkpoint_int_fields(b); },
               [](Bundle& b, Mutator& m) {
                 // Half the cases: the trailer recomputed, so the records are parsed (else
                 // every mutation is a checksum mismatch).
                 if (m.below(2)) {
                   for (auto& [name, bytes] : b) fix_checkpoint_trailer(bytes);
                   m.log += "trailer fixed; ";
                 }
               },
               [](const fs::path& dir) {
                 for (const auto& e : fs::directory_iterator(dir)) {
                   const CheckpointState s = load_checkpoint(e.path().string());
                   if (s.shard_rank < 0) (void)weights_from_checkpoint(s, e.path().string());
                 }
               }});
  t.push_back({"config", nullptr, nullptr, [](const fs::path& dir) {
                 const Config c = load_config((dir / "config.yaml").string());
                 (void)parse_config(config_to_yaml(c), "round trip");
                 (void)model_config(c);
                 (void)attention_configs(c);  // layer_backends, fp32_out_heads
               }});
  t.push_back({"llmc", [](const std::string&, const std::string&) { return header_int32s(8); },
               nullptr, [](const fs::path& dir) { (void)load_llmc((dir / "model.bin").string()); }});
  t.push_back({"safetensors",
               [](const std::string&, const std::string&) {
                 return std::vector<std::pair<size_t, int>>{{0, 8}, {0, 4}, {4, 4}};
               },
               nullptr,
               [](const fs::path& dir) {
                 (void)load_safetensors((dir / "model.safetensors").string(), 0);
               }});
  t.push_back({"tokenizer", nullptr, nullptr, [](const fs::path& dir) {
                 Gpt2Tokenizer tok((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
                 const std::vector<int32_t> ids = tok.encode("the theme then, the other");
                 (void)tok.decode(ids);
               }});
  t.push_back({"shards", [](const std::string&, const std::string&) { return header_int32s(4); },
               nullptr, [](const fs::path& dir) {
                 const TokenShard s = TokenShard::open((dir / "shard.bin").string(), 300, "fuzz");
                 int64_t sum = 0;
                 for (int64_t i = 0; i < s.size(); ++i) sum += s.tokens()[i];
                 if (sum < 0) throw std::logic_error("impossible");
               }});
  t.push_back({"report", nullptr, nullptr, [](const fs::path& dir) {
                 const report::RunData r = report::load_run(dir.string());
                 try {
                   (void)report::text_report(r, "wq", 5);
                 } catch (const Error&) {
                 }
                 report::HtmlOptions opt;
                 opt.compare_checkpoints = false;
                 (void)report::html_report({r}, opt, nullptr);
               }});
  t.push_back({"hooks",
               [](const std::string& file, const std::string& b) {
                 std::vector<std::pair<size_t, int>> f;
                 if (file == "hooks_state.bin")  // the header and the first vectors' lengths
                   for (size_t o = 0; o + 8 <= std::min<size_t>(b.size(), 64); o += 8) f.push_back({o, 8});
                 return f;
               },
               nullptr, run_hooks});
  t.push_back({"compare", nullptr, nullptr, run_compare, 3});
  return t;
}

}  // namespace fuzz
}  // namespace st
