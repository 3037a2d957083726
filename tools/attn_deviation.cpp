// attn_deviation: attention numerics experiments on the CPU head lab (attention/head_cpu.h).
//   attn_deviation sweep [--quick] [--csv FILE]   Golden et al.'s numeric-deviation benchmark
//   attn_deviation bias  [--rows N] [--csv FILE]  Qiu & Yao's tied-maximum bias (O and delta)
//
// sweep: the same random Q, K, V ~ N(0, 1) (seeded per T, d and head; rounded to the format
// under test) go into baseline and flash attention; golden = baseline with every point in
// FP64 on those rounded inputs. Causal. Rules (core/attention_numerics.h): gpu, every_op,
// every_mac, and unequal = flash under every_op against baseline under gpu. FP32's every_mac
// equals its every_op (the matmul sums are FP32 already) and FP64's rules all coincide, so
// those are not rerun. Reported per setting: max, mean and std of |O - O_golden| for the O
// before its final rounding (o32) and the stored O, and flash / baseline ratios.
// The work is O(T^2 d) per head in emulated arithmetic; OpenMP runs heads in parallel.
#include <CLI/CLI.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "attention/experiments.h"
#include "attention/head_cpu.h"
#include "core/error.h"
#include "core/rng.h"

using namespace st;

namespace {

// The 1-minute load average (the machine may be shared; timings depend on it).
std::string loadavg() {
  std::string s = "?";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    char buf[32] = {};
    if (std::fscanf(f, "%31s", buf) == 1) s = buf;
    std::fclose(f);
  }
  return s;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------- sweep

enum class Rule { Gpu, EveryOp, EveryMac, Unequal };
const char* rule_name(Rule r) {
  switch (r) {
    case Rule::Gpu: return "gpu";
    case Rule::EveryOp: return "every_op";
    case Rule::EveryMac: return "every_mac";
    case Rule::Unequal: return "unequal";
  }
  return "?";
}

struct Tile {
  int br = 64, bc = 64;  // 0 = one tile spanning the sequence
  std::string str() const {
    return br == 0 && bc == 0 ? std::string("row") : std::to_string(br) + "x" + std::to_string(bc);
  }
  bool operator<(const Tile& o) const { return br != o.br ? br < o.br : bc < o.bc; }
};

struct Setting {
  DType f;
  Rule rule;
  int T, d;
  Tile tile;
  int heads;
  std::string section;
};

// One computed head: a backend under a real rule (unequal reuses these).
struct Variant {
  DType f;
  bool flash;
  RoundingRule rule;
  int T, d, h;
  Tile tile;  // flash only
  std::string key() const {
    char b[128];
    std::snprintf(b, sizeof b, "%s|%d|%s|%d|%d|%d|%s", dtype_name(f), flash ? 1 : 0,
                  rounding_rule_name(rule), T, d, h, flash ? tile.str().c_str() : "-");
    return b;
  }
};

struct VariantResult {
  DeviationStats o32, o;
  double seconds = 0;
};

struct SweepPlan {
  std::vector<Setting> settings;
  int every_mac_max_T = 2048;
};

std::vector<Rule> rules_for(DType f, int T, int every_mac_max_T) {
  if (f == DType::F64) return {Rule::Gpu};
  if (f == DType::F32) return {Rule::Gpu, Rule::EveryOp, Rule::Unequal};
  std::vector<Rule> r{Rule::Gpu, Rule::EveryOp};
  if (T <= every_mac_max_T) r.push_back(Rule::EveryMac);
  r.push_back(Rule::Unequal);
  return r;
}

SweepPlan make_plan(bool quick, int max_T, int every_mac_max_T, int heads_override) {
  SweepPlan p;
  p.every_mac_max_T = every_mac_max_T;
  const std::vector<DType> fmts{DType::BF16, DType::F16, DType::F32, DType::F64};
  auto heads_for = [&](int T) {
    if (heads_override > 0) return heads_override;
    if (quick) return 2;
    return std::clamp(4096 / T, 2, 16);
  };
  auto add = [&](const std::string& sec, int T, int d, Tile tile) {
    for (DType f : fmts)
      for (Rule r : rules_for(f, T, every_mac_max_T))
        p.settings.push_back({f, r, T, d, tile, heads_for(T), sec});
  };
  std::vector<int> Ts;
  for (int T = 128; T <= (quick ? 256 : max_T); T *= 2) Ts.push_back(T);
  const int dseq = quick ? 32 : 64, Tfix = quick ? 256 : 1024;
  for (Tile tile : {Tile{64, 64}, Tile{16, 16}, Tile{0, 0}})
    for (int T : Ts) add("seq", T, dseq, tile);
  for (Tile tile : {Tile{16, 16}, Tile{32, 32}, Tile{64, 64}, Tile{128, 128}, Tile{256, 256},
                    Tile{64, 16}, Tile{16, 64}, Tile{0, 0}})
    add("tile", Tfix, dseq, tile);
  for (int d : quick ? std::vector<int>{32, 64} : std::vector<int>{32, 64, 128})
    add("dim", quick ? 128 : 1024, d, Tile{64, 64});
  return p;
}

// The computed variants behind a setting's flash and baseline rows.
Variant flash_variant(const Setting& s, int h) {
  const RoundingRule r = s.rule == Rule::Gpu       ? RoundingRule::Gpu
                         : s.rule == Rule::EveryMac ? RoundingRule::EveryMac
                                                    : RoundingRule::EveryOp;  // every_op, unequal
  return {s.f, true, r, s.T, s.d, h, s.tile};
}
Variant baseline_variant(const Setting& s, int h) {
  const RoundingRule r = s.rule == Rule::EveryOp    ? RoundingRule::EveryOp
                         : s.rule == Rule::EveryMac ? RoundingRule::EveryMac
                                                    : RoundingRule::Gpu;  // gpu, unequal
  return {s.f, false, r, s.T, s.d, h, Tile{0, 0}};
}

// Emulation CPU cost in ns per multiply-add (both matmuls), approximate, from the 2-core
// development machine: used only to order jobs and estimate the run time.
double ns_per_mac(DType f, RoundingRule r) {
  if (f == DType::F64) return 0.6;
  if (r == RoundingRule::EveryMac) return f == DType::F16 ? 20.0 : 5.0;
  return 0.85;
}
double head_macs(int T, int d) { return static_cast<double>(T) * (T + 1) / 2 * d * 2; }

void make_inputs(uint64_t seed, int T, int d, int h, DType f, std::vector<double>& q,
                 std::vector<double>& k, std::vector<double>& v) {
  Rng rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(T) * 1000003ull +
          static_cast<uint64_t>(d) * 7919ull + static_cast<uint64_t>(h));
  const size_t n = static_cast<size_t>(T) * d;
  for (auto* x : {&q, &k, &v}) {
    x->resize(n);
    for (double& e : *x) e = round_fmt(rng.normal(), f);
  }
}

AttentionConfig variant_config(const Variant& v) {
  AttentionConfig c;
  c.kind = v.flash ? AttentionKind::Flash : AttentionKind::Baseline;
  c.causal = true;
  c.rule = v.rule;
  c.block_q = v.tile.br;
  c.block_k = v.tile.bc;
  return c;
}

std::string golden_key(DType f, int T, int d, int h) {
  return std::string(dtype_name(f)) + "|" + std::to_string(T) + "|" + std::to_string(d) + "|" +
         std::to_string(h);
}

struct SettingRow {
  VariantResult flash, base;  // merged over heads
  DeviationStats golden;      // |O_golden| (the scale the errors are measured against)
};

void print_sweep_table(const std::vector<Setting>& settings, const std::vector<SettingRow>& rows,
                       const std::string& section, const char* title) {
  std::printf("\n### %s\n\n", title);
  std::printf(
      "| fmt | rule | T | d | Br x Bc | heads | mean abs O_gold | flash max o32 | flash mean o32 | flash std o32 "
      "| base max o32 | base mean o32 | base std o32 | x max o32 | x mean o32 | flash max O "
      "| flash mean O | base max O | base mean O | x max O | x mean O |\n");
  std::printf("|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  auto ratio = [](double a, double b, char* buf) {
    if (b > 0)
      std::snprintf(buf, 16, "%.2f", a / b);
    else
      std::snprintf(buf, 16, "-");
  };
  for (size_t i = 0; i < settings.size(); ++i) {
    const Setting& s = settings[i];
    if (s.section != section) continue;
    const auto& F = rows[i].flash;
    const auto& B = rows[i].base;
    char r1[16], r2[16], r3[16], r4[16];
    ratio(F.o32.max, B.o32.max, r1);
    ratio(F.o32.mean(), B.o32.mean(), r2);
    ratio(F.o.max, B.o.max, r3);
    ratio(F.o.mean(), B.o.mean(), r4);
    std::printf(
        "| %s | %s | %d | %d | %s | %d | %.3e | %.3e | %.3e | %.3e | %.3e | %.3e | %.3e | %s | "
        "%s | %.3e | %.3e | %.3e | %.3e | %s | %s |\n",
        dtype_name(s.f), rule_name(s.rule), s.T, s.d, s.tile.str().c_str(), s.heads,
        rows[i].golden.mean(), F.o32.max,
        F.o32.mean(), F.o32.sd(), B.o32.max, B.o32.mean(), B.o32.sd(), r1, r2, F.o.max,
        F.o.mean(), B.o.max, B.o.mean(), r3, r4);
  }
}

// Flash/baseline factors per format and rule over the sequence-length sweep at one tile.
void print_factor_table(const std::vector<Setting>& settings, const std::vector<SettingRow>& rows,
                        const std::string& tile, int T_lo, int T_hi) {
  const std::string range =
      T_lo <= 128 && T_hi >= (1 << 20) ? "all T" : "T " + std::to_string(T_lo) + "-" + std::to_string(T_hi);
  std::printf("\n### Flash / baseline factor per rule (seq sweep, tile %s, %s): min-max over T\n\n",
              tile.c_str(), range.c_str());
  std::printf("| fmt | rule | T range | x mean o32 | x max o32 | x mean O | x max O |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::map<std::pair<int, int>, std::vector<size_t>> groups;  // (fmt, rule) -> rows
  std::vector<std::pair<int, int>> order;
  for (size_t i = 0; i < settings.size(); ++i) {
    const Setting& s = settings[i];
    if (s.section != "seq" || s.tile.str() != tile || s.T < T_lo || s.T > T_hi) continue;
    const auto key = std::make_pair(static_cast<int>(s.f), static_cast<int>(s.rule));
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(i);
  }
  for (const auto& key : order) {
    const auto& idx = groups[key];
    double lo[4] = {1e300, 1e300, 1e300, 1e300}, hi[4] = {-1e300, -1e300, -1e300, -1e300};
    bool any = false;
    for (size_t i : idx) {
      const auto& F = rows[i].flash;
      const auto& B = rows[i].base;
      if (!(B.o32.mean() > 0 && B.o.mean() > 0)) continue;
      const double r[4] = {F.o32.mean() / B.o32.mean(), F.o32.max / B.o32.max,
                           F.o.mean() / B.o.mean(), F.o.max / B.o.max};
      for (int j = 0; j < 4; ++j) lo[j] = std::min(lo[j], r[j]), hi[j] = std::max(hi[j], r[j]);
      any = true;
    }
    const Setting& s0 = settings[idx.front()];
    const Setting& s1 = settings[idx.back()];
    if (!any) {
      std::printf("| %s | %s | %d-%d | - | - | - | - |\n", dtype_name(s0.f), rule_name(s0.rule),
                  s0.T, s1.T);
      continue;
    }
    std::printf("| %s | %s | %d-%d | %.2f-%.2f | %.2f-%.2f | %.2f-%.2f | %.2f-%.2f |\n",
                dtype_name(s0.f), rule_name(s0.rule), s0.T, s1.T, lo[0], hi[0], lo[1], hi[1],
                lo[2], hi[2], lo[3], hi[3]);
  }
}

int run_sweep(bool quick, const std::string& csv_path, int threads, uint64_t seed, int max_T,
              int every_mac_max_T, int heads_override, bool plan_only) {
  const SweepPlan plan = make_plan(quick, max_T, every_mac_max_T, heads_override);
  // Unique variants and goldens.
  std::vector<Variant> variants;
  std::map<std::string, size_t> vindex;
  std::vector<std::tuple<DType, int, int, int>> goldens;
  std::map<std::string, size_t> gindex;
  for (const Setting& s : plan.settings)
    for (int h = 0; h < s.heads; ++h) {
      for (const Variant& v : {flash_variant(s, h), baseline_variant(s, h)})
        if (!vindex.count(v.key())) {
          vindex[v.key()] = variants.size();
          variants.push_back(v);
        }
      const std::string gk = golden_key(s.f, s.T, s.d, h);
      if (!gindex.count(gk)) {
        gindex[gk] = goldens.size();
        goldens.emplace_back(s.f, s.T, s.d, h);
      }
    }
  double est = 0;
  for (const auto& g : goldens) est += head_macs(std::get<1>(g), std::get<2>(g)) * 0.6e-9;
  for (const auto& v : variants) est += head_macs(v.T, v.d) * ns_per_mac(v.f, v.rule) * 1e-9;
  const int nthreads = threads > 0 ? threads : omp_get_max_threads();
  std::fprintf(stderr,
               "attn_deviation sweep: %zu settings, %zu golden heads, %zu computed heads; "
               "estimated %.0f CPU s (%.0f s on %d threads)\n",
               plan.settings.size(), goldens.size(), variants.size(), est, est / nthreads,
               nthreads);
  if (plan_only) return 0;

  const double t0 = now_s();
  const std::string load0 = loadavg();
  // Phase 1: goldens, largest first.
  std::vector<std::vector<double>> gold(goldens.size());
  std::vector<DeviationStats> gold_abs(goldens.size());
  std::vector<size_t> gorder(goldens.size());
  for (size_t i = 0; i < gorder.size(); ++i) gorder[i] = i;
  std::stable_sort(gorder.begin(), gorder.end(), [&](size_t a, size_t b) {
    return head_macs(std::get<1>(goldens[a]), std::get<2>(goldens[a])) >
           head_macs(std::get<1>(goldens[b]), std::get<2>(goldens[b]));
  });
  const AttnNumerics n64 = numerics_for_rule(RoundingRule::Gpu, DType::F64, false);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (size_t oi = 0; oi < gorder.size(); ++oi) {
    const auto [f, T, d, h] = goldens[gorder[oi]];
    std::vector<double> q, k, v;
    make_inputs(seed, T, d, h, f, q, k, v);
    AttentionConfig c;
    c.kind = AttentionKind::Baseline;
    HeadForward fw;
    head_forward(c, n64, T, d, q.data(), k.data(), v.data(), fw);
    for (double o : fw.o) gold_abs[gorder[oi]].add(std::fabs(o));
    gold[gorder[oi]] = std::move(fw.o);
  }
  const double t1 = now_s();
  std::fprintf(stderr, "goldens: %.1f s\n", t1 - t0);

  // Phase 2: every variant against its golden, most expensive first.
  std::vector<VariantResult> res(variants.size());
  std::vector<size_t> vorder(variants.size());
  for (size_t i = 0; i < vorder.size(); ++i) vorder[i] = i;
  auto vcost = [&](size_t i) {
    return head_macs(variants[i].T, variants[i].d) * ns_per_mac(variants[i].f, variants[i].rule);
  };
  std::stable_sort(vorder.begin(), vorder.end(), [&](size_t a, size_t b) { return vcost(a) > vcost(b); });
  int done = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (size_t oi = 0; oi < vorder.size(); ++oi) {
    const Variant& v = variants[vorder[oi]];
    const double s0 = now_s();
    std::vector<double> q, k, vv;
    make_inputs(seed, v.T, v.d, v.h, v.f, q, k, vv);
    const AttentionConfig c = variant_config(v);
    HeadForward fw;
    head_forward(c, c.numerics(v.f, 0), v.T, v.d, q.data(), k.data(), vv.data(), fw);
    const auto& g = gold[gindex.at(golden_key(v.f, v.T, v.d, v.h))];
    VariantResult& r = res[vorder[oi]];
    add_deviation(r.o32, fw.o32.data(), g.data(), g.size());
    add_deviation(r.o, fw.o.data(), g.data(), g.size());
    r.seconds = now_s() - s0;
#pragma omp critical
    {
      ++done;
      if (done % 200 == 0 || done == static_cast<int>(vorder.size()))
        std::fprintf(stderr, "  %d/%zu heads, %.0f s\n", done, vorder.size(), now_s() - t0);
    }
  }
  const double t2 = now_s();

  // Merge heads per setting and backend, in head order.
  std::vector<SettingRow> rows(plan.settings.size());
  double cpu = 0;
  for (const auto& r : res) cpu += r.seconds;
  for (size_t i = 0; i < plan.settings.size(); ++i) {
    const Setting& s = plan.settings[i];
    for (int h = 0; h < s.heads; ++h) {
      const auto& F = res[vindex.at(flash_variant(s, h).key())];
      const auto& B = res[vindex.at(baseline_variant(s, h).key())];
      rows[i].flash.o32.merge(F.o32);
      rows[i].flash.o.merge(F.o);
      rows[i].flash.seconds += F.seconds;
      rows[i].base.o32.merge(B.o32);
      rows[i].base.o.merge(B.o);
      rows[i].base.seconds += B.seconds;
      rows[i].golden.merge(gold_abs[gindex.at(golden_key(s.f, s.T, s.d, h))]);
    }
  }

  std::printf("## attn_deviation sweep%s\n\n", quick ? " (--quick)" : "");
  std::printf(
      "Causal; Q, K, V ~ N(0,1) rounded to the format; golden = baseline in FP64 on the same "
      "rounded inputs; |O - O_golden| over all heads' elements. o32 = O before its final "
      "rounding (FP32; FP64 for fp64), O = stored O. x = flash / baseline. Br x Bc 'row' = one "
      "tile per row. unequal = flash every_op vs baseline gpu. fp32 every_mac = fp32 every_op; "
      "fp64: all rules coincide (shown as gpu). every_mac only for T <= %d.\n",
      plan.every_mac_max_T);
  std::printf(
      "Run: %zu computed heads + %zu golden heads, %d threads, wall %.1f s (goldens %.1f s), "
      "%.1f thread-s in variant heads; load average %s at start, %s at end; seed %llu.\n",
      variants.size(), goldens.size(), nthreads, t2 - t0, t1 - t0, cpu, load0.c_str(),
      loadavg().c_str(), static_cast<unsigned long long>(seed));
  print_factor_table(plan.settings, rows, "64x64", 0, 1 << 30);
  print_factor_table(plan.settings, rows, "64x64", 256, 1024);  // RESEARCH.md section 4's range
  print_sweep_table(plan.settings, rows, "seq", "Sequence length sweep (d fixed, tiles 64x64, 16x16, row)");
  print_sweep_table(plan.settings, rows, "tile", "Tile sweep (T and d fixed)");
  print_sweep_table(plan.settings, rows, "dim", "Head-dim sweep (T fixed, tile 64x64)");

  if (!csv_path.empty()) {
    FILE* fp = std::fopen(csv_path.c_str(), "w");
    ST_CHECK(fp != nullptr, "cannot open ", csv_path, " for writing");
    std::fprintf(fp,
                 "# attn_deviation sweep%s, seed %llu. One row per setting and backend (duplicate "
                 "settings across sweeps listed once).\n"
                 "# format: Q/K/V and compute format f; rule: gpu | every_op | every_mac | unequal "
                 "(flash every_op vs baseline gpu); fp64 rows: all rules coincide.\n"
                 "# T: sequence length (causal); d: head dim; block_q x block_k: flash tile Br x Bc "
                 "(0 = one tile per row; baseline rows repeat the setting's tile, baseline does not "
                 "tile).\n"
                 "# heads: independent heads (seeds) pooled; elements = heads*T*d.\n"
                 "# max/mean/std_o32: max, mean, population std of |O32 - O_golden|, O32 = O before "
                 "its final rounding; *_o: the same for the stored O (format f).\n"
                 "# ratio_*: flash / baseline of the named statistic (same on both rows of a "
                 "setting; empty when baseline's is 0). mean_abs_golden: mean |O_golden| (the "
                 "scale of O). thread_seconds: wall time of the threads computing this row's "
                 "heads (the machine may be shared).\n",
                 quick ? " --quick" : "", static_cast<unsigned long long>(seed));
    std::fprintf(fp,
                 "format,rule,T,d,block_q,block_k,backend,heads,elements,max_o32,mean_o32,std_o32,"
                 "max_o,mean_o,std_o,ratio_max_o32,ratio_mean_o32,ratio_max_o,ratio_mean_o,"
                 "mean_abs_golden,thread_seconds\n");
    std::set<std::string> seen;
    for (size_t i = 0; i < plan.settings.size(); ++i) {
      const Setting& s = plan.settings[i];
      char key[128];
      std::snprintf(key, sizeof key, "%s|%s|%d|%d|%s", dtype_name(s.f), rule_name(s.rule), s.T,
                    s.d, s.tile.str().c_str());
      if (!seen.insert(key).second) continue;
      const auto& F = rows[i].flash;
      const auto& B = rows[i].base;
      auto rat = [](double a, double b) {
        char buf[32] = "";
        if (b > 0) std::snprintf(buf, sizeof buf, "%.6g", a / b);
        return std::string(buf);
      };
      const std::string rr = rat(F.o32.max, B.o32.max) + "," + rat(F.o32.mean(), B.o32.mean()) +
                             "," + rat(F.o.max, B.o.max) + "," + rat(F.o.mean(), B.o.mean());
      for (int b = 0; b < 2; ++b) {
        const VariantResult& R = b == 0 ? F : B;
        std::fprintf(fp, "%s,%s,%d,%d,%d,%d,%s,%d,%lld,%.6e,%.6e,%.6e,%.6e,%.6e,%.6e,%s,%.6e,%.3f\n",
                     dtype_name(s.f), rule_name(s.rule), s.T, s.d, s.tile.br, s.tile.bc,
                     b == 0 ? "flash" : "baseline", s.heads, static_cast<long long>(R.o.n),
                     R.o32.max, R.o32.mean(), R.o32.sd(), R.o.max, R.o.mean(), R.o.sd(),
                     rr.c_str(), rows[i].golden.mean(), R.seconds);
      }
    }
    const bool bad = std::ferror(fp) != 0;
    if ((std::fclose(fp) != 0) || bad)
      st::fail(csv_path, ": write failed: ", std::strerror(errno), " (disk full?)");
    std::fprintf(stderr, "wrote %s\n", csv_path.c_str());
  }
  return 0;
}

// ---------------------------------------------------------------- bias

void print_bias(const BiasConfig& bc, const BiasReport& rep) {
  std::printf("## attn_deviation bias\n\n");
  std::printf(
      "Rows: %d per kind (%d head calls x %d rows), %d keys, head dim %d, key tile %d, "
      "non-causal; ties = %d at top = %g (FP32 score %.9g), others top - U(%g, %g); diffuse "
      "rows U(top - %g, top); V ~ N(%g, %g) in BF16, drawn per call and shared by its rows; "
      "Q/K/V/dO BF16. Golden = baseline FP64 on the same inputs. Error = backend - golden, "
      "averaged over head dims per row; mean +- standard error over rows; z = mean / SE. "
      "Seed %llu, %.1f s (load average %s at end).\n",
      rep.calls_per_kind * rep.rows_per_call, rep.calls_per_kind, rep.rows_per_call, bc.keys,
      bc.d, bc.block_k, bc.ties, bc.top, rep.top_fp32, bc.gap_lo, bc.gap_hi, bc.diffuse_width,
      bc.v_mean, bc.v_std, static_cast<unsigned long long>(bc.seed), rep.seconds,
      loadavg().c_str());
  std::printf("Rows whose ties share one key tile:");
  for (size_t i = 0; i < bc.kinds.size(); ++i)
    std::printf(" %s %.1f%%", bias_rows_name(bc.kinds[i]), 100 * rep.same_tile_fraction[i]);
  std::printf(".\n");
  std::printf(
      "bf16_accum: gpu rule with accum = bf16 (flash O~, l, rescales in BF16: the paper's "
      "implementation; baseline: its exponentials and row sum in BF16). fp32_accum: gpu rule "
      "(O~, l FP32; O rounded to BF16 once). fp64_rounded: the exact O rounded once to BF16.\n");

  std::printf("\n### Mean signed error of O (stored, BF16) and o32 (before the final rounding)\n\n");
  std::printf("| rows | accumulator | backend | O mean +- SE | z | o32 mean +- SE | z | mean abs O err |\n");
  std::printf("|---|---|---|---|--:|---|--:|--:|\n");
  for (const auto& s : rep.series) {
    if (s.quantity != "o") continue;
    const BiasSeries* s32 = rep.find(s.kind, s.accum, s.backend, "o32");
    char o32[64] = "-", z32[16] = "-";
    if (s32) {
      std::snprintf(o32, sizeof o32, "%+.3e +- %.1e", s32->mean, s32->se);
      std::snprintf(z32, sizeof z32, "%.1f", s32->se > 0 ? s32->mean / s32->se : 0.0);
    }
    std::printf("| %s | %s | %s | %+.3e +- %.1e | %.1f | %s | %s | %.2e |%s\n",
                bias_rows_name(s.kind), bias_accum_name(s.accum), s.backend.c_str(), s.mean,
                s.se, s.se > 0 ? s.mean / s.se : 0.0, o32, z32, s.mean_abs,
                s.nonfinite > 0 ? " NON-FINITE ROWS" : "");
  }
  if (!bc.deltas) return;
  std::printf("\n### Mean signed error of delta = rowsum(dO * O) vs FP64 delta\n\n");
  std::printf(
      "dO ones: dO = 1 (delta's error = row sum of O's error); dO normal: N(0,1), independent "
      "of V and of the error. Baseline always forms delta as rowsum(dP * P) with its "
      "materialised P.\n\n");
  std::printf("| rows | accumulator | dO | backend | delta mode | mean +- SE | z | mean abs err |\n");
  std::printf("|---|---|---|---|---|---|--:|--:|\n");
  for (const auto& s : rep.series) {
    if (s.quantity != "delta") continue;
    std::printf("| %s | %s | %s | %s | %s | %+.3e +- %.1e | %.1f | %.2e |%s\n",
                bias_rows_name(s.kind), bias_accum_name(s.accum), s.dout.c_str(),
                s.backend.c_str(), s.delta_mode.c_str(), s.mean, s.se,
                s.se > 0 ? s.mean / s.se : 0.0, s.mean_abs,
                s.nonfinite > 0 ? " NON-FINITE ROWS" : "");
  }
}

void write_bias_csv(const std::string& path, const BiasConfig& bc, const BiasReport& rep) {
  FILE* fp = std::fopen(path.c_str(), "w");
  ST_CHECK(fp != nullptr, "cannot open ", path, " for writing");
  std::fprintf(fp,
               "# attn_deviation bias: rows per kind %d, keys %d, d %d, block_k %d, ties %d at "
               "%g (FP32 score %.9g), gap %g..%g, diffuse width %g, V ~ N(%g, %g), seed %llu\n"
               "# kind: tied_tile | tied_any | single | diffuse; accum: bf16_accum (gpu rule, "
               "accum=bf16) | fp32_accum (gpu rule); backend: flash | stabilized_b<beta> | "
               "baseline | fp64_rounded (exact O rounded once to BF16)\n"
               "# quantity: o (stored BF16 O) | o32 (O before the final rounding) | delta "
               "(rowsum(dO*O) as the backward forms it, delta_mode, dO kind)\n"
               "# mean: mean over rows of the row's signed error (averaged over head dims for "
               "O); se: its standard error over rows; z = mean/se; mean_abs: mean |error|; "
               "nonfinite: fraction of rows with NaN/Inf (excluded)\n",
               rep.calls_per_kind * rep.rows_per_call, bc.keys, bc.d, bc.block_k, bc.ties, bc.top,
               rep.top_fp32, bc.gap_lo, bc.gap_hi, bc.diffuse_width, bc.v_mean, bc.v_std,
               static_cast<unsigned long long>(bc.seed));
  std::fprintf(fp, "kind,accum,backend,quantity,delta_mode,dout,rows,mean,se,z,mean_abs,nonfinite\n");
  for (const auto& s : rep.series)
    std::fprintf(fp, "%s,%s,%s,%s,%s,%s,%lld,%.6e,%.6e,%.3f,%.6e,%.6g\n", bias_rows_name(s.kind),
                 bias_accum_name(s.accum), s.backend.c_str(), s.quantity.c_str(),
                 s.delta_mode.c_str(), s.dout.c_str(), static_cast<long long>(s.rows), s.mean,
                 s.se, s.se > 0 ? s.mean / s.se : 0.0, s.mean_abs, s.nonfinite);
  const bool bad = std::ferror(fp) != 0;
  if ((std::fclose(fp) != 0) || bad)
    st::fail(path, ": write failed: ", std::strerror(errno), " (disk full?)");
  std::fprintf(stderr, "wrote %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attention numerics experiments (CPU emulation)"};
  app.require_subcommand(1);

  auto* sweep = app.add_subcommand("sweep", "Golden et al. deviation sweep: flash vs baseline vs FP64");
  bool quick = false, plan_only = false;
  std::string sweep_csv;
  int threads = 0, max_T = 8192, every_mac_max_T = 2048, heads = 0;
  uint64_t seed = 1;
  sweep->add_flag("--quick", quick, "small subset (seconds; for CI), same table format");
  sweep->add_option("--csv", sweep_csv, "write the CSV here");
  sweep->add_option("--threads", threads, "OpenMP threads (0: default)");
  sweep->add_option("--seed", seed, "input seed");
  sweep->add_option("--max-T", max_T, "longest sequence of the length sweep")->check(CLI::Range(128, 65536));
  sweep->add_option("--every-mac-max-T", every_mac_max_T, "every_mac only up to this T (its emulation is 6-25x slower)");
  sweep->add_option("--heads", heads, "heads per setting (0: 16 at T<=256 down to 2 at T>=2048)");
  sweep->add_flag("--plan", plan_only, "print the plan and the estimated time, run nothing");

  auto* bias = app.add_subcommand("bias", "Qiu & Yao tied-maximum bias of O and delta");
  BiasConfig bc;
  std::string bias_csv;
  std::vector<std::string> kinds, douts;
  bool no_deltas = false;
  bias->add_option("--rows", bc.rows, "distinct rows per row kind");
  bias->add_option("--keys", bc.keys, "keys per row");
  bias->add_option("--d", bc.d, "head dim (even)");
  bias->add_option("--block-k", bc.block_k, "flash key tile");
  bias->add_option("--ties", bc.ties, "tied maxima per tied row");
  bias->add_option("--top", bc.top, "score of the maximum");
  bias->add_option("--gap-lo", bc.gap_lo, "other keys at least this far below the maximum");
  bias->add_option("--gap-hi", bc.gap_hi, "other keys at most this far below the maximum");
  bias->add_option("--v-mean", bc.v_mean, "mean of V");
  bias->add_option("--v-std", bc.v_std, "std of V");
  bias->add_option("--betas", bc.betas, "stabilized flash betas")->delimiter(',');
  bias->add_option("--kinds", kinds, "row kinds: tied_tile,tied_any,single,diffuse")->delimiter(',');
  bias->add_option("--douts", douts, "dO kinds: ones,normal")->delimiter(',');
  bias->add_flag("--no-deltas", no_deltas, "O only");
  bias->add_option("--seed", bc.seed, "seed");
  bias->add_option("--threads", bc.threads, "OpenMP threads (0: default)");
  bias->add_option("--csv", bias_csv, "write the CSV here");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*sweep)
      return run_sweep(quick, sweep_csv, threads, seed, max_T, every_mac_max_T, heads, plan_only);
    if (!kinds.empty()) {
      bc.kinds.clear();
      for (const auto& k : kinds) bc.kinds.push_back(parse_bias_rows(k));
    }
    if (!douts.empty()) {
      bc.douts.clear();
      for (const auto& k : douts) bc.douts.push_back(parse_dout_kind(k));
    }
    bc.deltas = !no_deltas;
    const BiasReport rep = run_bias_experiment(bc);
    print_bias(bc, rep);
    if (!bias_csv.empty()) write_bias_csv(bias_csv, bc, rep);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_deviation: %s\n", e.what());
    return 1;
  }
  return 0;
}
