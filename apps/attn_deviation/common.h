// attn_deviation: pieces its subcommands share (apps/attn_deviation/main.cpp lists them).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention/deviation.h"

namespace st::attn_tool {

std::string loadavg();  // the 1-minute load average (the machine may be shared)
double now_s();
std::string utc_now();  // 2026-11-27T01:02:03Z
// The command line as typed, shell-quoted where needed.
std::string command_line(int argc, char** argv);
// Writes text to path, or fails with a one-line error naming the path.
void write_file(const std::string& path, const std::string& text);
// The sidecar's common fields: tool, command, date, wall time, load average at start (if
// known) and now, threads.
nlohmann::json sidecar_meta(const std::string& tool, const std::string& cmdline, double wall,
                            const std::string& load_start, int threads);
// path + ".json": what produced a CSV (command, date, load, threads, wall time, columns).
void write_sidecar(const std::string& csv_path, const nlohmann::json& meta);
// "12.3 s" / "4 min 05 s"
std::string duration(double s);

// The per-head CSV of deviation runs (tidy: one header line, one row per head).
std::string head_csv_header();
std::string head_csv_rows(const DeviationSpec& s, const std::vector<HeadDeviation>& heads);
nlohmann::json head_csv_columns();  // column -> meaning, for the sidecar

struct Summary {
  MeanSe mean_o32, mean_o, max_o32, max_o, bias_o32, bias_o, rel_o, delta_abs, delta_bias;
  double tied_frac = 0, seconds = 0;
};
Summary summarize(const std::vector<HeadDeviation>& heads);
std::string pm(const MeanSe& m);  // "1.234e-04 ± 5.6e-06"

int run_cmd(const std::vector<std::pair<std::string, std::string>>& settings, int threads,
            const std::string& csv, bool plan_only, const std::string& cmdline);
int sweep_cmd(const std::string& plan_file, int threads, const std::string& csv,
              bool plan_only, const std::string& only_group, const std::string& cmdline);

}  // namespace st::attn_tool
