// bench: speed of one training step (forward, backward, AdamW) of GPT-2 shapes on the CPU.
// (`bench train`, apps/bench_train.cpp: tokens/s and MFU on any device, the GPU included;
// `bench attention`, apps/bench_attention.cpp: the GPU attention kernels.)
//   bench step [--precision fp32,bf16] [--B 4] [--T 64] [--steps 5] [--layers 12 ...]
//              [--torch apps/bench_torch_train.py] [--rounds 2]
// Each precision runs in its own child process so that its peak memory is its own. The
// comparison figure is measured in the same run: the same step in PyTorch (the script, on
// /usr/bin/python3), alternated with stabletrain's for --rounds rounds so that a change of
// load hits both. Prints: measured time, the comparison figure, and their ratio.
//   bench backends [--steps 200] [--precision fp32,bf16] [--data FILE]
// trains the same small GPT-2 on the same Tiny Shakespeare byte batches with each attention
// backend and reports how far their loss curves drift apart (a report, not a pass/fail).
#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/backends.h"
#include "backends/cpu_threads.h"
#include "core/backend.h"
#include "core/timing_backend.h"
#include "model/gpt2.h"

namespace st {  // apps/bench_tokenizer.cpp
int run_tokenizer_bench(const std::string& input, const std::string& vocab_dir,
                        const std::string& node_pkg, const std::string& node_script, int reps);
// apps/bench_train.cpp: `bench train`; the callback sets rc.
CLI::App* add_train_bench(CLI::App& app, int& rc);
// apps/bench_attention.cpp: `bench attention` (GPU attention TFLOP/s, memory, delta modes).
CLI::App* add_attention_bench(CLI::App& app, int& rc);
}

using namespace st;

namespace {

constexpr int kMaxSteps = 256;

struct StepResult {
  double median_s = 0, min_s = 0;
  int n = 0;                   // timed steps
  double times[kMaxSteps] = {};
  static constexpr int kMaxFamilies = 16;
  char family[kMaxFamilies][16] = {};
  double family_s[kMaxFamilies] = {};  // seconds per timed step
  double peak_mib = 0;
  double faults_per_step = 0;  // minor page faults per timed step
  float first_loss = 0, last_loss = 0;
};

long minor_faults() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

StepResult run_steps(const GPT2Config& cfg, DType prec, int B, int T, int steps, int threads) {
  auto cpu = make_cpu_backend(threads);
  TimingBackend tb(*cpu);
  GPT2 model(cfg, tb, prec);
  model.init_weights(1337);
  Rng rng(1);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  OptimConfig opt;
  opt.weight_decay = 0.1f;
  std::vector<double> times;
  StepResult r;
  long faults0 = 0;
  for (int s = 0; s <= steps; ++s) {  // step 0 is the warm-up (allocations, page faults)
    for (int i = 0; i < B * T; ++i) {
      tok[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
      tgt[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
    }
    const auto t0 = std::chrono::steady_clock::now();
    model.zero_grad();
    const float loss = model.forward_backward(tok.data(), tgt.data(), B, T);
    model.step(3e-4f, opt);
    const auto t1 = std::chrono::steady_clock::now();
    if (s == 0) {
      r.first_loss = loss;
      tb.reset();
      faults0 = minor_faults();
    }
    r.last_loss = loss;
    if (s > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  r.n = static_cast<int>(times.size());
  r.faults_per_step = double(minor_faults() - faults0) / steps;
  std::copy(times.begin(), times.end(), r.times);
  std::sort(times.begin(), times.end());
  r.median_s = times[times.size() / 2];
  r.min_s = times.front();
  int k = 0;
  for (const auto& [name, e] : tb.totals()) {
    if (k == StepResult::kMaxFamilies) break;
    std::snprintf(r.family[k], sizeof r.family[k], "%s", name.c_str());
    r.family_s[k++] = e.seconds / steps;
  }
  return r;
}

// Runs one precision in a forked child; the child's peak RSS comes from wait4.
StepResult measure_in_child(const GPT2Config& cfg, DType prec, int B, int T, int steps,
                            int threads) {
  int fd[2];
  ST_CHECK(pipe(fd) == 0, "pipe failed");
  const pid_t pid = fork();
  ST_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    close(fd[0]);
    StepResult r{};
    try {
      r = run_steps(cfg, prec, B, T, steps, threads);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench: %s\n", e.what());
      _exit(1);
    }
    const ssize_t n = write(fd[1], &r, sizeof r);
    _exit(n == static_cast<ssize_t>(sizeof r) ? 0 : 1);
  }
  close(fd[1]);
  StepResult r{};
  const ssize_t n = read(fd[0], &r, sizeof r);
  close(fd[0]);
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  ST_CHECK(n == static_cast<ssize_t>(sizeof r) && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "benchmark child for ", dtype_name(prec), " failed");
  r.peak_mib = ru.ru_maxrss / 1024.0;
  return r;
}

// The optimizer's memory floor: FP32 AdamW reads parameters, gradients, m and v and writes
// parameters, m and v, 7 streams of n values (28 bytes per parameter). A loop with the same
// streams and no arithmetic to speak of (each output is its input plus the gradient), run
// with the step's threads over n values, best of `reps` after a warm-up: no AdamW of n FP32
// parameters can take less on these cores. Returns seconds; `gbs` the bandwidth reached.
double optimizer_stream_floor_s(int64_t n, int threads, double& gbs, int reps = 3) {
  auto cpu = make_cpu_backend(threads);  // sets the thread count the kernels use
  std::vector<float> p(n), g(n), m(n), v(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = g[i] = m[i] = v[i] = 1e-3f * static_cast<float>(i % 97);
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    float* pp = p.data();
    float* mp = m.data();
    float* vp = v.data();
    const float* gp = g.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = gp[i];
      mp[i] += gi;
      vp[i] += gi;
      pp[i] += gi;
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, sec);
  }
  gbs = 28.0 * double(n) / best / 1e9;
  return best;
}

// The best FP32 GEMM rate of the CPU backend's matmul on `threads` threads over the step's
// own shapes (M = B*T rows; qkv, attention projection, MLP up and down, LM head), forward
// and backward each, best of `reps` after a warm-up: the rate at which the step's matmuls
// could all run at best, in GFLOP/s; `what` names the shape that reached it.
double gemm_peak_gflops(const GPT2Config& cfg, int B, int T, int threads, std::string& what,
                        int reps = 3) {
  auto cpu = make_cpu_backend(threads);
  const int M = B * T, C = cfg.n_embd;
  const std::pair<int, int> shapes[] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, cfg.vp()}};
  Rng rng(3);
  double best = 0;
  for (const auto& [K, N] : shapes) {
    Tensor a = Tensor::empty({M, K}, DType::F32), w = Tensor::empty({N, K}, DType::F32),
           out = Tensor::empty({M, N}, DType::F32), da = Tensor::empty({M, K}, DType::F32),
           dw = Tensor::empty({N, K}, DType::F32);
    for (Tensor* t : {&a, &w, &out, &dw})
      for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = static_cast<float>(rng.normal());
    for (int bwd = 0; bwd < 2; ++bwd) {
      double t_best = 1e30;
      for (int r = 0; r <= reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        if (bwd)
          cpu->matmul_backward(da, dw, Tensor(), out, a, w, DType::F32);
        else
          cpu->matmul_forward(out, a, w, Tensor(), DType::F32);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) t_best = std::min(t_best, sec);
      }
      const double rate = (bwd ? 4.0 : 2.0) * M * double(K) * N / t_best / 1e9;
      if (rate > best) {
        best = rate;
        what = std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N) +
               (bwd ? " backward" : " forward");
      }
    }
  }
  return best;
}

// Multiply-add work of one training step's matmuls (forward, dinp, dweight: 3 GEMMs of
// 2 M K N FLOPs each): per layer qkv, attention projection, MLP up and down (12 C^2), and
// the tied LM head (C x padded vocabulary). Attention's own products are not matmuls here.
double step_matmul_gflop(const GPT2Config& cfg, int B, int T) {
  const double C = cfg.n_embd, tokens = double(B) * T;
  return 6.0 * tokens * (12.0 * cfg.n_layer * C * C + C * cfg.vp()) / 1e9;
}

// Loss curves of one small model per backend, same init and batches.
int run_backends(const std::string& data_path, const std::string& precisions, int steps,
                 int threads) {
  std::ifstream f(data_path, std::ios::binary);
  ST_CHECK(f, "bench backends: cannot read --data ", data_path);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  GPT2Config cfg;
  cfg.n_layer = 4;
  cfg.n_head = 4;
  cfg.n_embd = 128;
  cfg.max_seq_len = 128;
  cfg.vocab_size = 256;
  const int B = 8, T = 128;
  ST_CHECK(text.size() > static_cast<size_t>(B * T + 1) * 4, "bench backends: data too short");
  const AttentionKind kinds[] = {AttentionKind::Baseline, AttentionKind::Flash,
                                 AttentionKind::StabilizedFlash};
  std::printf("GPT-2 L=4 H=4 C=128 T=128 B=%d on %s bytes, lr 2e-3, %d steps; "
              "flash tiles 64x64, stabilized beta 2\n", B, data_path.c_str(), steps);
  std::stringstream ss(precisions);
  for (std::string p; std::getline(ss, p, ',');) {
    const DType prec = parse_dtype(p);
    std::vector<std::vector<float>> curves;
    std::vector<double> secs;
    for (AttentionKind k : kinds) {
      auto be = make_cpu_backend(threads);
      AttentionConfig ac;
      ac.kind = k;
      GPT2 m(cfg, *be, prec, ac);
      m.init_weights(1337);
      Rng rng(7);
      std::vector<int32_t> x(B * T), y(B * T);
      OptimConfig opt;
      opt.weight_decay = 0.1f;
      std::vector<float> losses;
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) {
        for (int b = 0; b < B; ++b) {
          const size_t off = rng.below(text.size() - T - 1);
          for (int t = 0; t < T; ++t) {
            x[b * T + t] = static_cast<unsigned char>(text[off + t]);
            y[b * T + t] = static_cast<unsigned char>(text[off + t + 1]);
          }
        }
        m.zero_grad();
        losses.push_back(m.forward_backward(x.data(), y.data(), B, T));
        m.step(2e-3f * std::min(1.0f, (s + 1) / 20.0f), opt);
      }
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      curves.push_back(losses);
    }
    std::printf("\n[%s] loss by step\n%6s %10s %10s %10s %14s %14s\n", dtype_name(prec), "step",
                "baseline", "flash", "stabilized", "flash-base", "stab-base");
    for (int s = 0; s < steps; ++s)
      if (s == 0 || (s + 1) % 20 == 0)
        std::printf("%6d %10.5f %10.5f %10.5f %14.3e %14.3e\n", s + 1, curves[0][s],
                    curves[1][s], curves[2][s], curves[1][s] - curves[0][s],
                    curves[2][s] - curves[0][s]);
    for (int i = 1; i < 3; ++i) {
      double mx = 0, mean = 0;
      int first = -1;
      for (int s = 0; s < steps; ++s) {
        const double dd = std::fabs(curves[i][s] - curves[0][s]);
        mx = std::max(mx, dd);
        mean += dd / steps;
        if (first < 0 && dd != 0) first = s + 1;
      }
      std::printf("%s vs baseline: first differing step %d, max |dloss| %.3e, mean |dloss| %.3e\n",
                  attention_kind_name(kinds[i]), first, mx, mean);
    }
    std::printf("time: baseline %.1f s, flash %.1f s, stabilized %.1f s\n", secs[0], secs[1], secs[2]);
  }
  return 0;
}

}  // namespace
// Seconds per step: mean and its standard error over the steps.
struct Stat {
  double mean = 0, se = 0;
  int n = 0;
};
Stat stat(const std::vector<double>& v) {
  Stat s;
  s.n = static_cast<int>(v.size());
  for (double x : v) s.mean += x / s.n;
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.se = s.n > 1 ? std::sqrt(ss / (s.n - 1) / s.n) : 0;
  return s;
}

struct TorchResult {
  std::vector<double> times;
  double first_loss = 0, last_loss = 0, params = 0;
  std::string version, blas, wait_policy;  // what the PyTorch process ran with
  double faults_per_step = -1;             // minor page faults per timed step (-1: not reported)
};

// The PyTorch step as installed, and with glibc's malloc keeping the memory it frees. Torch's
// CPU allocator returns every large tensor to glibc after each step; glibc unmaps blocks
// above its mmap threshold, so every step faults the logits, activations and gradients in
// again (measured on the 2-core VM, 2026-11-28: ~480k minor faults and 6.5 s per 124M step,
// against ~18k and 2.1 s with the variables below). The second variant is what a PyTorch
// user tuning for speed runs (jemalloc and tcmalloc do the same); the bench compares with both.
struct TorchVariant {
  const char* name;
  const char* env;
};
constexpr TorchVariant kTorchVariants[] = {
    {"torch", ""},
    {"torch+malloc", "MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=17179869184 "},
};

// Runs the PyTorch step script once; its last stdout line is a JSON object.
TorchResult run_torch(const std::string& script, const GPT2Config& cfg, int B, int T, int steps,
                      int threads, const TorchVariant& variant) {
  // PyTorch runs as a PyTorch user runs it: OpenMP's default wait policy unless the user set
  // one for both, and the environment's BLAS kernels, as stabletrain does.
  const std::string env = std::string("env ") +
                          (omp_wait_policy_is_stabletrains()
                               ? "-u OMP_WAIT_POLICY -u STABLETRAIN_RUNTIME_ENV "
                               : "") +
                          variant.env;
  const std::string cmd = env + "/usr/bin/python3 " + script + " --layers " + std::to_string(cfg.n_layer) +
                          " --heads " + std::to_string(cfg.n_head) + " --embd " +
                          std::to_string(cfg.n_embd) + " --vocab " + std::to_string(cfg.vocab_size) +
                          " --max-seq-len " + std::to_string(cfg.max_seq_len) + " --B " +
                          std::to_string(B) + " --T " + std::to_string(T) + " --steps " +
                          std::to_string(steps) + " --threads " + std::to_string(threads);
  FILE* f = popen(cmd.c_str(), "r");
  ST_CHECK(f, "bench: cannot run ", cmd);
  std::string out, last;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f)) out += buf;
  const int rc = pclose(f);
  ST_CHECK(rc == 0, "bench: the PyTorch comparison failed (", cmd, "); it needs /usr/bin/python3 "
           "with torch (Debian: apt-get install python3-torch), or pass --torch ''");
  std::istringstream ls(out);
  for (std::string l; std::getline(ls, l);)
    if (!l.empty()) last = l;
  const auto j = nlohmann::json::parse(last);
  TorchResult r;
  r.times = j.at("times").get<std::vector<double>>();
  r.first_loss = j.at("first_loss").get<double>();
  r.last_loss = j.at("last_loss").get<double>();
  r.params = j.at("params").get<double>();
  r.version = j.at("torch").get<std::string>();
  r.blas = j.value("blas", std::string("BLAS not reported"));
  r.wait_policy = j.value("omp_wait_policy", std::string("not reported"));
  r.faults_per_step = j.value("minor_faults_per_step", -1.0);
  return r;
}


int main(int argc, char** argv) {
  CLI::App app{"stabletrain benchmarks"};
  app.require_subcommand(1);
  auto* step = app.add_subcommand("step", "one CPU training step of GPT-2 shapes");
  std::string precisions = "fp32,bf16";
  int B = 4, T = 64, steps = 5, threads = 0;
  GPT2Config cfg;  // 124M shapes by default
  double ref_llmc = 0;
  int rounds = 2;
  std::string torch_script = ST_TORCH_SCRIPT;
  step->add_option("--precision", precisions, "comma-separated: fp32,bf16,fp16,fp64");
  step->add_option("--B", B, "micro-batch size");
  step->add_option("--T", T, "sequence length");
  step->add_option("--steps", steps, "timed steps per round (after one warm-up)")
      ->check(CLI::Range(1, kMaxSteps));
  step->add_option("--threads", threads, "threads for both (0: every core)");
  step->add_option("--rounds", rounds, "rounds of stabletrain then PyTorch")->check(CLI::Range(1, 100));
  step->add_option("--torch", torch_script, "PyTorch step script ('': no comparison)")
      ->capture_default_str();
  step->add_option("--layers", cfg.n_layer, "n_layer");
  step->add_option("--heads", cfg.n_head, "n_head");
  step->add_option("--embd", cfg.n_embd, "n_embd");
  step->add_option("--ref-llmc", ref_llmc, "llm.c CPU s/step measured on this machine (0: none)");
  auto* backends = app.add_subcommand("backends", "loss-curve drift between attention backends");
  std::string data_path = "../shared/data/tinyshakespeare.txt", bprec = "fp32,bf16";
  int bsteps = 200;
  backends->add_option("--data", data_path, "text file (bytes are the tokens)");
  backends->add_option("--precision", bprec, "comma-separated precisions");
  backends->add_option("--steps", bsteps, "training steps")->check(CLI::PositiveNumber);
  backends->add_option("--threads", threads, "threads (0: OpenMP default)");
  auto* tokb = app.add_subcommand("tokenizer", "GPT-2 BPE throughput (MB/s) vs node gpt-3-encoder");
  std::string tok_input = "../shared/data/tinyshakespeare.txt";
  std::string tok_vocab = "../shared/data/gpt2-tokenizer", tok_node = ST_NPM_PKG_DIR;
  int tok_reps = 5;
  tokb->add_option("--input", tok_input, "text file")->capture_default_str();
  tokb->add_option("--tokenizer-dir", tok_vocab, "encoder.json + vocab.bpe")->capture_default_str();
  tokb->add_option("--node-pkg", tok_node, "gpt-3-encoder folder ('' : no comparison)")->capture_default_str();
  tokb->add_option("--reps", tok_reps, "warm repetitions")->check(CLI::PositiveNumber);
  int sub_rc = 0;
  auto* trainb = add_train_bench(app, sub_rc);
  auto* attnb = add_attention_bench(app, sub_rc);
  CLI11_PARSE(app, argc, argv);
  if (trainb->parsed() || attnb->parsed()) return sub_rc;
  if (tokb->parsed()) {
    try {
      std::ifstream probe(tok_node + "/Encoder.js");
      return run_tokenizer_bench(tok_input, tok_vocab, probe ? tok_node : "", ST_NODE_SCRIPT, tok_reps);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench: %s\n", e.what());
      return 1;
    }
  }
  if (backends->parsed()) {
    try {
      return run_backends(data_path, bprec, bsteps, threads);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench: %s\n", e.what());
      return 1;
    }
  }
  try {
    if (threads <= 0) threads = cpu_cores_available();
    std::vector<DType> precs;
    std::stringstream ss(precisions);
    for (std::string p; std::getline(ss, p, ',');) precs.push_back(parse_dtype(p));
    std::vector<StepResult> last(precs.size());
    std::vector<std::vector<double>> ours(precs.size());
    std::vector<double> peak(precs.size(), 0.0);
    constexpr int kVariants = sizeof kTorchVariants / sizeof kTorchVariants[0];
    std::vector<double> theirs[kVariants];
    TorchResult torch[kVariants];
    const double load0 = [] {
      double l[1] = {0};
      return getloadavg(l, 1) == 1 ? l[0] : -1;
    }();
    for (int round = 0; round < rounds; ++round) {
      for (size_t i = 0; i < precs.size(); ++i) {
        std::fprintf(stderr, "round %d/%d: stabletrain %s ...\n", round + 1, rounds,
                     dtype_name(precs[i]));
        last[i] = measure_in_child(cfg, precs[i], B, T, steps, threads);
        ours[i].insert(ours[i].end(), last[i].times, last[i].times + last[i].n);
        peak[i] = std::max(peak[i], last[i].peak_mib);
      }
      for (int v = 0; v < kVariants && !torch_script.empty(); ++v) {
        std::fprintf(stderr, "round %d/%d: PyTorch fp32 (%s) ...\n", round + 1, rounds,
                     kTorchVariants[v].name);
        torch[v] = run_torch(torch_script, cfg, B, T, steps, threads, kTorchVariants[v]);
        theirs[v].insert(theirs[v].end(), torch[v].times.begin(), torch[v].times.end());
      }
    }
    std::fprintf(stderr, "GEMM peak (the step's shapes, %d threads) ...\n", threads);
    std::string peak_shape;
    const double peak_gflops = gemm_peak_gflops(cfg, B, T, threads, peak_shape);
    double load1[1] = {0};
    getloadavg(load1, 1);
    std::printf("GPT-2 L=%d H=%d C=%d V=%d (%.1fM params), B=%d T=%d, FP32 AdamW step with "
                "clipping; %d rounds x %d timed steps after a warm-up; %d threads (OpenMP wait "
                "policy %s; BLAS %s); load average %.2f before, %.2f after\n",
                cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, num_parameters(cfg) / 1e6, B,
                T, rounds, steps, threads, omp_wait_policy_description().c_str(),
                blas_description().c_str(), load0, load1[0]);
    if (!torch_script.empty()) {
      std::printf("comparison: PyTorch %s, the same model, batch, optimizer and threads, "
                  "alternated with stabletrain in each round (%.1fM params; %s, OpenMP wait "
                  "policy %s). torch: as installed; torch+malloc: with %s(glibc's malloc keeps "
                  "freed memory instead of unmapping it)\n",
                  torch[0].version.c_str(), torch[0].params / 1e6, torch[0].blas.c_str(),
                  torch[0].wait_policy.c_str(), kTorchVariants[1].env);
      std::printf("minor page faults per timed step: stabletrain fp32 %.0f", last[0].faults_per_step);
      for (int v = 0; v < kVariants; ++v)
        std::printf(", %s %.0f", kTorchVariants[v].name, torch[v].faults_per_step);
      std::printf("\n");
    }
    std::printf("%-18s %18s %24s %8s %10s %14s\n", "measurement", "s/step (mean+-SE)",
                "comparison", "ratio", "peak MiB", "loss0->last");
    Stat tstv[kVariants];
    for (int v = 0; v < kVariants; ++v) tstv[v] = stat(theirs[v]);
    // The floors are stated against the faster PyTorch variant (the stricter comparison).
    int fastest = 0;
    for (int v = 1; v < kVariants; ++v)
      if (tstv[v].n && tstv[v].mean < tstv[fastest].mean) fastest = v;
    const Stat tst = tstv[fastest];
    double fp32 = 0;
    for (size_t i = 0; i < precs.size(); ++i)
      if (precs[i] == DType::F32) fp32 = stat(ours[i]).mean;
    char a[64], b[64];
    for (size_t i = 0; i < precs.size(); ++i) {
      const Stat m = stat(ours[i]);
      const std::string name = std::string("step ") + dtype_name(precs[i]);
      std::snprintf(a, sizeof a, "%.3f +- %.3f", m.mean, m.se);
      auto row = [&](const std::string& cmp, double ref) {
        std::printf("%-18s %18s %24s %8.2f %10.0f %6.3f->%.3f\n", name.c_str(), a, cmp.c_str(),
                    m.mean / ref, peak[i], last[i].first_loss, last[i].last_loss);
      };
      for (int v = 0; v < kVariants && precs[i] == DType::F32; ++v) {
        if (!tstv[v].n) continue;
        std::snprintf(b, sizeof b, "%s %.3f +- %.3f", kTorchVariants[v].name, tstv[v].mean,
                      tstv[v].se);
        row(b, tstv[v].mean);
      }
      if (precs[i] == DType::F32 && ref_llmc > 0) {
        std::snprintf(b, sizeof b, "llm.c %.3f (given)", ref_llmc);
        row(b, ref_llmc);
      }
      if (precs[i] != DType::F32 && fp32 > 0) {
        std::snprintf(b, sizeof b, "fp32 %.3f", fp32);
        row(b, fp32);
      }
      if ((precs[i] == DType::F32 && !tst.n && ref_llmc <= 0) ||
          (precs[i] != DType::F32 && fp32 <= 0))
        row("-", m.mean);
    }
    if (fp32 > 0 && tst.n) {
      const double tok = double(B) * T;
      for (int v = 0; v < kVariants; ++v)
        std::printf("%-18s %18.0f %24s %8.2f   (tokens / mean step time)\n", "tokens/s fp32",
                    tok / fp32,
                    (std::string(kTorchVariants[v].name) + " " +
                     std::to_string(static_cast<int>(tok / tstv[v].mean)))
                        .c_str(),
                    tstv[v].mean / fp32);
      std::printf("torch loss %.3f->%.3f (random tokens: ln V = %.3f)\n", torch[0].first_loss,
                  torch[0].last_loss, std::log(double(cfg.vocab_size)));
    }
    {
      // The floor the matmuls alone put under any step on these cores.
      const double gf = step_matmul_gflop(cfg, B, T), floor_s = gf / peak_gflops;
      double mm = 0;
      for (int k = 0; k < StepResult::kMaxFamilies && last[0].family[k][0]; ++k)
        if (std::string(last[0].family[k]) == "matmul") mm = last[0].family_s[k];
      std::printf("GEMM floor: the step's matmuls are %.1f GFLOP; this backend's FP32 GEMM "
                  "reaches at best %.1f GFLOP/s here (M x K x N %s, the fastest of the step's "
                  "shapes forward and backward, best of 3, same run), so no step can take less "
                  "than %.3f s", gf, peak_gflops, peak_shape.c_str(), floor_s);
      if (tst.n)
        std::printf(" = %.2fx PyTorch's step (%s)", floor_s / tst.mean, kTorchVariants[fastest].name);
      std::printf("\n");
      if (mm > 0 && precs[0] == DType::F32)
        std::printf("            measured matmul family %.3f s/step = %.1f GFLOP/s, %.0f%% of "
                    "that peak\n", mm, gf / mm, 100.0 * gf / mm / peak_gflops);
    }
    if (precs[0] == DType::F32) {
      // The optimizer's memory floor, and the floor of GEMMs and optimizer together.
      double gbs = 0;
      const int64_t n = num_parameters(cfg);
      const double opt_s = optimizer_stream_floor_s(n, threads, gbs);
      double adamw = 0;
      for (int k = 0; k < StepResult::kMaxFamilies && last[0].family[k][0]; ++k)
        if (std::string(last[0].family[k]) == "adamw") adamw = last[0].family_s[k];
      const double both = step_matmul_gflop(cfg, B, T) / peak_gflops + opt_s;
      std::printf("memory floor: FP32 AdamW moves 28 bytes per parameter (%.2f GB); a loop with "
                  "its 7 streams and no arithmetic takes %.3f s here (%.1f GB/s, best of 3, "
                  "same run); measured adamw family %.3f s = %.2fx that\n",
                  28.0 * n / 1e9, opt_s, gbs, adamw, adamw / opt_s);
      std::printf("GEMM floor + memory floor = %.3f s", both);
      if (tst.n)
        std::printf(" = %.2fx PyTorch's step (%s)", both / tst.mean, kTorchVariants[fastest].name);
      std::printf(" (every other kernel counted as free)\n");
    }
    std::printf("\nper kernel family, s/step (last round):");
    for (DType d : precs) std::printf(" %10s", dtype_name(d));
    std::printf("\n");
    for (int k = 0; k < StepResult::kMaxFamilies && last[0].family[k][0]; ++k) {
      std::printf("  %-24s", last[0].family[k]);
      for (const StepResult& r : last) std::printf(" %10.3f", r.family_s[k]);
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
