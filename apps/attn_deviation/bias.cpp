// attn_deviation bias: Qiu & Yao's tied-maximum bias of O and delta (attention/experiments.h).
#include "apps/attn_deviation/bias.h"

#include <cstdio>

#include "core/error.h"
#include "apps/attn_deviation/common.h"

namespace st::attn_tool {
namespace {

std::string describe_setup(const BiasConfig& bc, const BiasReport& rep) {
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "Rows: %d per kind (%d head calls x %d rows; the calls are the independent V draws the "
      "SE is taken over), %d keys, head dim %d, key tile %d, non-causal; ties = %d at top = %g "
      "(FP32 score %.9g), others top - U(%g, %g); diffuse rows U(top - %g, top); V ~ %s in %s, "
      "drawn per call and shared by its rows; compute %s. Golden = baseline FP64 on the same "
      "inputs. Error = backend - golden, averaged over head dims per row; mean over rows +- "
      "standard error over calls; z = mean / SE. Seed %llu.",
      rep.calls_per_kind * rep.rows_per_call, rep.calls_per_kind, rep.rows_per_call, bc.keys,
      bc.d, bc.block_k, bc.ties, bc.top, rep.top_fp32, bc.gap_lo, bc.gap_hi, bc.diffuse_width,
      bc.v.str().c_str(), dtype_name(bc.compute), dtype_name(bc.compute),
      static_cast<unsigned long long>(bc.seed));
  std::string s = buf;
  const std::pair<const char*, std::optional<DType>> ov[] = {
      {"scores", bc.scores}, {"probs", bc.probs}, {"lsum", bc.lsum},
      {"lsum_mac", bc.lsum_mac}, {"out", bc.out}};
  std::string o;
  for (const auto& [k, v] : ov)
    if (v) o += std::string(o.empty() ? "" : ", ") + k + " = " + dtype_name(*v);
  if (!o.empty()) s += " Overrides on every backend: " + o + ".";
  s += std::string(" Stabilized flash: tie_shift = ") + tie_shift_name(bc.tie_shift) + ".";
  return s;
}

}  // namespace

void print_bias(const BiasConfig& bc, const BiasReport& rep, const std::string& cmdline) {
  std::printf("## attn_deviation bias\n\n%s\n\n%s\n", cmdline.c_str(),
              describe_setup(bc, rep).c_str());
  std::printf("Wall %.1f s, load average %s at end.\n", rep.seconds, loadavg().c_str());
  std::printf("Rows whose ties share one key tile:");
  for (size_t i = 0; i < bc.kinds.size(); ++i)
    std::printf(" %s %.1f%%", bias_rows_name(bc.kinds[i]), 100 * rep.same_tile_fraction[i]);
  std::printf(".\n");
  std::printf(
      "bf16_accum: gpu rule with accum = the compute format (flash O~, l, rescales in it: the "
      "paper's implementation; baseline: its exponentials and row sum in it), unless lsum is "
      "overridden. fp32_accum: gpu rule (O~, l FP32; O rounded once). fp64_rounded: the exact "
      "O rounded once to the compute format.\n");

  std::printf("\n### Mean signed error of O (stored) and o32 (before the final rounding)\n\n");
  std::printf("| rows | accumulator | backend | O mean ± SE | z | o32 mean ± SE | z | mean abs O err |\n");
  std::printf("|---|---|---|---|--:|---|--:|--:|\n");
  for (const auto& s : rep.series) {
    if (s.quantity != "o") continue;
    const BiasSeries* s32 = rep.find(s.kind, s.accum, s.backend, "o32");
    char o32[64] = "-", z32[16] = "-";
    if (s32) {
      std::snprintf(o32, sizeof o32, "%+.3e ± %.1e", s32->mean, s32->se);
      std::snprintf(z32, sizeof z32, "%.1f", s32->se > 0 ? s32->mean / s32->se : 0.0);
    }
    std::printf("| %s | %s | %s | %+.3e ± %.1e | %.1f | %s | %s | %.2e |%s\n",
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
  std::printf("| rows | accumulator | dO | backend | delta mode | mean ± SE | z | mean abs err |\n");
  std::printf("|---|---|---|---|---|---|--:|--:|\n");
  for (const auto& s : rep.series) {
    if (s.quantity != "delta") continue;
    std::printf("| %s | %s | %s | %s | %s | %+.3e ± %.1e | %.1f | %.2e |%s\n",
                bias_rows_name(s.kind), bias_accum_name(s.accum), s.dout.c_str(),
                s.backend.c_str(), s.delta_mode.c_str(), s.mean, s.se,
                s.se > 0 ? s.mean / s.se : 0.0, s.mean_abs,
                s.nonfinite > 0 ? " NON-FINITE ROWS" : "");
  }
}

void write_bias_csv(const std::string& path, const BiasConfig& bc, const BiasReport& rep,
                    const std::string& cmdline) {
  std::string text =
      "kind,accum,backend,quantity,delta_mode,dout,rows,calls,mean,se,z,mean_abs,nonfinite\n";
  for (const auto& s : rep.series) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s,%s,%s,%s,%s,%s,%lld,%d,%.6e,%.6e,%.3f,%.6e,%.6g\n",
                  bias_rows_name(s.kind), bias_accum_name(s.accum), s.backend.c_str(),
                  s.quantity.c_str(), s.delta_mode.c_str(), s.dout.c_str(),
                  static_cast<long long>(s.rows), rep.calls_per_kind, s.mean, s.se,
                  s.se > 0 ? s.mean / s.se : 0.0, s.mean_abs, s.nonfinite);
    text += buf;
  }
  write_file(path, text);
  nlohmann::json meta = sidecar_meta("attn_deviation bias", cmdline, rep.seconds, "", bc.threads);
  meta["setup"] = describe_setup(bc, rep);
  meta["columns"] = {
      {"kind", "tied_tile | tied_any | single | diffuse"},
      {"accum", "bf16_accum (gpu rule, accum = the compute format) | fp32_accum (gpu rule)"},
      {"backend", "flash | stabilized_b<beta> | baseline | fp64_rounded (exact O rounded once)"},
      {"quantity", "o (stored O) | o32 (O before the final rounding) | delta"},
      {"delta_mode", "delta: o | o_split | o_fp32 | dp_p | fp32_recompute"},
      {"dout", "delta: ones | normal"},
      {"rows", "rows with a finite error"},
      {"calls", "head calls (independent V draws) per kind"},
      {"mean", "mean over rows of the row's signed error (averaged over head dims for O)"},
      {"se", "standard error of mean, over calls"},
      {"z", "mean / se"},
      {"mean_abs", "mean |error|"},
      {"nonfinite", "fraction of rows with NaN/Inf (excluded)"}};
  write_sidecar(path, meta);
  std::fprintf(stderr, "wrote %s and %s.json\n", path.c_str(), path.c_str());
}

}  // namespace st::attn_tool
