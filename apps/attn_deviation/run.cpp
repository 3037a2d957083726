// attn_deviation run: one lab configuration, every axis a flag (attention/deviation.h).
#include <cstdio>

#include "core/error.h"
#include "apps/attn_deviation/common.h"

namespace st::attn_tool {

namespace {

void print_summary(const DeviationSpec& s, const Summary& m, int heads) {
  std::printf("| statistic (per head, then mean ± SE over %d heads) | value |\n|---|---|\n", heads);
  const std::pair<const char*, const MeanSe*> rows[] = {
      {"mean abs err O32 (before the final rounding)", &m.mean_o32},
      {"mean abs err O (stored)", &m.mean_o},
      {"max abs err O32", &m.max_o32},
      {"max abs err O", &m.max_o},
      {"bias O32 (mean signed err)", &m.bias_o32},
      {"bias O", &m.bias_o},
      {"relative err O (mean abs err / mean abs O_gold)", &m.rel_o},
  };
  for (const auto& [name, v] : rows) std::printf("| %s | %s |\n", name, pm(*v).c_str());
  if (s.deltas) {
    std::printf("| delta mean abs err (dO %s) | %s |\n", dout_kind_name(s.dout), pm(m.delta_abs).c_str());
    std::printf("| delta bias | %s |\n", pm(m.delta_bias).c_str());
  }
  std::printf("| tied rows (fraction) | %.4f |\n", m.tied_frac);
}

}  // namespace

int run_cmd(const std::vector<std::pair<std::string, std::string>>& settings, int threads,
            const std::string& csv, bool plan_only, const std::string& cmdline) {
  DeviationSpec s;
  for (const auto& [k, v] : settings) set_spec_field(s, k, v, "attn_deviation run");
  try {
    validate(s);
  } catch (const Error& e) {
    fail("attn_deviation run: ", e.what());
  }
  const double est = estimate_seconds(s);
  std::fprintf(stderr, "attn_deviation run: %d heads, T %d, d %d; estimated %s of CPU time\n",
               s.heads, s.T, s.d, duration(est).c_str());
  if (plan_only) return 0;
  const double t0 = now_s();
  const std::string load0 = loadavg();
  double last = t0;
  const auto heads = run_deviation(s, threads, [&](int done, int total) {
    if (now_s() - last > 2 || done == total) {
      last = now_s();
      std::fprintf(stderr, "  %d/%d heads, %s\n", done, total, duration(last - t0).c_str());
    }
  });
  const double wall = now_s() - t0;
  std::printf("## attn_deviation run\n\n%s\n\nSettings:", cmdline.c_str());
  for (const auto& [c, v] : s.columns())
    if (!v.empty()) std::printf(" %s=%s", c.c_str(), v.c_str());
  std::printf(
      "\nGolden: baseline in FP64 on the same rounded inputs. Wall %s, load average %s at "
      "start, %s at end.\n\n",
      duration(wall).c_str(), load0.c_str(), loadavg().c_str());
  print_summary(s, summarize(heads), s.heads);
  if (!csv.empty()) {
    write_file(csv, head_csv_header() + head_csv_rows(s, heads));
    nlohmann::json meta = sidecar_meta("attn_deviation run", cmdline, wall, load0, threads);
    meta["golden"] = "baseline attention with every point in FP64 on the same rounded inputs";
    meta["columns"] = head_csv_columns();
    write_sidecar(csv, meta);
    std::fprintf(stderr, "wrote %s and %s.json\n", csv.c_str(), csv.c_str());
  }
  return 0;
}

}  // namespace st::attn_tool
