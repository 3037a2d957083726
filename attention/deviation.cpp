// One lab configuration against an FP64 golden (see deviation.h).
#include "attention/deviation.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "attention/head_cpu.h"
#include "core/error.h"
#include "core/rng.h"

namespace st {
namespace {

std::string num(double x) {
  std::ostringstream os;
  os.precision(10);
  os << x;
  return os.str();
}

// Causal heads do half the multiply-adds of non-causal ones.
double head_macs(const DeviationSpec& s) {
  const double pairs = s.attn.causal ? 0.5 * s.T * (s.T + 1.0) : double(s.T) * s.T;
  return pairs * s.d * 2;  // S = QK^T and P V
}

// Emulation cost in ns per multiply-add on the 2-core development machine (approximate;
// used for the estimate only).
double ns_per_mac(const AttnNumerics& n) {
  if (n.low == DType::F64) return 0.6;
  if (n.mac != DType::F32 && n.mac != DType::F64) return n.mac == DType::F16 ? 20.0 : 5.0;
  return 0.85;
}

struct Inputs {
  std::vector<double> q, k, v, dout, dots;  // dots: ties only
  int64_t tied_rows = 0;
};

Inputs make_inputs(const DeviationSpec& s, const AttnNumerics& n, int h) {
  Inputs in;
  // The seed formula of the earlier sweep, so N(0, 1) inputs are the ones it used.
  Rng rng(s.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(s.T) * 1000003ull +
          static_cast<uint64_t>(s.d) * 7919ull + static_cast<uint64_t>(h));
  const size_t td = static_cast<size_t>(s.T) * s.d;
  const InputDist* dist[3] = {&s.q, &s.k, &s.v};
  std::vector<double>* dst[3] = {&in.q, &in.k, &in.v};
  for (int i = 0; i < 3; ++i) {
    dst[i]->resize(td);
    for (double& e : *dst[i]) e = round_fmt(dist[i]->draw(rng), n.qkv);
  }
  if (s.ties > 0) {
    const int T = s.T, d = s.d;
    in.dots.assign(static_cast<size_t>(T) * T, 0.0);
    std::vector<int> pos;
    for (int t = 0; t < T; ++t) {
      const int keys = s.attn.causal ? t + 1 : T;
      double* row = in.dots.data() + static_cast<size_t>(t) * T;
      for (int u = 0; u < keys; ++u) {
        double acc = 0;
        for (int j = 0; j < d; ++j) acc += in.q[t * d + j] * in.k[u * d + j];
        row[u] = round_fmt(acc, DType::F32);
      }
      if (keys < s.ties) continue;
      pos.clear();
      while (static_cast<int>(pos.size()) < s.ties) {
        const int p = static_cast<int>(rng.below(keys));
        if (std::find(pos.begin(), pos.end(), p) == pos.end()) pos.push_back(p);
      }
      double mx = -1e300;
      for (int u = 0; u < keys; ++u)
        if (std::find(pos.begin(), pos.end(), u) == pos.end()) mx = std::max(mx, row[u]);
      if (keys == s.ties) mx = 0;
      const double top = round_fmt(mx + s.tie_gap * std::sqrt(static_cast<double>(d)), DType::F32);
      for (int p : pos) row[p] = top;
      ++in.tied_rows;
    }
  }
  in.dout.resize(td);
  for (double& e : in.dout) e = s.dout == DoutKind::Ones ? 1.0 : round_fmt(rng.normal(), n.grads);
  return in;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> DeviationSpec::columns() const {
  const AttnNumerics n = attn.numerics(compute, 0);
  const bool stab = attn.kind == AttentionKind::StabilizedFlash;
  const bool tiled = attn.kind != AttentionKind::Baseline;
  return {{"backend", attention_kind_name(attn.kind)},
          {"beta", stab ? num(attn.beta) : ""},
          {"tie_shift", stab ? tie_shift_name(attn.tie_shift) : ""},
          {"compute", dtype_name(compute)},
          {"rule", rounding_rule_name(attn.rule)},
          {"T", std::to_string(T)},
          {"d", std::to_string(d)},
          {"causal", attn.causal ? "1" : "0"},
          {"block_q", tiled ? std::to_string(attn.block_q) : ""},
          {"block_k", tiled ? std::to_string(attn.block_k) : ""},
          {"qkv", dtype_name(n.qkv)},
          {"scores", dtype_name(n.scores)},
          {"probs", dtype_name(n.probs)},
          {"accum", dtype_name(n.accum)},
          {"lsum", dtype_name(n.lsum)},
          {"out", dtype_name(n.out)},
          {"mac", dtype_name(n.mac)},
          {"lsum_mac", dtype_name(n.lsum_mac)},
          {"round_ops", n.round_ops ? "1" : "0"},
          {"delta", deltas ? delta_mode_name(n.delta) : ""},
          {"dout", deltas ? dout_kind_name(dout) : ""},
          {"q", q.str()},
          {"k", k.str()},
          {"v", v.str()},
          {"ties", std::to_string(ties)},
          {"tie_gap", ties > 0 ? num(tie_gap) : ""},
          {"seed", std::to_string(seed)}};
}

std::string DeviationSpec::key() const {
  std::string k;
  for (const auto& [c, v] : columns()) k += c + "=" + v + ";";
  return k;
}

MeanSe mean_se(const std::vector<double>& x) {
  MeanSe r;
  r.n = static_cast<int>(x.size());
  if (x.empty()) return r;
  double s = 0;
  for (double v : x) s += v;
  r.mean = s / r.n;
  double ss = 0;
  for (double v : x) ss += (v - r.mean) * (v - r.mean);
  r.se = r.n > 1 ? std::sqrt(ss / (r.n - 1) / r.n) : 0.0;
  return r;
}

void validate(const DeviationSpec& s) {
  // Setting names as the run flags and plan keys spell them.
  if (s.T < 1 || s.T > 65536) fail("T = ", s.T, ": expected 1..65536");
  if (s.d < 1 || s.d > 1024) fail("d = ", s.d, ": expected 1..1024");
  if (s.heads < 1) fail("heads = ", s.heads, ": expected at least 1");
  if (s.attn.block_q < 0 || s.attn.block_k < 0)
    fail("block_q = ", s.attn.block_q, ", block_k = ", s.attn.block_k,
         ": expected >= 0 (0: one tile spanning the row)");
  if (s.ties < 0 || s.ties > s.T) fail("ties = ", s.ties, ": expected 0..T (T = ", s.T, ")");
  if (s.tie_gap < 0) fail("tie_gap = ", s.tie_gap, ": expected >= 0");
  if (s.attn.beta < 1) fail("beta = ", s.attn.beta, ": expected >= 1");
}

double estimate_seconds(const DeviationSpec& s) {
  const AttnNumerics n = s.attn.numerics(s.compute, 0);
  double per_head = head_macs(s) * (ns_per_mac(n) + 0.6) * 1e-9;
  if (s.deltas && (n.delta == DeltaMode::DpP || n.delta == DeltaMode::Fp32Recompute))
    per_head += head_macs(s) * 0.85e-9;
  return per_head * s.heads;
}

std::vector<HeadDeviation> run_deviation(const DeviationSpec& s, int threads,
                                         const std::function<void(int, int)>& progress) {
  validate(s);
  const AttnNumerics n = s.attn.numerics(s.compute, 0);
  const AttnNumerics n64 = numerics_for_rule(RoundingRule::Gpu, DType::F64, false);
  AttentionConfig gold_cfg;
  gold_cfg.kind = AttentionKind::Baseline;
  gold_cfg.causal = s.attn.causal;
  const int T = s.T, d = s.d;
  const size_t td = static_cast<size_t>(T) * d;
  std::vector<HeadDeviation> out(s.heads);
  int done = 0;
  const int nthreads = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int h = 0; h < s.heads; ++h) {
    const auto t0 = std::chrono::steady_clock::now();
    const Inputs in = make_inputs(s, n, h);
    HeadForward gold, fw;
    if (s.ties > 0) {
      head_forward_dots(gold_cfg, n64, T, T, d, in.dots.data(), in.v.data(), gold);
      head_forward_dots(s.attn, n, T, T, d, in.dots.data(), in.v.data(), fw, true);
    } else {
      head_forward(gold_cfg, n64, T, d, in.q.data(), in.k.data(), in.v.data(), gold);
      head_forward(s.attn, n, T, d, in.q.data(), in.k.data(), in.v.data(), fw, true);
    }
    HeadDeviation& r = out[h];
    r.head = h;
    add_deviation(r.o32, fw.o32.data(), gold.o.data(), td);
    add_deviation(r.o, fw.o.data(), gold.o.data(), td);
    double b32 = 0, b = 0, g = 0;
    for (size_t i = 0; i < td; ++i) {
      b32 += fw.o32[i] - gold.o[i];
      b += fw.o[i] - gold.o[i];
      g += std::fabs(gold.o[i]);
    }
    r.bias_o32 = b32 / td;
    r.bias_o = b / td;
    r.mean_abs_golden = g / td;
    r.rows = T;
    r.tied_rows = fw.stats.tied_rows;
    if (s.deltas) {
      const std::vector<double> delta =
          s.ties > 0 ? head_deltas_dots(s.attn, n, T, T, d, in.dots.data(), in.v.data(), fw,
                                        in.dout.data())
                     : head_deltas(s.attn, n, T, d, in.q.data(), in.k.data(), in.v.data(), fw,
                                   in.dout.data());
      double ea = 0, es = 0;
      for (int t = 0; t < T; ++t) {
        double ref = 0;
        for (int j = 0; j < d; ++j) ref += in.dout[t * d + j] * gold.o[t * d + j];
        ea += std::fabs(delta[t] - ref);
        es += delta[t] - ref;
      }
      r.delta_mean_abs = ea / T;
      r.delta_bias = es / T;
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#pragma omp critical(deviation_progress)
    {
      ++done;
      if (progress) progress(done, s.heads);
    }
  }
  return out;
}

}  // namespace st

namespace st {
namespace {

int to_int(const std::string& key, const std::string& v, const std::string& where) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < -2147483647L || x > 2147483647L)
    fail("'", v, "' is not an integer");
  return static_cast<int>(x);
}

double to_double(const std::string& key, const std::string& v, const std::string& where) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x))
    fail("'", v, "' is not a number");
  return x;
}

bool to_bool(const std::string& key, const std::string& v, const std::string& where) {
  if (v == "1" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "no") return false;
  fail("'", v, "' is not a boolean (true or false)");
}

}  // namespace

const std::vector<SpecKey>& deviation_spec_keys() {
  static const std::vector<SpecKey> keys = {
      {"backend", "baseline | flash | stabilized_flash"},
      {"beta", "stabilized flash: shift factor (>= 1)"},
      {"tie_tol", "stabilized flash: tie tolerance on scores"},
      {"tie_shift", "stabilized flash's shifted maximum: beta | exact_sum (core/attention.h)"},
      {"max_shift", "stabilized flash: cap on the max shift; 0: ln(1/min_normal(probs))/2"},
      {"o_tilde_bits", "flash: fraction bits of O~ (1..6 with accum bf16); 0: O~ in accum"},
      {"o_tilde_gain", "flash: O~'s rounding error times this (>= 1), O~ in fp32; 0: off"},
      {"o_tilde_scope", "which O~ updates the amplifier acts on: all | tied | untied_matched"},
      {"tie_break", "flash: the j-th tied score of a tied tile lowered by j * this in exp; 0: off"},
      {"compute", "compute format f the rule starts from: bf16 | fp16 | fp32 | fp64"},
      {"rule", "gpu | every_op | every_mac (docs/numerics.md)"},
      {"qkv", "format of Q, K, V (auto: from the rule)"},
      {"scores", "format of S"},
      {"probs", "format of P (baseline) / P~ (flash)"},
      {"accum", "flash O~ and rescale factor; baseline exp(S - m)"},
      {"lsum", "softmax row sum l (auto: as accum)"},
      {"lsum_mac", "partial sums of l (auto: as mac)"},
      {"out", "format of the stored O"},
      {"mac", "partial sums inside the matmuls"},
      {"grads", "format of dO and the backward's stored results"},
      {"delta", "delta mode: o | o_split | o_fp32 | dp_p | fp32_recompute"},
      {"causal", "causal mask: true | false"},
      {"T", "sequence length (query rows = keys)"},
      {"d", "head dim"},
      {"block_q", "flash query tile Br (0: one tile)"},
      {"block_k", "flash key tile Bc (0: one tile per row)"},
      {"tile", "both tiles: BRxBC (e.g. 64x48) or row (one tile per row)"},
      {"q", "Q distribution: normal:MEAN:STD | uniform:LO:HI | outliers:MEAN:STD:FRAC:SCALE"},
      {"k", "K distribution (as q)"},
      {"v", "V distribution (as q)"},
      {"ties", "tied maxima per row (0: none)"},
      {"tie_gap", "the tied maxima sit this far (score units) above the row's next score"},
      {"dout", "dO for the delta error: normal | ones"},
      {"deltas", "also measure delta: true | false"},
      {"heads", "independent heads (input draws)"},
      {"seed", "input seed"},
  };
  return keys;
}

void set_spec_field(DeviationSpec& s, const std::string& key, const std::string& v,
                    const std::string& where) {
  AttentionConfig& a = s.attn;
  const std::string w = where.empty() ? "" : where + ": ";
  bool known = false;
  for (const auto& k : deviation_spec_keys()) known = known || key == k.name;
  if (!known) {
    std::string names;
    for (const auto& k : deviation_spec_keys()) names += std::string(names.empty() ? "" : ", ") + k.name;
    fail(w, "unknown setting '", key, "' (known: ", names, ")");
  }
  try {
    if (key == "backend") {
      a.kind = parse_attention_kind(v);
      if (a.kind == AttentionKind::Cudnn)
        fail("backend cudnn runs only on a GPU; this tool runs the CPU lab (bench attention's "
             "deviation table puts cuDNN beside flash and baseline on a GPU)");
    }
    else if (key == "beta") a.beta = to_double(key, v, w);
    else if (key == "tie_tol") a.tie_tol = to_double(key, v, w);
    else if (key == "max_shift") a.max_shift = to_double(key, v, w);
    else if (key == "tie_shift") a.tie_shift = parse_tie_shift(v);
    else if (key == "o_tilde_bits") a.o_tilde_bits = to_int(key, v, w);
    else if (key == "o_tilde_gain") a.o_tilde_gain = to_double(key, v, w);
    else if (key == "o_tilde_scope") a.o_tilde_scope = parse_o_tilde_scope(v);
    else if (key == "tie_break") a.tie_break = to_double(key, v, w);
    else if (key == "compute") {
      if (v == "auto") fail("'auto' is not a compute format (bf16, fp16, fp32 or fp64)");
      s.compute = parse_dtype(v);
    } else if (key == "rule") a.rule = parse_rounding_rule(v);
    else if (key == "qkv") a.qkv = parse_point_format(v);
    else if (key == "scores") a.scores = parse_point_format(v);
    else if (key == "probs") a.probs = parse_point_format(v);
    else if (key == "accum") a.accum = parse_point_format(v);
    else if (key == "lsum") a.lsum = parse_point_format(v);
    else if (key == "lsum_mac") a.lsum_mac = parse_point_format(v);
    else if (key == "out") a.out = parse_point_format(v);
    else if (key == "mac") a.mac = parse_point_format(v);
    else if (key == "grads") a.grads = parse_point_format(v);
    else if (key == "delta") a.delta = parse_delta_mode(v);
    else if (key == "causal") a.causal = to_bool(key, v, w);
    else if (key == "T") s.T = to_int(key, v, w);
    else if (key == "d") s.d = to_int(key, v, w);
    else if (key == "block_q") a.block_q = to_int(key, v, w);
    else if (key == "block_k") a.block_k = to_int(key, v, w);
    else if (key == "tile") {
      if (v == "row") {
        a.block_q = a.block_k = 0;
      } else {
        const size_t x = v.find('x');
        if (x == std::string::npos) fail("'", v, "' is not BRxBC (e.g. 64x48) or row");
        a.block_q = to_int(key, v.substr(0, x), w);
        a.block_k = to_int(key, v.substr(x + 1), w);
      }
    } else if (key == "q") s.q = parse_input_dist(v, "distribution");
    else if (key == "k") s.k = parse_input_dist(v, "distribution");
    else if (key == "v") s.v = parse_input_dist(v, "distribution");
    else if (key == "ties") s.ties = to_int(key, v, w);
    else if (key == "tie_gap") s.tie_gap = to_double(key, v, w);
    else if (key == "dout") s.dout = parse_dout_kind(v);
    else if (key == "deltas") s.deltas = to_bool(key, v, w);
    else if (key == "heads") s.heads = to_int(key, v, w);
    else if (key == "seed") {
      char* end = nullptr;
      s.seed = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || v[0] == '-') fail("'", v, "' is not a seed (an integer >= 0)");
    }
  } catch (const Error& e) {
    fail(w, key, ": ", e.what());  // the value's error, with the setting it belongs to
  }
}

}  // namespace st
