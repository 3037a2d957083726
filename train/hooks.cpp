// Stability hooks (train/hooks.h): StabilityHooks and its Impl, which write the hook files
// (spectral.csv, grad_norms.csv, attn_stats.csv, delta_drift.csv, wasserstein.csv,
// events.jsonl), truncate them on resume and save the hook state in checkpoints; and
// check_reference_run. The power iteration is in hooks_spectral.cpp, the delta-drift
// tracker and the spike detector in hooks_drift.cpp. Everything here reads the model and
// writes files; the only effect on training is the opt-in spike skip, decided by the trainer.
#include "train/hooks.h"


#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <numeric>

#include "analysis/weight_distance.h"
#include "core/error.h"
#include "train/hooks_internal.h"
#include "train/progress.h"
#include "train/run_io.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace st {


// ---------------------------------------------------------------------------------------
// Hooks

namespace {

std::string num(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
// -1: not per layer / not per head (an integer, so pandas reads the column as int64).
std::string idx(int i) { return std::to_string(i < 0 ? -1 : i); }

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
// Rounding leaves a normalised vector of n doubles within ~sqrt(n) * 1.1e-16 of length 1.
constexpr double kUnitTolerance = 1e-12;
// Reads the hook state back; any defect is an st::Error naming the field and its byte
// offset (the checkpoint's checksum was valid, so the state was written by another build
// or edited: nothing in it is trusted).
struct Reader {
  const std::vector<uint8_t>& b;
  size_t pos = 0;
  [[noreturn]] void bad(size_t at, const std::string& what) const {
    fail("checkpoint hooks_state is damaged: ", what, " (byte ", at, " of ", b.size(),
         "); resume from an earlier checkpoint, or start the run again with --overwrite");
  }
  uint64_t u64(const char* what) {
    if (pos + 8 > b.size()) bad(pos, std::string(what) + " is cut off (the state ends)");
    uint64_t x;
    std::memcpy(&x, b.data() + pos, 8);
    pos += 8;
    return x;
  }
  // A vector of finite values whose length is one of `sizes` (none given: any length the
  // state holds); `unit`: of length 1 (the power-iteration and error-direction vectors are
  // normalised when written).
  std::vector<double> vec(const std::string& what, std::initializer_list<uint64_t> sizes,
                          bool unit = false) {
    const size_t at = pos;
    const uint64_t n = u64(what.c_str());
    bool size_ok = sizes.size() == 0;
    for (uint64_t k : sizes) size_ok |= n == k;
    if (!size_ok) {
      std::string want;
      for (uint64_t k : sizes) want += (want.empty() ? "" : " or ") + std::to_string(k);
      bad(at, what + " holds " + std::to_string(n) + " values, expected " + want);
    }
    if (n > (b.size() - pos) / sizeof(double))
      bad(at, what + " is cut off (" + std::to_string(n) + " values, the state ends)");
    std::vector<double> v(n);
    if (n) std::memcpy(v.data(), b.data() + pos, n * sizeof(double));  // (no memcpy from null)
    double ss = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(v[i]))
        bad(pos + i * sizeof(double), what + " value " + std::to_string(i) + " is " + num(v[i]));
      ss += v[i] * v[i];
    }
    if (unit && n && !(std::fabs(std::sqrt(ss) - 1.0) <= kUnitTolerance))
      bad(at, what + " has length " + num(std::sqrt(ss)) + ", expected a unit vector");
    pos += n * sizeof(double);
    return v;
  }
  // The spike detector's window: finite values >= 0 (losses, gradient norms).
  std::vector<double> window(const std::string& what) {
    const size_t at = pos;
    std::vector<double> v = vec(what, {});
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] < 0) bad(at + 8 + i * 8, what + " value " + std::to_string(i) + " is " + num(v[i]) +
                        ", expected >= 0");
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
  bool drift_cudnn_logged = false;

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
    // A progress line at most every 5 s once the hook has run for 5 s (train/progress.h).
    const auto t0 = std::chrono::steady_clock::now();
    SlowProgress progress;
    size_t done = 0;
    auto finished = [&] {
#pragma omp critical(st_hooks_progress)
      {
        ++done;
        const double el =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (progress.due(el))
          log->info("hooks step {}: spectral_norm {}/{} matrices, {:.1f} s", step, done,
                    matrices.size(), el);
      }
    };
    // One matrix per thread at a time, the biggest first (wte); a matrix's result does
    // not depend on the threads (hooks_spectral.h), so neither does the order. (Splitting
    // each product across threads instead costs a fork and join per pass, which stalls
    // when the cores are shared.)
    std::vector<size_t> order(matrices.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return slices[matrices[a]].numel() > slices[matrices[b]].numel();
    });
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < order.size(); ++i) {
      const size_t k = order[i];
      res[k] = spectral_norm(slices[matrices[k]], w.data(), power[k], h.power_tol,
                             h.power_iters, k);
      finished();
    }
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
            {"p_tilde_one", static_cast<double>(s.p_tilde_one)},
            {"entropy", s.mean_entropy()}};
        for (const auto& [name, v] : vals) {
          if (v < 0 && std::string(name) == "p_tilde_one") continue;  // not measured (cudnn)
          f << step << ',' << l << ',' << h << ',' << name << ',' << num(v) << "\n";
        }
      }
    }
    f.flush();
  }

  // One layer's delta drift (GPT2 attention observer).
  void drift_layer(const AttentionTaps& t) {
    if (model.attention_configs().at(t.layer).kind == AttentionKind::Cudnn) {
      if (!drift_cudnn_logged)
        log->warn("hooks: the delta drift recomputes a layer's attention in the CPU lab, which "
                  "cannot run cudnn (NVIDIA's kernel): delta_drift.csv has no rows for cudnn "
                  "layers (first: layer {})", t.layer);
      drift_cudnn_logged = true;
      return;
    }
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
      // An undefined value is an empty field (pandas and apps/report read it as NaN):
      // dwq_rel_err when the FP64 dW_Q is 0; dwq_cos_prev when this step's dW_Q error is
      // exactly 0 or no earlier hook step had a nonzero one (the first hook step: there is
      // no previous error direction to take a cosine with).
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
    : cfg_(cfg.hooks), schedule_(HookSchedule::of(cfg)) {
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

HookSchedule HookSchedule::of(const Config& cfg) {
  return {cfg.hooks.every, cfg.train.ckpt_every, cfg.train.max_steps};
}

bool HookSchedule::is_hook_step(int64_t s) const {
  if (every <= 0 || s <= 0) return false;
  return s % every == 0 || (ckpt_every > 0 && s % ckpt_every == 0) || s == max_steps;
}

int64_t HookSchedule::hook_steps_after(int64_t after) const {
  const int64_t a = std::max<int64_t>(after, 0), b = max_steps;  // steps <= 0 never are
  if (every <= 0 || b <= a) return 0;
  const auto multiples = [&](int64_t m) { return b / m - a / m; };  // of m in (a, b]
  int64_t n = multiples(every);
  if (ckpt_every > 0) n += multiples(ckpt_every) - multiples(std::lcm(every, ckpt_every));
  const bool last_counted = b % every == 0 || (ckpt_every > 0 && b % ckpt_every == 0);
  return n + (last_counted ? 0 : 1);
}

void StabilityHooks::resume(int64_t step, const std::vector<uint8_t>& state) {
  auto cut_files = [&] {
    for (const char* f : kFiles) truncate_after(impl_->dir + "/" + f, step);
  };
  if (state.empty()) {
    cut_files();
    if (enabled())
      impl_->log->warn("hooks: the checkpoint holds no hook state (written without hooks or "
                       "by an older build): power iteration starts cold, delta_drift_cum "
                       "and the spike window start empty");
    return;
  }
  Impl& m = *impl_;
  Reader r{state};
  if (r.u64("the layout tag") != kStateMagic) r.bad(0, "unknown layout tag");
  const uint64_t np = r.u64("the count of power-iteration vectors");
  if (np != m.power.size())
    r.bad(8, std::to_string(np) + " power-iteration vectors, this model has " +
                 std::to_string(m.power.size()) + " matrices");
  const uint64_t nd = r.u64("the count of delta-drift heads");
  if (nd != m.drift.prev().size())
    r.bad(16, std::to_string(nd) + " delta-drift heads, this model has " +
                  std::to_string(m.drift.prev().size()));
  // Everything is read and checked before any of it is used.
  std::vector<std::vector<double>> power(np), prev(nd);
  for (size_t k = 0; k < np; ++k) {  // empty until the first spectral hook ran
    const WeightSlice& sl = m.slices[m.matrices[k]];
    power[k] = r.vec("power-iteration vector " + std::to_string(k) + " (" + slice_label(sl) + ")",
                     {0, static_cast<uint64_t>(sl.cols)}, true);
  }
  std::vector<double> cum = r.vec("delta_drift_cum", {nd});
  const uint64_t dir_len = static_cast<uint64_t>(m.hs) * static_cast<uint64_t>(m.C);
  for (size_t k = 0; k < nd; ++k)  // empty until the head's first delta-drift hook
    prev[k] = r.vec("error direction of head " + std::to_string(k), {0, dir_len}, true);
  std::vector<double> loss_w = r.window("the loss spike window");
  std::vector<double> gnorm_w = r.window("the gradient-norm spike window");
  if (r.pos != state.size())
    r.bad(r.pos, std::to_string(state.size() - r.pos) + " bytes after the last field");
  cut_files();  // only once the state is known good: a refused resume changes no file
  m.power = std::move(power);
  m.drift.cum() = std::move(cum);
  m.drift.prev() = std::move(prev);
  m.loss_z.set_values(std::move(loss_w));
  m.gnorm_z.set_values(std::move(gnorm_w));
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
