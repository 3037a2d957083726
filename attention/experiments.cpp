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
  if (accum == BiasAccum::Bf16) c.accum = DType::BF16;
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

// The head call's inputs: scores chosen per row (see experiments.h).
struct CallInputs {
  std::vector<double> q, k, v, dout[2];  // (T, d) each, BF16-exact
  bool same_tile[64] = {};               // per used row: all ties inside one key tile
};

void make_inputs(const BiasConfig& bc, BiasRows kind, Rng& rng, CallInputs& in) {
  const int T = bc.keys, d = bc.d, P = d / 2;
  const size_t td = static_cast<size_t>(T) * d;
  in.q.assign(td, 0.0);
  in.k.assign(td, 0.0);
  in.v.resize(td);
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  std::vector<double> S(T);
  std::vector<int> pos;
  for (int r = 0; r < P; ++r) {
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
    for (int s = 0; s < T; ++s) {
      const double u = rng.uniform();
      S[s] = kind == BiasRows::Diffuse ? bc.top - bc.diffuse_width * u
                                       : bc.top - (bc.gap_lo + (bc.gap_hi - bc.gap_lo) * u);
    }
    for (int p : pos) S[p] = bc.top;
    bool same = nt > 1;
    for (int p : pos) same = same && p / bc.block_k == pos[0] / bc.block_k;
    in.same_tile[r] = same;
    in.q[static_cast<size_t>(r) * d + 2 * r] = 1.0;
    in.q[static_cast<size_t>(r) * d + 2 * r + 1] = 1.0;
    for (int s = 0; s < T; ++s) {
      const double X = S[s] * sqrt_d;
      const double hi = round_fmt(X, DType::BF16);
      in.k[static_cast<size_t>(s) * d + 2 * r] = hi;
      in.k[static_cast<size_t>(s) * d + 2 * r + 1] = round_fmt(X - hi, DType::BF16);
    }
  }
  for (double& x : in.v) x = round_fmt(bc.v_mean + bc.v_std * rng.normal(), DType::BF16);
  in.dout[0].assign(td, 1.0);
  in.dout[1].resize(td);
  for (double& x : in.dout[1]) x = round_fmt(rng.normal(), DType::BF16);
}

}  // namespace

BiasReport run_bias_experiment(const BiasConfig& bc) {
  ST_CHECK(bc.d >= 2 && bc.d % 2 == 0 && bc.d <= 128, "bias experiment: head dim ", bc.d,
           ", expected an even number in [2, 128]");
  ST_CHECK(bc.keys >= 2 && bc.block_k >= 1, "bias experiment: keys = ", bc.keys,
           ", block_k = ", bc.block_k);
  ST_CHECK(bc.ties >= 2 && bc.ties <= std::min(bc.block_k, bc.keys),
           "bias experiment: ties = ", bc.ties, ", expected 2..min(block_k, keys)");
  ST_CHECK(bc.rows >= 2, "bias experiment: rows = ", bc.rows, ", expected at least 2");
  ST_CHECK(bc.gap_lo > 0 && bc.gap_hi >= bc.gap_lo, "bias experiment: gap ", bc.gap_lo, "..",
           bc.gap_hi);
  const auto t0 = std::chrono::steady_clock::now();
  const int T = bc.keys, d = bc.d, P = d / 2;
  const int calls = (bc.rows + P - 1) / P;
  const size_t rows = static_cast<size_t>(calls) * P;

  std::vector<Backend> backends{{"flash", AttentionKind::Flash, 2.0}};
  for (double b : bc.betas)
    backends.push_back({stabilized_label(b), AttentionKind::StabilizedFlash, b});
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
    head_forward(gold_cfg, gold_n, T, d, in.q.data(), in.k.data(), in.v.data(), gold);
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
    for (double& x : rounded_gold) x = round_fmt(x, DType::BF16);
    for (BiasAccum a : bc.accums) {
      record_o(col.at(kind, a, "fp64_rounded", "o"), rounded_gold);
      for (const auto& b : backends) {
        AttentionConfig cfg = backend_config(bc, b, a);
        HeadForward fw;
        head_forward(cfg, cfg.numerics(DType::BF16, 0), T, d, in.q.data(), in.k.data(),
                     in.v.data(), fw);
        record_o(col.at(kind, a, b.label, "o"), fw.o);
        record_o(col.at(kind, a, b.label, "o32"), fw.o32);
        if (!bc.deltas) continue;
        for (DoutKind dk : bc.douts) {
          const int di = dk == DoutKind::Ones ? 0 : 1;
          for (DeltaMode m : kDeltaModes) {
            if (b.kind == AttentionKind::Baseline && m != DeltaMode::DpP) continue;
            cfg.delta = m;
            const auto delta = head_deltas(cfg, cfg.numerics(DType::BF16, 0), T, d, in.q.data(),
                                           in.k.data(), in.v.data(), fw, in.dout[di].data());
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
    double ss = 0;
    for (size_t r = 0; r < rows; ++r) {
      const double e = col.err[i][r];
      if (std::isfinite(e)) ss += (e - s.mean) * (e - s.mean);
    }
    s.se = n > 1 ? std::sqrt(ss / (n - 1) / n) : 0.0;
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
