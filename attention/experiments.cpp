// Attention numerics experiments (see experiments.h): deviation statistics and the
// Qiu & Yao tied-maximum bias experiment, run through head_forward / head_deltas.
#include "attention/experiments.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "attention/head_cpu.h"
#include "core/error.h"
#include "core/rng.h"

namespace st {

void DeviationStats::merge(const DeviationStats& o) {
  if (o.max > max || o.max != o.max) max = o.max;
  sum += o.sum;
  sumsq += o.sumsq;
  n += o.n;
}

double DeviationStats::sd() const {
  if (n == 0) return 0.0;
  const double m = mean();
  return std::sqrt(std::max(0.0, sumsq / n - m * m));
}

void add_deviation(DeviationStats& s, const double* a, const double* b, size_t count) {
  for (size_t i = 0; i < count; ++i) s.add(std::fabs(a[i] - b[i]));
}

const char* bias_rows_name(BiasRows r) {
  switch (r) {
    case BiasRows::TiedTile: return "tied_tile";
    case BiasRows::TiedAny: return "tied_any";
    case BiasRows::Single: return "single";
    case BiasRows::Diffuse: return "diffuse";
  }
  return "?";
}

BiasRows parse_bias_rows(const std::string& s) {
  for (BiasRows r : {BiasRows::TiedTile, BiasRows::TiedAny, BiasRows::Single, BiasRows::Diffuse})
    if (s == bias_rows_name(r)) return r;
  fail("unknown row kind '", s, "' (expected tied_tile, tied_any, single or diffuse)");
}

const char* bias_accum_name(BiasAccum a) {
  return a == BiasAccum::Bf16 ? "bf16_accum" : "fp32_accum";
}

const char* dout_kind_name(DoutKind k) { return k == DoutKind::Ones ? "ones" : "normal"; }

DoutKind parse_dout_kind(const std::string& s) {
  if (s == "ones") return DoutKind::Ones;
  if (s == "normal") return DoutKind::Normal;
  fail("unknown dO kind '", s, "' (expected ones or normal)");
}

double InputDist::draw(Rng& rng) const {
  switch (kind) {
    case Kind::Normal: return a + b * rng.normal();
    case Kind::Uniform: return a + (b - a) * rng.uniform();
    case Kind::Outliers: {
      const double x = a + b * rng.normal();
      return rng.uniform() < frac ? x * scale : x;
    }
  }
  return 0;
}

std::string InputDist::str() const {
  char buf[128];
  switch (kind) {
    case Kind::Normal: std::snprintf(buf, sizeof buf, "normal:%g:%g", a, b); break;
    case Kind::Uniform: std::snprintf(buf, sizeof buf, "uniform:%g:%g", a, b); break;
    case Kind::Outliers:
      std::snprintf(buf, sizeof buf, "outliers:%g:%g:%g:%g", a, b, frac, scale);
      break;
  }
  return buf;
}

InputDist parse_input_dist(const std::string& s, const std::string& what) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == ':') {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  const char* expect =
      "normal:MEAN:STD, uniform:LO:HI or outliers:MEAN:STD:FRAC:SCALE (e.g. normal:0.7:0.3)";
  std::vector<double> x;
  for (size_t i = 1; i < parts.size(); ++i) {
    char* end = nullptr;
    const double v = std::strtod(parts[i].c_str(), &end);
    if (parts[i].empty() || *end != '\0' || !std::isfinite(v))
      fail(what, ": '", s, "' has '", parts[i], "' where a number belongs; expected ", expect);
    x.push_back(v);
  }
  InputDist d;
  if (parts[0] == "normal" && x.size() == 2 && x[1] >= 0) {
    d = {InputDist::Kind::Normal, x[0], x[1]};
  } else if (parts[0] == "uniform" && x.size() == 2 && x[0] <= x[1]) {
    d = {InputDist::Kind::Uniform, x[0], x[1]};
  } else if (parts[0] == "outliers" && x.size() == 4 && x[1] >= 0 && x[2] >= 0 && x[2] <= 1) {
    d = {InputDist::Kind::Outliers, x[0], x[1], x[2], x[3]};
  } else {
    fail(what, ": '", s, "' is not a distribution; expected ", expect,
         " with STD >= 0, LO <= HI and 0 <= FRAC <= 1");
  }
  return d;
}

std::string stabilized_label(double beta) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "stabilized_b%g", beta);
  return buf;
}

const BiasSeries* BiasReport::find(BiasRows kind, BiasAccum accum, const std::string& backend,
                                   const std::string& quantity, const std::string& delta_mode,
                                   const std::string& dout) const {
  for (const auto& s : series)
    if (s.kind == kind && s.accum == accum && s.backend == backend && s.quantity == quantity &&
        s.delta_mode == delta_mode && s.dout == dout)
      return &s;
  return nullptr;
}

namespace {

struct Backend {
  std::string label;
  AttentionKind kind;
  double beta;
};

constexpr DeltaMode kDeltaModes[] = {DeltaMode::O, DeltaMode::OSplit, DeltaMode::OFp32,
                                     DeltaMode::DpP, DeltaMode::Fp32Recompute};

AttentionConfig backend_config(const BiasConfig& bc, const Backend& b, BiasAccum accum) {
  AttentionConfig c;
  c.kind = b.kind;
  c.causal = false;
  c.rule = RoundingRule::Gpu;
  c.block_q = 64;
  c.block_k = bc.block_k;
  c.beta = b.beta;
  c.tie_shift = bc.tie_shift;
  if (b.kind != AttentionKind::Baseline) {
    c.o_tilde_bits = bc.o_tilde_bits;
    c.o_tilde_gain = bc.o_tilde_gain;
    c.o_tilde_scope = bc.o_tilde_scope;
  }
  if (accum == BiasAccum::Bf16) c.accum = bc.compute;
  c.scores = bc.scores;
  c.probs = bc.probs;
  c.lsum = bc.lsum;
  c.lsum_mac = bc.lsum_mac;
  c.out = bc.out;
  return c;
}

std::string series_key(BiasRows k, BiasAccum a, const std::string& b, const std::string& q,
                       const std::string& mode, const std::string& dout) {
  return std::string(bias_rows_name(k)) + "|" + bias_accum_name(a) + "|" + b + "|" + q + "|" +
         mode + "|" + dout;
}

// Per-row errors of every series, filled by the head calls.
struct Collector {
  std::vector<BiasSeries> series;
  std::vector<std::vector<double>> err, abs_err;  // [series][row]
  std::map<std::string, int> index;
  int add(BiasRows k, BiasAccum a, const std::string& b, const std::string& q,
          const std::string& mode, const std::string& dout, size_t rows) {
    BiasSeries s{k, a, b, q, mode, dout};
    index[series_key(k, a, b, q, mode, dout)] = static_cast<int>(series.size());
    series.push_back(s);
    err.emplace_back(rows, 0.0);
    abs_err.emplace_back(rows, 0.0);
    return static_cast<int>(series.size()) - 1;
  }
  int at(BiasRows k, BiasAccum a, const std::string& b, const std::string& q,
         const std::string& mode = "", const std::string& dout = "") const {
    auto it = index.find(series_key(k, a, b, q, mode, dout));
    ST_CHECK(it != index.end(), "bias series ", series_key(k, a, b, q, mode, dout), " missing");
    return it->second;
  }
};

// The head call's inputs: dot products chosen per row (see experiments.h).
struct CallInputs {
  std::vector<double> dots;      // (R, T): q_r.k_s, exact in FP32
  std::vector<double> v, dout[2];  // v (T, d) and dO (R, d) each, in the compute format
  std::vector<char> same_tile;   // per row: all ties inside one key tile
};

void make_inputs(const BiasConfig& bc, BiasRows kind, Rng& rng, CallInputs& in) {
  const int T = bc.keys, d = bc.d, R = bc.rows_per_call;
  in.dots.assign(static_cast<size_t>(R) * T, 0.0);
  in.v.resize(static_cast<size_t>(T) * d);
  in.same_tile.assign(R, 0);
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  std::vector<double> S(T);
  std::vector<int> pos;
  for (int r = 0; r < R; ++r) {
    pos.clear();
    const int nt = kind == BiasRows::Single ? 1 : (kind == BiasRows::Diffuse ? 0 : bc.ties);
    if (kind == BiasRows::TiedTile) {
      const int tiles = (T + bc.block_k - 1) / bc.block_k;
      int c0 = 0, w = 0;
      do {
        c0 = static_cast<int>(rng.below(tiles)) * bc.block_k;
        w = std::min(bc.block_k, T - c0);
      } while (w < nt);
      while (static_cast<int>(pos.size()) < nt) {
        const int p = c0 + static_cast<int>(rng.below(w));
        if (std::find(pos.begin(), pos.end(), p) == pos.end()) pos.push_back(p);
      }
    } else {
      while (static_cast<int>(pos.size()) < nt) {
        const int p = static_cast<int>(rng.below(T));
        if (std::find(pos.begin(), pos.end(), p) == pos.end()) pos.push_back(p);
      }
    }
    const double top = bc.top_spread > 0 ? bc.top + bc.top_spread * (rng.uniform() - 0.5) : bc.top;
    for (int s = 0; s < T; ++s) {
      const double u = rng.uniform();
      S[s] = kind == BiasRows::Diffuse ? top - bc.diffuse_width * u
                                       : top - (bc.gap_lo + (bc.gap_hi - bc.gap_lo) * u);
    }
    for (int p : pos) S[p] = top;
    bool same = nt > 1;
    for (int p : pos) same = same && p / bc.block_k == pos[0] / bc.block_k;
    in.same_tile[r] = same;
    for (int s = 0; s < T; ++s) {
      const double X = S[s] * sqrt_d;
      const double hi = round_fmt(X, DType::BF16);
      in.dots[static_cast<size_t>(r) * T + s] = hi + round_fmt(X - hi, DType::BF16);
    }
  }
  for (double& x : in.v) x = round_fmt(bc.v.draw(rng), bc.compute);
  in.dout[0].assign(static_cast<size_t>(R) * d, 1.0);
  in.dout[1].resize(static_cast<size_t>(R) * d);
  for (double& x : in.dout[1]) x = round_fmt(rng.normal(), bc.compute);
}

}  // namespace

BiasReport run_bias_experiment(const BiasConfig& bc) {
  ST_CHECK(bc.d >= 1 && bc.d <= 1024, "bias experiment: head dim ", bc.d,
           ", expected 1..1024");
  ST_CHECK(bc.rows_per_call >= 1, "bias experiment: rows per call = ", bc.rows_per_call);
  ST_CHECK(bc.compute == DType::BF16 || bc.compute == DType::F16,
           "bias experiment: compute format ", dtype_name(bc.compute), ", expected bf16 or fp16");
  ST_CHECK(bc.keys >= 2 && bc.block_k >= 1, "bias experiment: keys = ", bc.keys,
           ", block_k = ", bc.block_k);
  ST_CHECK(bc.ties >= 2 && bc.ties <= std::min(bc.block_k, bc.keys),
           "bias experiment: ties = ", bc.ties, ", expected 2..min(block_k, keys)");
  ST_CHECK(bc.rows >= 2, "bias experiment: rows = ", bc.rows, ", expected at least 2");
  ST_CHECK((bc.rows + bc.rows_per_call - 1) / bc.rows_per_call >= 2, "bias experiment: ",
           bc.rows, " rows at ", bc.rows_per_call,
           " per call make one call; the standard error needs at least 2 (more rows or fewer "
           "rows per call)");
  ST_CHECK(bc.gap_lo > 0 && bc.gap_hi >= bc.gap_lo, "bias experiment: gap ", bc.gap_lo, "..",
           bc.gap_hi);
  const auto t0 = std::chrono::steady_clock::now();
  const int T = bc.keys, d = bc.d, P = bc.rows_per_call;
  const int calls = (bc.rows + P - 1) / P;
  const size_t rows = static_cast<size_t>(calls) * P;

  std::vector<Backend> backends{{"flash", AttentionKind::Flash, 2.0}};
  for (double b : bc.betas)
    backends.push_back({stabilized_label(b) + (bc.tie_shift == TieShift::ExactSum ? "_exact_sum" : ""),
                        AttentionKind::StabilizedFlash, b});
  if (bc.baseline) backends.push_back({"baseline", AttentionKind::Baseline, 2.0});

  Collector col;
  for (BiasRows kind : bc.kinds)
    for (BiasAccum a : bc.accums) {
      col.add(kind, a, "fp64_rounded", "o", "", "", rows);
      for (const auto& b : backends) {
        col.add(kind, a, b.label, "o", "", "", rows);
        col.add(kind, a, b.label, "o32", "", "", rows);
      }
      if (!bc.deltas) continue;
      for (DoutKind dk : bc.douts)
        for (const auto& b : backends) {
          if (b.kind == AttentionKind::Baseline) {
            col.add(kind, a, b.label, "delta", "dp_p", dout_kind_name(dk), rows);
            continue;
          }
          for (DeltaMode m : kDeltaModes)
            col.add(kind, a, b.label, "delta", delta_mode_name(m), dout_kind_name(dk), rows);
        }
    }

  const int nk = static_cast<int>(bc.kinds.size());
  std::vector<char> same_tile(static_cast<size_t>(nk) * rows, 0);
  const int threads = bc.threads > 0 ? bc.threads : omp_get_max_threads();
  const AttentionConfig gold_cfg = [&] {
    AttentionConfig c;
    c.kind = AttentionKind::Baseline;
    c.causal = false;
    return c;
  }();
  const AttnNumerics gold_n = numerics_for_rule(RoundingRule::Gpu, DType::F64, false);

  // Each (kind, call) writes only its own rows of every series, so the result does not
  // depend on the thread count or schedule.
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (int job = 0; job < nk * calls; ++job) {
    const int ki = job / calls, call = job % calls;
    const BiasRows kind = bc.kinds[ki];
    Rng rng(bc.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(ki) * 1000003ull +
            static_cast<uint64_t>(call) + 1);
    CallInputs in;
    make_inputs(bc, kind, rng, in);
    const size_t row0 = static_cast<size_t>(call) * P;
    for (int r = 0; r < P; ++r) same_tile[ki * rows + row0 + r] = in.same_tile[r];
    HeadForward gold;
    head_forward_dots(gold_cfg, gold_n, P, T, d, in.dots.data(), in.v.data(), gold);
    // Records row errors err(r, j) (signed) for series `id`.
    auto record_o = [&](int id, const std::vector<double>& o) {
      for (int r = 0; r < P; ++r) {
        double s = 0, a = 0;
        for (int j = 0; j < d; ++j) {
          const double e = o[static_cast<size_t>(r) * d + j] - gold.o[static_cast<size_t>(r) * d + j];
          s += e;
          a += std::fabs(e);
        }
        col.err[id][row0 + r] = s / d;
        col.abs_err[id][row0 + r] = a / d;
      }
    };
    std::vector<double> gold_delta[2];
    for (int k = 0; k < 2; ++k) {
      gold_delta[k].assign(P, 0.0);
      for (int r = 0; r < P; ++r)
        for (int j = 0; j < d; ++j)
          gold_delta[k][r] +=
              in.dout[k][static_cast<size_t>(r) * d + j] * gold.o[static_cast<size_t>(r) * d + j];
    }
    std::vector<double> rounded_gold(gold.o);
    for (double& x : rounded_gold) x = round_fmt(x, bc.compute);
    for (BiasAccum a : bc.accums) {
      record_o(col.at(kind, a, "fp64_rounded", "o"), rounded_gold);
      for (const auto& b : backends) {
        AttentionConfig cfg = backend_config(bc, b, a);
        HeadForward fw;
        head_forward_dots(cfg, cfg.numerics(bc.compute, 0), P, T, d, in.dots.data(),
                          in.v.data(), fw);
        record_o(col.at(kind, a, b.label, "o"), fw.o);
        record_o(col.at(kind, a, b.label, "o32"), fw.o32);
        if (!bc.deltas) continue;
        for (DoutKind dk : bc.douts) {
          const int di = dk == DoutKind::Ones ? 0 : 1;
          for (DeltaMode m : kDeltaModes) {
            if (b.kind == AttentionKind::Baseline && m != DeltaMode::DpP) continue;
            cfg.delta = m;
            const auto delta =
                head_deltas_dots(cfg, cfg.numerics(bc.compute, 0), P, T, d, in.dots.data(),
                                 in.v.data(), fw, in.dout[di].data());
            const int id = col.at(kind, a, b.label, "delta", delta_mode_name(m), dout_kind_name(dk));
            for (int r = 0; r < P; ++r) {
              const double e = delta[r] - gold_delta[di][r];
              col.err[id][row0 + r] = e;
              col.abs_err[id][row0 + r] = std::fabs(e);
            }
          }
        }
      }
    }
  }

  BiasReport rep;
  rep.rows_per_call = P;
  rep.calls_per_kind = calls;
  for (size_t i = 0; i < col.series.size(); ++i) {
    BiasSeries s = col.series[i];
    double sum = 0, sum_abs = 0;
    int64_t n = 0, bad = 0;
    for (size_t r = 0; r < rows; ++r) {
      const double e = col.err[i][r];
      if (!std::isfinite(e)) {
        ++bad;
        continue;
      }
      sum += e;
      sum_abs += col.abs_err[i][r];
      ++n;
    }
    s.rows = n;
    s.mean = n ? sum / n : 0.0;
    s.mean_abs = n ? sum_abs / n : 0.0;
    // Standard error over calls: rows of one call share V, so they are not independent.
    // The spread of the per-call means (each over that call's finite rows) around the mean.
    double ss = 0;
    int used = 0;
    for (int call = 0; call < calls; ++call) {
      double cs = 0;
      int cn = 0;
      for (int r = 0; r < P; ++r) {
        const double e = col.err[i][static_cast<size_t>(call) * P + r];
        if (std::isfinite(e)) cs += e, ++cn;
      }
      if (cn == 0) continue;
      ss += (cs / cn - s.mean) * (cs / cn - s.mean);
      ++used;
    }
    s.se = used > 1 ? std::sqrt(ss / (used - 1) / used) : 0.0;
    s.nonfinite = static_cast<double>(bad) / static_cast<double>(rows);
    rep.series.push_back(s);
  }
  for (int ki = 0; ki < nk; ++ki) {
    size_t c = 0;
    for (size_t r = 0; r < rows; ++r) c += same_tile[ki * rows + r] != 0;
    rep.same_tile_fraction.push_back(static_cast<double>(c) / static_cast<double>(rows));
  }
  // The maximum's score as the backends compute it: X = hi + lo exactly, times the scale.
  const double X = [&] {
    const double x = bc.top * std::sqrt(static_cast<double>(d));
    const double hi = round_fmt(x, DType::BF16);
    return hi + round_fmt(x - hi, DType::BF16);
  }();
  rep.top_fp32 = round_fmt(X * round_fmt(1.0 / std::sqrt(static_cast<double>(d)), DType::F32),
                           DType::F32);
  rep.top_fp64 = X * (1.0 / std::sqrt(static_cast<double>(d)));
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace st
