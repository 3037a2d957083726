// Seeded mutation fuzzing of every file parser (issue 19): checkpoints, config YAML, llm.c
// and safetensors weights, the GPT-2 tokenizer files, token shards, the run files `report`
// reads (metrics.jsonl, the hook CSVs, events.jsonl, config.yaml) and `compare`'s
// metrics.jsonl reader (the tool's own code: run as a subprocess).
//
// A case is a seed from tests/fuzz/corpus/<target>/<entry>/ (one folder per seed: the files
// the parser reads), mutated by 1-4 operations drawn from a generator seeded by (target,
// case index) alone: bit flips, bytes set to 0/0x7F/0x80/0xFF, truncation, chunk
// duplication and deletion, integer fields overwritten with extremes (binary at the
// format's field offsets or anywhere; decimal numbers in text), random runs, splices with
// another seed. The parser must load the result or throw st::Error: any other exception
// (std::bad_alloc, std::out_of_range from stoi, ...), a crash or a hang fails the case.
//
// Each target runs in a forked child, under RLIMIT_AS 4 GiB (not under ASan, whose shadow
// memory needs more; there allocator_may_return_null makes a huge allocation a bad_alloc)
// and a per-case alarm (STABLETRAIN_FUZZ_CASE_S, default 20 s). Every case's input is
// written to FUZZ_OUT/<target>/case/ before it runs; a failing one is copied to
// FUZZ_OUT/<target>/fail_case<N>/ and the path printed (FUZZ_OUT: build-dir/fuzz_out).
//
//   STABLETRAIN_FUZZ_ITERS=N       cases per target (default 300; compare: N/3, min 20)
//   STABLETRAIN_FUZZ_CASE=N        run case N only (reproduce a printed failure)
//   STABLETRAIN_FUZZ_FIRST=N       start at case N (continue after a crash)
//   STABLETRAIN_FUZZ_KEEP_GOING=1  record every distinct exception symptom, don't stop at
//                                  the first (crashes and hangs still end the target)
//   STABLETRAIN_FUZZ_CASE_S=S      per-case time limit
//
// tests/fuzz/findings/<target>/<name>/ hold reproducers of defects the fuzzer found; they
// are replayed before the mutation loop. The seed corpus is written by
//   build/bin/test_fuzz --gtest_also_run_disabled_tests --gtest_filter='*WriteCorpus'
// (into the source tree's tests/fuzz/corpus/).
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <typeinfo>
#include <vector>

#include "backends/backends.h"
#include "core/error.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "model/gpt2.h"
#include "io/weights.h"
#include "test_util.h"
#include "apps/report/html_report.h"
#include "apps/report/run_data.h"
#include "apps/report/text_report.h"
#include "core/rng.h"
#include "data/loader.h"
#include "io/checkpoint.h"
#include "train/config.h"
#include "train/hooks.h"
#include "train/trainer.h"

#if defined(__SANITIZE_ADDRESS__)
#define ST_FUZZ_ASAN 1
// A size read from a damaged file must not abort the process in ASan's allocator: return
// null (std::bad_alloc, which the fuzzer reports) for anything over 4 GiB. (Read only where
// the executable exports it; tools/sanitize.sh sets allocator_may_return_null=1 as well.)
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1:max_allocation_size_mb=4096";
}
#else
#define ST_FUZZ_ASAN 0
#endif

namespace fs = std::filesystem;

namespace st {
namespace {

// Targets with open defects found by this fuzzer (tests/fuzz/findings/<target>/): their
// default-suite test expects a failure and fails when none shows (then remove the target
// here). Emptied when issue 19's fixes land.
const std::set<std::string> kKnownOpen = {};

using Bundle = std::map<std::string, std::string>;  // file name -> bytes

Bundle read_bundle(const fs::path& dir) {
  Bundle b;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) b[e.path().filename().string()] = test::slurp(e.path());
  return b;
}
void write_bundle(const fs::path& dir, const Bundle& b) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  for (const auto& [name, bytes] : b) {
    std::ofstream f(dir / name, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw std::runtime_error("fuzz: cannot write " + (dir / name).string());
  }
}
std::vector<std::pair<std::string, Bundle>> read_entries(const fs::path& dir) {
  std::vector<std::pair<std::string, Bundle>> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) out.emplace_back(e.path().filename().string(), read_bundle(e.path()));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : dflt;
}

// ---- mutations -------------------------------------------------------------------------

struct Mutator {
  std::mt19937_64 g;
  std::string log;  // the operations applied, for the failure message
  uint64_t below(uint64_t n) { return n ? g() % n : 0; }

  static constexpr uint8_t kBoundaryBytes[] = {0x00, 0xFF, 0x7F, 0x80};
  static constexpr int64_t kExtremes[] = {INT32_MAX, INT32_MIN, -1, int64_t(1) << 31,
                                          INT64_MIN, INT64_MAX, int64_t(1) << 32, 0,
                                          int64_t(1) << 62, UINT32_MAX};
  static constexpr const char* kTextExtremes[] = {
      "2147483647", "2147483648", "-2147483649", "9223372036854775807", "-9223372036854775808",
      "18446744073709551616", "-1", "0", "1e308", "1e999", "-1e999", "nan", "inf",
      "99999999999999999999999999", "0x7fffffff", "-0"};

  // One operation on `s`. int_fields: byte offsets of the format's integer fields
  // (offset, width 4 or 8); other: a second file for splicing.
  void op(std::string& s, const std::vector<std::pair<size_t, int>>& int_fields,
          const std::string& other) {
    const size_t n = s.size();
    char buf[128];
    switch (below(10)) {
      case 0: {  // bit flip
        if (!n) break;
        const size_t i = below(n);
        const int bit = static_cast<int>(below(8));
        s[i] = static_cast<char>(s[i] ^ (1 << bit));
        std::snprintf(buf, sizeof buf, "flip bit %d of byte %zu; ", bit, i);
        break;
      }
      case 1: {  // boundary byte
        if (!n) break;
        const size_t i = below(n);
        const uint8_t v = kBoundaryBytes[below(4)];
        s[i] = static_cast<char>(v);
        std::snprintf(buf, sizeof buf, "byte %zu = 0x%02x; ", i, v);
        break;
      }
      case 2: {  // truncate
        const size_t k = below(n + 1);
        s.resize(k);
        std::snprintf(buf, sizeof buf, "truncate to %zu; ", k);
        break;
      }
      case 3: {  // duplicate a chunk
        if (!n) break;
        const size_t a = below(n), len = 1 + below(std::min<size_t>(n - a, 256)), at = below(n + 1);
        s.insert(at, s.substr(a, len));
        std::snprintf(buf, sizeof buf, "copy [%zu,+%zu) to %zu; ", a, len, at);
        break;
      }
      case 4: {  // delete a chunk
        if (!n) break;
        const size_t a = below(n), len = 1 + below(std::min<size_t>(n - a, 256));
        s.erase(a, len);
        std::snprintf(buf, sizeof buf, "delete [%zu,+%zu); ", a, len);
        break;
      }
      case 5:
      case 6: {  // integer field = extreme (a known field, or any offset)
        const int64_t v = kExtremes[below(std::size(kExtremes))];
        size_t at;
        int w;
        if (!int_fields.empty() && below(3) != 0) {
          std::tie(at, w) = int_fields[below(int_fields.size())];
        } else {
          w = below(2) ? 4 : 8;
          if (n < size_t(w)) break;
          at = below(n - w + 1);
        }
        if (at + w > n) break;
        std::memcpy(&s[at], &v, w);  // little-endian host
        std::snprintf(buf, sizeof buf, "int%d at %zu = %lld; ", w * 8, at, (long long)v);
        break;
      }
      case 7: {  // a decimal number in text = extreme
        std::vector<size_t> starts;
        for (size_t i = 0; i < n; ++i)
          if (std::isdigit(static_cast<unsigned char>(s[i])) &&
              (i == 0 || !std::isdigit(static_cast<unsigned char>(s[i - 1]))))
            starts.push_back(i);
        if (starts.empty()) break;
        const size_t a = starts[below(starts.size())];
        size_t e = a;
        while (e < n && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '.')) ++e;
        const char* t = kTextExtremes[below(std::size(kTextExtremes))];
        s.replace(a, e - a, t);
        std::snprintf(buf, sizeof buf, "number at %zu = %s; ", a, t);
        break;
      }
      case 8: {  // splice: our prefix + the other seed's suffix
        if (other.empty()) break;
        const size_t a = below(n + 1), b = below(other.size() + 1);
        s = s.substr(0, a) + other.substr(b);
        std::snprintf(buf, sizeof buf, "splice [0,%zu) + other[%zu,end); ", a, b);
        break;
      }
      default: {  // random run
        if (!n) break;
        const size_t a = below(n), len = 1 + below(std::min<size_t>(n - a, 16));
        for (size_t i = a; i < a + len; ++i) s[i] = static_cast<char>(g());
        std::snprintf(buf, sizeof buf, "random [%zu,+%zu); ", a, len);
        break;
      }
    }
    log += buf;
  }
};
constexpr uint8_t Mutator::kBoundaryBytes[];
constexpr int64_t Mutator::kExtremes[];
constexpr const char* Mutator::kTextExtremes[];

// ---- targets ---------------------------------------------------------------------------

struct Target {
  std::string name;
  // Integer fields of a file (offset, width), for the field-overwrite mutation.
  std::function<std::vector<std::pair<size_t, int>>(const std::string& file, const std::string& bytes)>
      int_fields;
  // After mutating (e.g. the checkpoint's checksum recomputed so the records are reached).
  std::function<void(Bundle&, Mutator&)> fixup;
  // Parses the case's files in `dir`; throws on a defect.
  std::function<void(const fs::path& dir)> run;
  int iters_div = 1;  // subprocess targets: fewer cases
};

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

GPT2Config tiny_model();
extern const char* const kTinyYaml;

// The stability hooks of a tiny model resuming in a run directory: the hook CSVs and
// events.jsonl cut back to the checkpoint's step (truncate_after), the checkpoint's
// hooks_state blob, and hooks.reference_run's config.yaml (check_reference_run).
std::string hooks_yaml(const fs::path& ref) {
  std::string y = kTinyYaml;
  const std::string h = "hooks:\n";
  return y.insert(y.find(h) + h.size(), "  reference_run: " + ref.string() + "\n");
}
std::unique_ptr<StabilityHooks> tiny_hooks(const fs::path& dir, const fs::path& ref) {
  static std::unique_ptr<Backend> be = make_cpu_backend(1);
  static GPT2 model(tiny_model(), *be, DType::F32);
  const Config cfg = parse_config(hooks_yaml(ref), "fuzz hooks config");
  return std::make_unique<StabilityHooks>(cfg, model, dir.string(),
                                          std::make_shared<spdlog::logger>("fuzz"));
}
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

// ---- the seed corpus -------------------------------------------------------------------

GPT2Config tiny_model() {
  GPT2Config c;
  c.max_seq_len = 8;
  c.vocab_size = 256;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

extern const char* const kTinyYaml;
const char* const kTinyYaml =
    "run:\n  name: fuzz\n  seed: 7\nmodel:\n  n_layer: 1\n  n_head: 2\n  n_embd: 8\n"
    "  max_seq_len: 8\n  vocab_size: 256\ntrain:\n  max_steps: 3\n  batch_size: 2\n  seq_len: 8\n"
    "  lr: 1.0e-3\n  min_lr: 1.0e-4\n  warmup_steps: 1\nhooks:\n  every: 1\n  spike_z: 4.5\n"
    "precision:\n  compute: fp32\ndevice: cpu\n";

std::string bytes_of(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
std::vector<uint8_t> u8(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string saved_checkpoint(const CheckpointState& s, const fs::path& tmp) {
  save_checkpoint(tmp.string(), s);
  return test::slurp(tmp);
}

std::map<std::string, std::vector<std::pair<std::string, Bundle>>> make_corpus(const fs::path& tmp) {
  std::map<std::string, std::vector<std::pair<std::string, Bundle>>> c;
  const GPT2Config mc = [] {
    GPT2Config m = tiny_model();
    m.padded_vocab_size = m.vp();
    return m;
  }();
  const int64_t np = num_parameters(mc);
  std::vector<float> params(np);
  Rng r(5);
  for (auto& p : params) p = static_cast<float>(r.uniform() - 0.5);

  // checkpoint: a single-process FP32 file, an FP64 one, a ZeRO-1 rank file.
  CheckpointState s;
  s.config_yaml = kTinyYaml;
  s.step = 3;
  s.adam_step = 3;
  s.n_layer = mc.n_layer;
  s.n_head = mc.n_head;
  s.n_embd = mc.n_embd;
  s.max_seq_len = mc.max_seq_len;
  s.vocab_size = mc.vocab_size;
  s.padded_vocab_size = mc.vp();
  s.compute = "fp32";
  s.master = u8(bytes_of(params));
  s.m = s.master;
  s.v = s.master;
  s.rng_state = Rng(5).state().to_bytes();
  s.data_state = DataLoader::State{1, 2}.to_bytes();
  s.hooks_state = {1, 0, 0, 0};
  c["checkpoint"].push_back({"fp32", {{"ckpt_00000003.bin", saved_checkpoint(s, tmp / "c.bin")}}});
  {
    CheckpointState d = s;
    d.compute = "fp64";
    d.config_yaml.replace(d.config_yaml.find("compute: fp32"), 13, "compute: fp64");
    d.master_elem_bytes = 8;
    std::vector<double> p64(params.begin(), params.end());
    d.master.assign(reinterpret_cast<const uint8_t*>(p64.data()),
                    reinterpret_cast<const uint8_t*>(p64.data() + p64.size()));
    d.m = d.master;
    d.v = d.master;
    c["checkpoint"].push_back({"fp64", {{"ckpt_00000003.bin", saved_checkpoint(d, tmp / "c.bin")}}});
  }
  {
    CheckpointState z = s;
    z.dist_world = 2;
    z.optim_shards = 2;
    z.shard_rank = 1;
    z.shard_begin = np / 2;
    z.shard_end = np;
    z.master.resize(4 * (np - np / 2));
    z.m = z.master;
    z.v = z.master;
    c["checkpoint"].push_back(
        {"zero1_rank1", {{"ckpt_00000003.rank1.bin", saved_checkpoint(z, tmp / "c.bin")}}});
  }

  // config: the repository's configs and the tiny one.
  for (const char* name : {"tiny_shakespeare_bytes", "gpt2_small"})
    c["config"].push_back(
        {name, {{"config.yaml", test::slurp(fs::path(ST_SOURCE_DIR) / "configs" / (std::string(name) + ".yaml"))}}});
  c["config"].push_back({"tiny", {{"config.yaml", kTinyYaml}}});
  c["config"].push_back(
      {"per_layer", {{"config.yaml", std::string(kTinyYaml) +
                                         "attention:\n  backend: flash\n  block_q: 4\n  block_k: 4\n"
                                         "  layer_backends: \"0:stabilized_flash\"\n"
                                         "  fp32_out_heads: \"0.1,0.0\"\n"
                                         "dist:\n  backend: none\n  timeout_s: 60\n"}}});

  // llm.c and safetensors weights of the tiny model.
  ModelWeights w{mc, params};
  for (bool bf16 : {false, true}) {
    save_llmc((tmp / "m.bin").string(), w, bf16);
    c["llmc"].push_back({bf16 ? "bf16" : "fp32", {{"model.bin", test::slurp(tmp / "m.bin")}}});
  }
  for (const char* dt : {"F32", "BF16"}) {
    save_safetensors((tmp / "m.st").string(), w, dt);
    c["safetensors"].push_back({dt, {{"model.safetensors", test::slurp(tmp / "m.st")}}});
  }

  // tokenizer: the 256 byte tokens, a few merges, <|endoftext|>.
  {
    const auto b2u = gpt2_byte_to_unicode();
    auto key = [&](int b) {
      std::string k;
      const uint32_t cp = b2u[b];
      if (cp < 0x80) k.push_back(static_cast<char>(cp));
      else k += {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
      return k;
    };
    auto esc = [](const std::string& k) {
      std::string o;
      for (char ch : k) {
        if (ch == '"' || ch == '\\') o += '\\';
        o += ch;
      }
      return o;
    };
    std::string enc = "{";
    int id = 0;
    for (int b = 0; b < 256; ++b) enc += (b ? ", \"" : "\"") + esc(key(b)) + "\": " + std::to_string(id++);
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"t", "h"}, {"h", "e"}, {"th", "e"}, {key(' '), "t"}, {key(' ') + "t", "he"},
        {"o", "t"}, {"e", "r"}};
    for (const auto& [a, b] : merges) enc += ", \"" + esc(a + b) + "\": " + std::to_string(id++);
    enc += ", \"<|endoftext|>\": " + std::to_string(id++) + "}";
    std::string bpe = "#version: 0.2\n";
    for (const auto& [a, b] : merges) bpe += a + " " + b + "\n";
    c["tokenizer"].push_back({"mini", {{"encoder.json", enc}, {"vocab.bpe", bpe}}});
  }

  // token shards: 100 tokens, and an empty one.
  {
    std::vector<uint16_t> toks(100);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = uint16_t((i * 37) % 300);
    write_token_shard((tmp / "s.bin").string(), toks.data(), int64_t(toks.size()));
    c["shards"].push_back({"tokens100", {{"shard.bin", test::slurp(tmp / "s.bin")}}});
    write_token_shard((tmp / "s.bin").string(), toks.data(), 0);
    c["shards"].push_back({"empty", {{"shard.bin", test::slurp(tmp / "s.bin")}}});
  }

  // report: a run directory's text files (docs/run_files.md), two short runs.
  for (int v = 0; v < 2; ++v) {
    Bundle b;
    std::string m, spec = "step,layer,head,matrix,sigma,iters,converged\n",
                    attn = "step,layer,head,stat,value\n",
                    drift = "step,layer,head,delta_drift,delta_drift_cum,delta_abs_err,dwq_err_norm,"
                            "dwq_rel_err,dwq_cos_prev\n",
                    grad = "step,tensor,layer,head,norm\n",
                    wass = "step,tensor,layer,head,w1,w1_normalized,max_abs_diff\n", ev;
    for (int step = 1; step <= 4; ++step) {
      const double loss = 4.5 - 0.25 * step - 0.01 * v;
      m += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss) +
           ",\"lr\":0.001,\"grad_norm\":1.25,\"tokens_per_s\":1000.5,\"elapsed\":0." +
           std::to_string(step) + (v ? ",\"loss_scale\":65536.0,\"skipped\":false" : "") + "}\n";
      if (step % 2 == 0) {
        m += "{\"step\":" + std::to_string(step) + ",\"val_loss\":" + std::to_string(loss + 0.1) +
             ",\"elapsed\":0.5}\n";
        m += "{\"step\":" + std::to_string(step) + ",\"checkpoint\":\"ckpt_0000000" +
             std::to_string(step) + ".bin\",\"weights_sha256\":\"ab12\"}\n";
      }
      for (int h = 0; h < 2; ++h) {
        for (const char* mat : {"wq", "wk", "wv", "wo"})
          spec += std::to_string(step) + ",0," + std::to_string(h) + "," + mat + "," +
                  std::to_string(1.0 + 0.1 * step + h) + ",12,1\n";
        for (const char* st : {"max_logit", "tied_row_frac", "p_one", "p_tilde_one", "entropy"})
          attn += std::to_string(step) + ",0," + std::to_string(h) + "," + st + "," +
                  std::to_string(0.5 * step + h) + "\n";
        drift += std::to_string(step) + ",0," + std::to_string(h) +
                 ",1e-07,3e-07,2e-08,0.001,0.0002,0.99\n";
        wass += std::to_string(step) + ",wq,0," + std::to_string(h) + ",0.0001,0.01,0.002\n";
      }
      spec += std::to_string(step) + ",,,wte,2.5,30,1\n" + std::to_string(step) + ",0,,qkvw,1.75,20,0\n";
      grad += std::to_string(step) + ",wte,,,0.5\n" + std::to_string(step) + ",qkvw,0,,0.25\n";
    }
    ev = "{\"step\":3,\"event\":\"spike\",\"metric\":\"loss\",\"value\":9.5,\"mean\":4.0,"
         "\"std\":0.5,\"z\":11.0,\"action\":\"log\"}\n"
         "{\"step\":4,\"event\":\"overflow\",\"loss_scale\":32768.0}\n";
    b["metrics.jsonl"] = m;
    b["config.yaml"] = kTinyYaml;
    b["spectral.csv"] = spec;
    b["attn_stats.csv"] = attn;
    b["delta_drift.csv"] = drift;
    b["grad_norms.csv"] = grad;
    b["wasserstein.csv"] = wass;
    b["events.jsonl"] = ev;
    c["report"].push_back({v ? "run_fp16" : "run_fp32", b});
    // compare: the same run's metrics.jsonl and config.yaml.
    c["compare"].push_back({v ? "run_b" : "run_a", {{"metrics.jsonl", m}, {"config.yaml", kTinyYaml}}});
    // hooks: the same hook files, the reference run's config and a hooks_state blob.
    Bundle h;
    for (const char* f : {"spectral.csv", "attn_stats.csv", "delta_drift.csv", "grad_norms.csv",
                          "wasserstein.csv", "events.jsonl"})
      h[f] = b[f];
    h["ref_config.yaml"] = kTinyYaml;
    {
      const fs::path rd = tmp / "hooks_run", ref = tmp / "hooks_ref";
      fs::create_directories(rd);
      fs::create_directories(ref);
      std::ofstream(ref / "config.yaml") << kTinyYaml;
      auto hk = tiny_hooks(rd, ref);
      if (v) hk->at_start();  // power-iteration vectors in the state
      const std::vector<uint8_t> st = hk->state();
      h["hooks_state.bin"] = std::string(st.begin(), st.end());
    }
    c["hooks"].push_back({v ? "warm" : "cold", h});
  }
  return c;
}

// Written into the source tree (run by hand; see the top of this file).
TEST(FuzzCorpus, DISABLED_WriteCorpus) {
  const fs::path tmp = test::make_scratch_dir("st_fuzz_corpus_");
  for (const auto& [target, entries] : make_corpus(tmp)) {
    const fs::path d = fs::path(ST_FUZZ_CORPUS_DIR) / target;
    fs::remove_all(d);
    for (const auto& [name, b] : entries) write_bundle(d / name, b);
  }
}

// ---- the loop --------------------------------------------------------------------------

struct Shared {  // written by the child, read by the parent after a crash
  int64_t case_index;
  char what[1024];
};

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

// The symptom of one case: "" when it loaded or threw st::Error.
std::string run_case(const Target& t, const fs::path& dir, int64_t* refused = nullptr) {
  try {
    t.run(dir);
  } catch (const Error&) {
    if (refused) ++*refused;
  } catch (const std::bad_alloc& e) {
    return std::string("std::bad_alloc: ") + e.what();
  } catch (const std::exception& e) {
    return std::string(typeid(e).name()) + ": " + e.what();
  } catch (...) {
    return "an exception of an unknown type";
  }
  return "";
}

// The child's work: findings, seeds, then the mutation cases. Exit status 0: no failure.
int child_main(const Target& t, Shared* sh, const fs::path& out, bool findings_pass) {
  if (!ST_FUZZ_ASAN) {
    rlimit lim{rlim_t(4) << 30, rlim_t(4) << 30};
    setrlimit(RLIMIT_AS, &lim);
  }
  const unsigned case_s = unsigned(env_int("STABLETRAIN_FUZZ_CASE_S", 20));
  const bool keep_going = env_int("STABLETRAIN_FUZZ_KEEP_GOING", 0) != 0;
  const int64_t only = env_int("STABLETRAIN_FUZZ_CASE", -1);
  int64_t iters = env_int("STABLETRAIN_FUZZ_ITERS", 300);
  iters = std::max<int64_t>(t.iters_div > 1 ? 20 : 1, iters / t.iters_div);
  const auto seeds = read_entries(fs::path(ST_FUZZ_CORPUS_DIR) / t.name);
  if (seeds.empty()) {
    std::printf("fuzz %s: no seeds in %s/%s\n", t.name.c_str(), ST_FUZZ_CORPUS_DIR, t.name.c_str());
    return 1;
  }
  const fs::path case_dir = out / "case";
  std::map<std::string, std::string> symptoms;  // distinct symptom -> first reproducer
  int failures = 0;
  int64_t refused = 0;  // cases refused with st::Error (the others loaded, or failed)
  auto attempt = [&](const std::string& label, const Bundle& b, const std::string& save_as) {
    std::snprintf(sh->what, sizeof sh->what, "%s", label.c_str());
    write_bundle(case_dir, b);
    alarm(case_s);
    const std::string sym = run_case(t, case_dir, &refused);
    alarm(0);
    if (sym.empty()) return true;
    ++failures;
    const fs::path keep = out / save_as;
    write_bundle(keep, b);
    // Distinct by the exception type and the message's start without digits.
    std::string key;
    for (char c : sym.substr(0, 60))
      if (!std::isdigit(static_cast<unsigned char>(c))) key += c;
    if (!symptoms.count(key)) {
      symptoms[key] = keep.string();
      std::printf("fuzz %s: FAILED %s\n  symptom: %s\n  input: %s\n", t.name.c_str(), label.c_str(),
                  sym.c_str(), keep.string().c_str());
    }
    std::fflush(stdout);
    return false;
  };
  if (findings_pass) {  // reproducers of earlier findings, every one tried
    for (const auto& [name, b] : read_entries(fs::path(ST_FUZZ_FINDINGS_DIR) / t.name))
      attempt("finding " + name, b, "finding_" + name);
    return failures ? 1 : 0;
  }
  // The seeds themselves must load.
  for (const auto& [name, b] : seeds) {
    if (only >= 0) break;
    std::snprintf(sh->what, sizeof sh->what, "seed %s", name.c_str());
    write_bundle(case_dir, b);
    try {
      t.run(case_dir);
    } catch (const std::exception& e) {
      std::printf("fuzz %s: seed %s does not load: %s\n", t.name.c_str(), name.c_str(), e.what());
      return 1;
    }
  }
  const uint64_t tseed = name_hash(t.name);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t ran = 0;
  const int64_t first = only >= 0 ? only : env_int("STABLETRAIN_FUZZ_FIRST", 0);
  for (int64_t i = first; i < (only >= 0 ? only + 1 : iters); ++i) {
    sh->case_index = i;
    Mutator m{std::mt19937_64(splitmix(tseed ^ splitmix(uint64_t(i)))), ""};
    const size_t e = m.below(seeds.size());
    Bundle b = seeds[e].second;
    const int nops = 1 + int(m.below(4));
    m.log = "seed " + seeds[e].first + ": ";
    for (int k = 0; k < nops; ++k) {
      auto it = b.begin();
      std::advance(it, m.below(b.size()));
      const auto& other_seed = seeds[m.below(seeds.size())].second;
      const auto ot = other_seed.find(it->first);
      const std::string& other = ot != other_seed.end() ? ot->second : other_seed.begin()->second;
      const auto fields = t.int_fields ? t.int_fields(it->first, it->second)
                                       : std::vector<std::pair<size_t, int>>{};
      m.log += it->first + ": ";
      m.op(it->second, fields, other);
    }
    if (t.fixup) t.fixup(b, m);
    const std::string label = "case " + std::to_string(i) + " (" + m.log + ")" +
                              "; rerun: STABLETRAIN_FUZZ_CASE=" + std::to_string(i) +
                              " test_fuzz --gtest_filter='*Fuzz*/" + t.name + "'";
    ++ran;
    if (!attempt(label, b, "fail_case" + std::to_string(i)) && !keep_going) return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (t.name == "compare")  // a subprocess: its one-line refusals (exit 1) are not told apart
    std::printf("fuzz %s: %lld cases in %.2f s, %d failed, %zu distinct symptoms\n",
                t.name.c_str(), (long long)ran, secs, failures, symptoms.size());
  else
    std::printf("fuzz %s: %lld cases in %.2f s, %d failed, %zu distinct symptoms; %lld refused "
                "with st::Error, %lld accepted\n", t.name.c_str(), (long long)ran, secs, failures,
                symptoms.size(), (long long)refused, (long long)(ran - refused - failures));
  for (const auto& [k, path] : symptoms) std::printf("  %s -> %s\n", k.c_str(), path.c_str());
  return failures ? 1 : 0;
}

// Runs one pass of a target in a forked child: "" when every case passed, else what failed.
std::string run_pass(const Target& t, bool findings) {
  const fs::path out = fs::path(ST_FUZZ_OUT_DIR) / t.name;
  fs::create_directories(out);
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) return "mmap failed";
  sh->case_index = -1;
  sh->what[0] = 0;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    int rc = 1;
    try {
      rc = child_main(t, sh, out, findings);
    } catch (const std::exception& e) {
      std::printf("fuzz %s: harness error: %s\n", t.name.c_str(), e.what());
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  int st = 0;
  std::string failure;
  if (waitpid(pid, &st, 0) != pid) {
    failure = "waitpid failed";
  } else if (WIFSIGNALED(st)) {
    const fs::path keep = out / (findings ? std::string("crash_finding")
                                          : "crash_case" + std::to_string(sh->case_index));
    std::error_code ec;
    fs::remove_all(keep, ec);
    fs::copy(out / "case", keep, fs::copy_options::recursive, ec);
    failure = std::string(WTERMSIG(st) == SIGALRM ? "hang (per-case time limit)" : strsignal(WTERMSIG(st))) +
              " in " + sh->what + "; input: " + keep.string();
  } else if (WEXITSTATUS(st) != 0) {
    failure = "a case failed (see above); last: " + std::string(sh->what);
  }
  munmap(sh, sizeof(Shared));
  return failure;
}

class Fuzz : public ::testing::TestWithParam<std::string> {};

// Two passes, each in its own child: the reproducers of tests/fuzz/findings/<target>/, then
// the seeds and the mutation cases (so a crashing finding does not stop the fuzzing).
TEST_P(Fuzz, MutatedInputsLoadOrThrowStError) {
  const std::string name = GetParam();
  Target t;
  for (const Target& x : targets())
    if (x.name == name) t = x;
  const std::string findings = env_int("STABLETRAIN_FUZZ_CASE", -1) >= 0 ? "" : run_pass(t, true);
  const std::string fuzzing = run_pass(t, false);
  if (kKnownOpen.count(name)) {
    if (findings.empty() && env_int("STABLETRAIN_FUZZ_CASE", -1) < 0)
      ADD_FAILURE() << "fuzz " << name << ": its findings no longer fail: remove it from kKnownOpen";
    if (!findings.empty())
      std::printf("fuzz %s: known open (issue 19), expected: %s\n", name.c_str(), findings.c_str());
    if (!fuzzing.empty())
      std::printf("fuzz %s: known open (issue 19), fuzzing failed too (not counted): %s\n",
                  name.c_str(), fuzzing.c_str());
    return;
  }
  EXPECT_EQ(findings, "") << "fuzz " << name << " (findings)";
  EXPECT_EQ(fuzzing, "") << "fuzz " << name;
}

INSTANTIATE_TEST_SUITE_P(Parsers, Fuzz,
                         ::testing::Values("checkpoint", "config", "llmc", "safetensors",
                                           "tokenizer", "shards", "report", "hooks", "compare"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace st
