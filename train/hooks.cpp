// Stability hooks (train/hooks.h). Everything here reads the model and writes files; the
// only effect on training is the opt-in spike skip, decided by the trainer.
#include "train/hooks.h"

#include <omp.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <yaml-cpp/yaml.h>

#include "analysis/weight_distance.h"
#include "attention/head_cpu.h"
#include "core/error.h"
#include "train/run_io.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace st {

// ---------------------------------------------------------------------------------------
// Power iteration

namespace {

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double norm2(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

constexpr int64_t kParallelNumel = int64_t(1) << 18;  // slices this big split their matvecs

}  // namespace

namespace {

constexpr int64_t kGramMaxSide = 512;  // cold starts of thinner matrices use the Gram matrix

// Power iteration on the k x k Gram matrix of A's short side (G = A^T A when n <= m, else
// A A^T), FP64, to the same residual tolerance; leaves in v (length n, unnormalised) the
// start vector for the iteration on A. Returns the iterations used.
int gram_start(const float* A, int64_t ld, int64_t m, int64_t n, std::vector<double>& v,
               double tol, int max_iters, bool par) {
  const bool cols = n <= m;  // G = A^T A (n x n) or A A^T (m x m)
  const int64_t k = cols ? n : m, len = cols ? m : n;
  std::vector<double> G(static_cast<size_t>(k * k), 0.0);
  // G[i][j] = sum over the long side of a_i a_j, each entry summed in index order.
#pragma omp parallel for schedule(dynamic) if (par)
  for (int64_t i = 0; i < k; ++i) {
    std::vector<double> acc(static_cast<size_t>(k - i), 0.0);
    for (int64_t t = 0; t < len; ++t) {
      const double ai = cols ? A[t * ld + i] : A[i * ld + t];
      if (ai == 0) continue;
      for (int64_t j = i; j < k; ++j) acc[j - i] += ai * (cols ? A[t * ld + j] : A[j * ld + t]);
    }
    for (int64_t j = i; j < k; ++j) G[i * k + j] = G[j * k + i] = acc[j - i];
  }
  std::vector<double> x(static_cast<size_t>(k)), y(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {  // the random v, or A v for the left side
    if (cols) {
      x[i] = v[i];
    } else {
      double a = 0;
      for (int64_t j = 0; j < n; ++j) a += A[i * ld + j] * v[j];
      x[i] = a;
    }
  }
  double nx = norm2(x);
  for (auto& e : x) e /= nx;
  int it = 0;
  while (it < max_iters) {
    ++it;
    double rho = 0;
    for (int64_t i = 0; i < k; ++i) {
      double a = 0;
      for (int64_t j = 0; j < k; ++j) a += G[i * k + j] * x[j];
      y[i] = a;
      rho += x[i] * a;
    }
    double res = 0;
    for (int64_t i = 0; i < k; ++i) res += (y[i] - rho * x[i]) * (y[i] - rho * x[i]);
    const double ny = norm2(y);
    if (ny == 0) break;
    for (int64_t i = 0; i < k; ++i) x[i] = y[i] / ny;
    if (std::sqrt(res) <= tol * rho) break;
  }
  if (cols) {
    v = x;
  } else {  // right vector from the left one: v = A^T x
    for (int64_t j = 0; j < n; ++j) {
      double a = 0;
      for (int64_t i = 0; i < m; ++i) a += A[i * ld + j] * x[i];
      v[j] = a;
    }
  }
  return it;
}

}  // namespace

PowerResult spectral_norm(const WeightSlice& s, const float* flat, std::vector<double>& v,
                          double tol, int max_iters, uint64_t seed) {
  const int64_t m = s.rows, n = s.cols;
  ST_CHECK(m > 0 && n > 0, "spectral_norm: empty slice ", slice_label(s));
  const bool par = m * n >= kParallelNumel;
  const float* A = flat + s.offset;
  const int64_t ld = s.row_stride;
  PowerResult r;
  if (static_cast<int64_t>(v.size()) != n || norm2(v) == 0) {
    // Cold start. Random weights have clustered top singular values, so power iteration
    // on A needs hundreds of iterations; for a thin matrix, iterate on the small Gram
    // matrix (A^T A or A A^T, k x k, k = min(m, n)) instead and start from its result.
    v.assign(static_cast<size_t>(n), 0.0);
    uint64_t x = seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(s.offset);
    for (auto& e : v) e = static_cast<double>(splitmix(x) >> 11) * 0x1p-53 * 2.0 - 1.0;
    const int64_t k = std::min(m, n);
    if (k <= kGramMaxSide && k > 1 && max_iters > 1)
      r.iters = gram_start(A, ld, m, n, v, tol, max_iters - 1, par);
  }
  {
    const double nv = norm2(v);
    for (auto& e : v) e /= nv;
  }
  std::vector<double> u(static_cast<size_t>(m)), w(static_cast<size_t>(n));
  const int first = r.iters;
  for (int it = first + 1; it <= max_iters; ++it) {  // max_iters counts both phases
    // u = A v (each row's dot product in column order)
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < m; ++i) {
      const float* row = A + i * ld;
      double acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += static_cast<double>(row[j]) * v[j];
      u[i] = acc;
    }
    r.iters = it;
    const double rho = [&] {
      double q = 0;
      for (double e : u) q += e * e;
      return q;
    }();  // v^T A^T A v, the Rayleigh quotient of A^T A
    if (rho == 0) {  // A v = 0: A = 0 (v was a unit vector of a nonzero A with prob. 1)
      r.sigma = 0;
      r.converged = true;
      return r;
    }
    // w = A^T u = A^T A v: each column's sum over rows in row order, columns split across
    // threads (the same sums whatever the number of threads).
    const int64_t blk = 256;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t j0 = 0; j0 < n; j0 += blk) {
      const int64_t j1 = std::min(n, j0 + blk);
      for (int64_t j = j0; j < j1; ++j) w[j] = 0;
      for (int64_t i = 0; i < m; ++i) {
        const float* row = A + i * ld;
        const double ui = u[i];
        for (int64_t j = j0; j < j1; ++j) w[j] += ui * static_cast<double>(row[j]);
      }
    }
    // Converged when v is an eigenvector of A^T A to tol: ||A^T A v - rho v|| <= tol rho.
    // (A criterion on the change of the estimate stops early when sigma_2 is close to
    // sigma_1 and each iteration gains little; the residual does not.)
    double res = 0, nw = 0;
    for (int64_t j = 0; j < n; ++j) {
      res += (w[j] - rho * v[j]) * (w[j] - rho * v[j]);
      nw += w[j] * w[j];
    }
    nw = std::sqrt(nw);
    r.sigma = nw / std::sqrt(rho);  // ||A^T A v|| / ||A v||: >= ||A v||, closer to sigma_1
    for (int64_t j = 0; j < n; ++j) v[j] = w[j] / nw;
    if (std::sqrt(res) <= tol * rho) {
      r.converged = true;
      break;
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Spike detector

ZScore SpikeDetector::score(double x) const {
  ZScore z;
  const size_t n = vals_.size();
  if (n < static_cast<size_t>(std::max(warmup_, 2)) || !std::isfinite(x)) return z;
  double mean = 0;
  for (double v : vals_) mean += v;
  mean /= static_cast<double>(n);
  double var = 0;
  for (double v : vals_) var += (v - mean) * (v - mean);
  var /= static_cast<double>(n);
  z.mean = mean;
  z.std = std::sqrt(var);
  if (!(z.std > 0)) return z;
  z.valid = true;
  z.z = (x - mean) / z.std;
  return z;
}

void SpikeDetector::push(double x) {
  if (!std::isfinite(x)) return;
  vals_.push_back(x);
  if (static_cast<int>(vals_.size()) > window_) vals_.erase(vals_.begin());
}

// ---------------------------------------------------------------------------------------
// Hooks

namespace {

std::string num(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string idx(int i) { return i < 0 ? std::string() : std::to_string(i); }

// Serialisation of the hook state: a flat little stream of u64 counts and f64 values.
struct Writer {
  std::vector<uint8_t> b;
  void u64(uint64_t x) {
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    b.insert(b.end(), p, p + 8);
  }
  void vec(const std::vector<double>& v) {
    u64(v.size());
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    b.insert(b.end(), p, p + v.size() * sizeof(double));
  }
};
struct Reader {
  const std::vector<uint8_t>& b;
  size_t pos = 0;
  uint64_t u64() {
    ST_CHECK(pos + 8 <= b.size(), "checkpoint hooks_state is truncated");
    uint64_t x;
    std::memcpy(&x, b.data() + pos, 8);
    pos += 8;
    return x;
  }
  std::vector<double> vec() {
    const uint64_t n = u64();
    ST_CHECK(n <= (b.size() - pos) / sizeof(double), "checkpoint hooks_state is truncated");
    std::vector<double> v(n);
    if (n) std::memcpy(v.data(), b.data() + pos, n * sizeof(double));  // (no memcpy from null)
    pos += n * sizeof(double);
    return v;
  }
};
constexpr uint64_t kStateMagic = 0x31305354484f4f4bull;  // "KOOHTS01"

// Keeps the header and the lines whose step (first CSV field, or "step" of a JSON line)
// is <= step, atomically (run_io.h); a partial last line (a crash while writing) is dropped.
void truncate_after(const std::string& path, int64_t step) {
  const bool jsonl = path.size() > 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
  rewrite_lines_atomic(path, [&](const std::string& line, size_t i) {
    if (i == 0 && !jsonl) return true;  // the CSV header
    int64_t s = -1;
    if (jsonl) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.contains("step") && j["step"].is_number_integer())
        s = j["step"].get<int64_t>();
    } else {
      const auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), s);
      if (ec != std::errc() || p == line.data()) s = -1;
    }
    return s >= 0 && s <= step;
  });
}

const char* const kFiles[] = {"spectral.csv",  "grad_norms.csv",  "attn_stats.csv",
                              "delta_drift.csv", "wasserstein.csv", "events.jsonl"};

}  // namespace

struct StabilityHooks::Impl {
  Config cfg;
  GPT2& model;
  std::string dir;
  std::shared_ptr<spdlog::logger> log;
  std::vector<WeightSlice> slices;    // with heads
  std::vector<size_t> matrices;       // indices into slices: 2-D (rows, cols > 1)
  std::vector<std::vector<double>> power;  // warm-start vector per matrix
  std::map<std::string, LogFile> files;  // checked appends (run_io.h)
  int L, NH, C, hs;
  SpikeDetector loss_z, gnorm_z;
  DeltaDriftTracker drift;
  std::vector<std::string> pending_drift;     // lines of the step being made
  int64_t drift_step = -1;
  bool stats_missing_logged = false;

  Impl(const Config& c, GPT2& m, const std::string& d, std::shared_ptr<spdlog::logger> lg)
      : cfg(c), model(m), dir(d), log(std::move(lg)),
        loss_z(c.hooks.spike_window, c.hooks.spike_warmup),
        gnorm_z(c.hooks.spike_window, c.hooks.spike_warmup),
        drift(m.config().n_layer, m.config().n_head, m.config().n_embd) {
    const GPT2Config& mc = model.config();
    L = mc.n_layer, NH = mc.n_head, C = mc.n_embd, hs = C / NH;
    slices = weight_slices(mc, true);
    for (size_t i = 0; i < slices.size(); ++i)
      if (slices[i].rows > 1 && slices[i].cols > 1) matrices.push_back(i);
    power.assign(matrices.size(), {});
  }

  LogFile& file(const std::string& name, const char* header) {
    auto it = files.find(name);
    if (it == files.end()) it = files.emplace(name, LogFile(dir + "/" + name, header)).first;
    return it->second;
  }

  void spectral(int64_t step) {
    const std::vector<float> w = model.master_fp32();
    const HooksSection& h = cfg.hooks;
    std::vector<PowerResult> res(matrices.size());
    // Big matrices split their matrix-vector products; the small ones run side by side.
    for (size_t k = 0; k < matrices.size(); ++k)
      if (slices[matrices[k]].numel() >= kParallelNumel)
        res[k] = spectral_norm(slices[matrices[k]], w.data(), power[k], h.power_tol,
                               h.power_iters, k);
#pragma omp parallel for schedule(dynamic)
    for (size_t k = 0; k < matrices.size(); ++k)
      if (slices[matrices[k]].numel() < kParallelNumel)
        res[k] = spectral_norm(slices[matrices[k]], w.data(), power[k], h.power_tol,
                               h.power_iters, k);
    LogFile& f = file("spectral.csv", "step,layer,head,matrix,sigma,iters,converged");
    int unconverged = 0;
    for (size_t k = 0; k < matrices.size(); ++k) {
      const WeightSlice& s = slices[matrices[k]];
      f << step << ',' << idx(s.layer) << ',' << idx(s.head) << ',' << s.tensor << ','
        << num(res[k].sigma) << ',' << res[k].iters << ',' << (res[k].converged ? 1 : 0) << "\n";
      unconverged += !res[k].converged;
    }
    f.flush();
    if (unconverged)
      log->warn("hooks: step {}: power iteration stopped at hooks.power_iters = {} before "
                "reaching hooks.power_tol for {} of {} matrices (converged = 0 in spectral.csv)",
                step, h.power_iters, unconverged, matrices.size());
  }

  void grad_norms(int64_t step) {
    const Tensor g = model.grads_flat();
    Tensor host = Tensor::empty({g.numel()}, DType::F64);
    model.backend().copy(host, g);
    const double* p = host.data<double>();
    const double scale = model.loss_scaler().enabled() ? model.loss_scaler().scale() : 1.0;
    LogFile& f = file("grad_norms.csv", "step,tensor,layer,head,norm");
    for (const WeightSlice& s : slices) {
      double ss = 0;
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t c = 0; c < s.cols; ++c) {
          const double x = p[s.offset + r * s.row_stride + c];
          ss += x * x;
        }
      f << step << ',' << s.tensor << ',' << idx(s.layer) << ',' << idx(s.head) << ','
        << num(std::sqrt(ss) / scale) << "\n";
    }
    f.flush();
  }

  void attn_stats(int64_t step) {
    LogFile& f = file("attn_stats.csv", "step,layer,head,stat,value");
    for (int l = 0; l < L; ++l) {
      const auto& st = model.attention(l).stats();
      if (static_cast<int>(st.size()) != NH) {
        if (!stats_missing_logged)
          log->warn("hooks: the {} attention of layer {} reports no statistics; "
                    "attn_stats.csv has no rows for it", model.attention(l).name(), l);
        stats_missing_logged = true;
        continue;
      }
      for (int h = 0; h < NH; ++h) {
        const AttentionHeadStats& s = st[h];
        const double rows = static_cast<double>(std::max<int64_t>(s.rows, 1));
        const std::pair<const char*, double> vals[] = {
            {"max_logit", s.max_logit},
            {"tied_row_frac", static_cast<double>(s.tied_rows) / rows},
            {"tied_in_tile_frac", static_cast<double>(s.tied_in_tile) / rows},
            {"p_one", static_cast<double>(s.p_one)},
            {"entropy", s.mean_entropy()}};
        for (const auto& [name, v] : vals)
          f << step << ',' << l << ',' << h << ',' << name << ',' << num(v) << "\n";
      }
    }
    f.flush();
  }

  // One layer's delta drift (GPT2 attention observer).
  void drift_layer(const AttentionTaps& t) {
    Backend& be = model.backend();
    auto host = [&](const Tensor& x) {
      Tensor h = Tensor::empty(x.shape(), DType::F64);
      be.copy(h, x);
      return h;
    };
    const Tensor qkv = host(t.qkv), dout = host(t.dout), ln1 = host(t.ln1);
    const int B = static_cast<int>(t.qkv.dim(0)), T = static_cast<int>(t.qkv.dim(1));
    const int R = cfg.hooks.drift_rows > 0 ? std::min(cfg.hooks.drift_rows, B) : B;
    const double unscale = model.loss_scaler().enabled() ? 1.0 / model.loss_scaler().scale() : 1.0;
    for (const DriftRow& o :
         drift.layer(t.layer, model.attention_configs().at(t.layer), model.compute(), B, T,
                     qkv.data<double>(), dout.data<double>(), ln1.data<double>(), R, unscale)) {
      auto opt = [](double v) { return std::isnan(v) ? std::string() : num(v); };
      pending_drift.push_back(std::to_string(drift_step) + ',' + std::to_string(o.layer) + ',' +
                              std::to_string(o.head) + ',' + num(o.drift) + ',' + num(o.cum) +
                              ',' + num(o.abs_err) + ',' + num(o.dwq_err) + ',' +
                              opt(o.dwq_rel) + ',' + opt(o.cos_prev));
    }
  }

  void write_drift() {
    // The backward visits layers last to first; the file lists them first to last.
    LogFile& f = file("delta_drift.csv",
                            "step,layer,head,delta_drift,delta_drift_cum,delta_abs_err,"
                            "dwq_err_norm,dwq_rel_err,dwq_cos_prev");
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < NH; ++h) {
        const size_t i = static_cast<size_t>(L - 1 - l) * NH + h;
        if (i < pending_drift.size()) f << pending_drift[i] << "\n";
      }
    f.flush();
    pending_drift.clear();
  }

  void reference(int64_t step) {
    const std::string path = cfg.hooks.reference_run + "/" + checkpoint_name(step);
    if (!fs::exists(path)) {
      log->info("hooks: reference run has no {} (no wasserstein.csv rows for step {})",
                checkpoint_name(step), step);
      return;
    }
    CheckpointWeights ref;
    try {
      ref = load_checkpoint_weights(path);
    } catch (const std::exception& e) {
      log->warn("hooks: reference checkpoint not read, no wasserstein.csv rows for step {}: {}",
                step, e.what());
      return;
    }
    const std::vector<float> w = model.master_fp32();
    if (ref.master.size() != w.size()) {
      log->warn("hooks: reference checkpoint {} holds {} weights, this model {}; skipped",
                path, ref.master.size(), w.size());
      return;
    }
    LogFile& f = file("wasserstein.csv", kDistanceCsvHeader);
    for (const DistanceRow& r : weight_distances(model.config(), w, ref.master))
      f << distance_csv_line(step, r) << "\n";
    f.flush();
  }
};

DeltaDriftTracker::DeltaDriftTracker(int n_layer, int n_head, int n_embd)
    : L_(n_layer), NH_(n_head), C_(n_embd),
      cum_(static_cast<size_t>(n_layer) * n_head, 0.0),
      prev_(static_cast<size_t>(n_layer) * n_head) {}

std::vector<DriftRow> DeltaDriftTracker::layer(int l, const AttentionConfig& run, DType fmt,
                                               int B, int T, const double* Qkv,
                                               const double* dO, const double* X, int R,
                                               double unscale) {
  ST_CHECK(l >= 0 && l < L_ && R >= 0 && R <= B, "delta drift: layer ", l, ", rows ", R);
  const int NH = NH_, C = C_, hs = C / NH;
  AttentionConfig ref;  // FP64 baseline: every rounding point FP64
  ref.kind = AttentionKind::Baseline;
  ref.causal = run.causal;
  std::vector<DriftRow> out(NH);
  const size_t C3 = 3 * static_cast<size_t>(C), n = static_cast<size_t>(T) * hs;
#pragma omp parallel for schedule(dynamic)
  for (int h = 0; h < NH; ++h) {
    const AttnNumerics nr = run.numerics(fmt, h), n64 = ref.numerics(DType::F64, h);
    std::vector<double> q(n), k(n), v(n), g(n), dq(n), dq64(n), dk(n), dv(n);
    std::vector<double> E(static_cast<size_t>(hs) * C, 0.0), G(E.size(), 0.0);
    DriftRow& o = out[h];
    o.layer = l;
    o.head = h;
    for (int b = 0; b < R; ++b) {
      for (int t = 0; t < T; ++t) {
        const double* row = Qkv + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
        const double* grow = dO + (static_cast<size_t>(b) * T + t) * C + h * hs;
        for (int j = 0; j < hs; ++j) {
          q[t * hs + j] = row[j];
          k[t * hs + j] = row[C + j];
          v[t * hs + j] = row[2 * C + j];
          g[t * hs + j] = grow[j];
        }
      }
      HeadForward fr, f64;
      head_forward(run, nr, T, hs, q.data(), k.data(), v.data(), fr);
      head_forward(ref, n64, T, hs, q.data(), k.data(), v.data(), f64);
      const auto d_run = head_deltas(run, nr, T, hs, q.data(), k.data(), v.data(), fr, g.data());
      const auto d_64 = head_deltas(ref, n64, T, hs, q.data(), k.data(), v.data(), f64, g.data());
      for (int t = 0; t < T; ++t) {
        o.drift += d_run[t] - d_64[t];
        o.abs_err += std::abs(d_run[t] - d_64[t]);
      }
      head_backward(run, nr, T, hs, q.data(), k.data(), v.data(), fr, g.data(), dq.data(),
                    dk.data(), dv.data());
      head_backward(ref, n64, T, hs, q.data(), k.data(), v.data(), f64, g.data(), dq64.data(),
                    dk.data(), dv.data());
      // dW_Q (hs x C) = sum over rows of dQ[t]^T ln1[t]: its error and the FP64 reference.
      for (int t = 0; t < T; ++t) {
        const double* x = X + (static_cast<size_t>(b) * T + t) * C;
        for (int i = 0; i < hs; ++i) {
          const double e = dq[t * hs + i] - dq64[t * hs + i], r = dq64[t * hs + i];
          double* Ei = E.data() + static_cast<size_t>(i) * C;
          double* Gi = G.data() + static_cast<size_t>(i) * C;
          for (int c = 0; c < C; ++c) {
            Ei[c] += e * x[c];
            Gi[c] += r * x[c];
          }
        }
      }
    }
    o.drift *= unscale;
    o.abs_err *= unscale;
    const double en = norm2(E), gn = norm2(G);
    o.dwq_err = en * unscale;
    if (gn > 0) o.dwq_rel = en / gn;
    std::vector<double>& prev = prev_[static_cast<size_t>(l) * NH + h];
    if (en > 0) {
      for (auto& e : E) e /= en;
      if (prev.size() == E.size()) {
        double dot = 0;
        for (size_t i = 0; i < E.size(); ++i) dot += E[i] * prev[i];
        o.cos_prev = dot;
      }
      prev = std::move(E);
    }
  }
  for (int h = 0; h < NH; ++h) out[h].cum = cum_[static_cast<size_t>(l) * NH + h] += out[h].drift;
  return out;
}

void check_reference_run(const Config& cfg) {
  const std::string& dir = cfg.hooks.reference_run;
  if (dir.empty()) return;
  const std::string where = cfg.source + ": hooks.reference_run";
  if (!fs::is_directory(dir))
    fail(where, ": '", dir, "' is not a run directory (train the reference run first, or "
         "leave hooks.reference_run empty)");
  const std::string cy = dir + "/config.yaml";
  if (!fs::exists(cy)) fail(where, ": '", dir, "' has no config.yaml: not a run directory");
  Config rc;
  try {  // the reference's resolved config, through the config parser (bounds, one document)
    rc = load_config(cy);
  } catch (const std::exception& e) {
    fail(where, ": ", e.what());
  }
  const std::pair<const char*, int> ours[] = {{"n_layer", cfg.model.n_layer},
                                              {"n_head", cfg.model.n_head},
                                              {"n_embd", cfg.model.n_embd},
                                              {"max_seq_len", cfg.model.max_seq_len},
                                              {"vocab_size", cfg.model.vocab_size}};
  const int theirs[] = {rc.model.n_layer, rc.model.n_head, rc.model.n_embd, rc.model.max_seq_len,
                        rc.model.vocab_size};
  for (size_t i = 0; i < std::size(ours); ++i) {
    const auto& [key, v] = ours[i];
    const int r = theirs[i];
    if (r != v)
      fail(where, ": the reference run's model.", key, " is ", r, ", this run's ", v,
           " (weights of different shapes cannot be compared)");
  }
}

StabilityHooks::StabilityHooks(const Config& cfg, GPT2& model, const std::string& run_dir,
                               std::shared_ptr<spdlog::logger> log)
    : cfg_(cfg.hooks) {
  check_reference_run(cfg);
  impl_ = std::make_unique<Impl>(cfg, model, run_dir, std::move(log));
}

StabilityHooks::~StabilityHooks() { impl_->model.set_attention_observer(nullptr); }

namespace {
struct Timer {
  double& acc;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  explicit Timer(double& a) : acc(a) {}
  ~Timer() {
    acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};
}  // namespace

bool StabilityHooks::is_hook_step(int64_t s) const {
  if (cfg_.every <= 0 || s <= 0) return false;
  const TrainSection& t = impl_->cfg.train;
  return s % cfg_.every == 0 || (t.ckpt_every > 0 && s % t.ckpt_every == 0) ||
         s == t.max_steps;
}

void StabilityHooks::resume(int64_t step, const std::vector<uint8_t>& state) {
  for (const char* f : kFiles) truncate_after(impl_->dir + "/" + f, step);
  if (state.empty()) {
    if (enabled())
      impl_->log->warn("hooks: the checkpoint holds no hook state (written without hooks or "
                       "by an older build): power iteration starts cold, delta_drift_cum "
                       "and the spike window start empty");
    return;
  }
  Impl& m = *impl_;
  Reader r{state};
  ST_CHECK(r.u64() == kStateMagic, "checkpoint hooks_state: unknown layout");
  const uint64_t np = r.u64(), nd = r.u64();
  if (np != m.power.size() || nd != m.drift.prev().size()) {
    m.log->warn("hooks: the checkpoint's hook state is for another model; starting it afresh");
    return;
  }
  for (auto& v : m.power) v = r.vec();
  m.drift.cum() = r.vec();
  for (auto& v : m.drift.prev()) v = r.vec();
  m.loss_z.set_values(r.vec());
  m.gnorm_z.set_values(r.vec());
  ST_CHECK(m.drift.cum().size() == nd && r.pos == state.size(),
           "checkpoint hooks_state: inconsistent sizes");
}

std::vector<uint8_t> StabilityHooks::state() const {
  Impl& m = *impl_;
  Writer w;
  w.u64(kStateMagic);
  w.u64(m.power.size());
  w.u64(m.drift.prev().size());
  for (const auto& v : m.power) w.vec(v);
  w.vec(m.drift.cum());
  for (const auto& v : m.drift.prev()) w.vec(v);
  w.vec(m.loss_z.values());
  w.vec(m.gnorm_z.values());
  return w.b;
}

void StabilityHooks::at_start() {
  if (!enabled() || !cfg_.spectral) return;
  {
    Timer t(seconds_);
    impl_->spectral(0);
  }
  impl_->log->info("hooks: step 0 (initial weights): {:.2f} s", seconds_);
}

void StabilityHooks::begin_step(int64_t s) {
  if (!is_hook_step(s)) return;
  step_start_seconds_ = seconds_;
  if (cfg_.attn_stats) impl_->model.set_collect_attention_stats(true);
}

void StabilityHooks::before_last_backward(int64_t s) {
  if (!is_hook_step(s) || !cfg_.delta_drift) return;
  impl_->drift_step = s;
  impl_->pending_drift.clear();
  impl_->model.set_attention_observer([this](const AttentionTaps& t) {
    Timer tm(seconds_);
    impl_->drift_layer(t);
  });
}

void StabilityHooks::after_backward(int64_t s) {
  if (!is_hook_step(s)) return;
  Timer t(seconds_);
  Impl& m = *impl_;
  if (cfg_.delta_drift) {
    m.model.set_attention_observer(nullptr);
    m.write_drift();
  }
  if (cfg_.attn_stats) {
    m.attn_stats(s);
    m.model.set_collect_attention_stats(false);
  }
  if (cfg_.grad_norms) m.grad_norms(s);
}

SpikeDecision StabilityHooks::check_spike(int64_t s, double loss, double grad_norm) {
  SpikeDecision d;
  if (cfg_.spike_z <= 0) return d;
  Impl& m = *impl_;
  const std::pair<const char*, ZScore> scores[] = {{"loss", m.loss_z.score(loss)},
                                                   {"grad_norm", m.gnorm_z.score(grad_norm)}};
  const double vals[] = {loss, grad_norm};
  for (int i = 0; i < 2; ++i)
    if (scores[i].second.valid && scores[i].second.z > cfg_.spike_z) d.spike = true;
  m.loss_z.push(loss);
  m.gnorm_z.push(grad_norm);
  if (!d.spike) return d;
  d.snapshot = cfg_.spike_snapshot;
  d.skip = cfg_.spike_skip;
  const std::string action = d.snapshot && d.skip ? "snapshot+skip"
                             : d.snapshot         ? "snapshot"
                             : d.skip             ? "skip"
                                                  : "log";
  for (int i = 0; i < 2; ++i) {
    const ZScore& z = scores[i].second;
    if (!(z.valid && z.z > cfg_.spike_z)) continue;
    event(s, "spike", {{"metric", scores[i].first}, {"value", vals[i]}, {"mean", z.mean},
                       {"std", z.std}, {"z", z.z}, {"action", action}});
    m.log->warn("step {}: {} spike: {} = {:.4g}, {:.1f} standard deviations above the mean "
                "{:.4g} of the last {} steps ({})", s, scores[i].first, scores[i].first,
                vals[i], z.z, z.mean, i == 0 ? m.loss_z.values().size() : m.gnorm_z.values().size(),
                action);
  }
  return d;
}

void StabilityHooks::after_update(int64_t s) {
  if (!is_hook_step(s)) return;
  if (cfg_.spectral) {
    Timer t(seconds_);
    impl_->spectral(s);
  }
  impl_->log->info("hooks: step {}: {:.2f} s", s, seconds_ - step_start_seconds_);
}

void StabilityHooks::at_checkpoint(int64_t s) {
  if (cfg_.reference_run.empty()) return;
  Timer t(seconds_);
  impl_->reference(s);
}

void StabilityHooks::event(int64_t s, const std::string& name,
                           const nlohmann::ordered_json& fields) {
  nlohmann::ordered_json j = {{"step", s}, {"event", name}};
  for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = it.value();
  LogFile& f = impl_->file("events.jsonl", nullptr);
  f << j.dump() << "\n";
  f.flush();
}

}  // namespace st
