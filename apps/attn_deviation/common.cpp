// attn_deviation: shared helpers (common.h).
#include "apps/attn_deviation/common.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace st::attn_tool {

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

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i == 0) {
      const size_t slash = a.rfind("/bin/");
      if (slash != std::string::npos) a = "build" + a.substr(slash);  // build/bin/attn_deviation
    }
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-_./:=,+") == std::string::npos;
    out += (i ? " " : "") + (plain ? a : "'" + a + "'");
  }
  return out;
}

void write_file(const std::string& path, const std::string& text) {
  FILE* fp = std::fopen(path.c_str(), "w");
  if (!fp) fail(path, ": cannot open for writing: ", std::strerror(errno));
  const bool short_write = std::fwrite(text.data(), 1, text.size(), fp) != text.size();
  if ((std::fclose(fp) != 0) || short_write)
    fail(path, ": write failed: ", std::strerror(errno), " (disk full?)");
}

nlohmann::json sidecar_meta(const std::string& tool, const std::string& cmdline, double wall,
                            const std::string& load_start, int threads) {
  nlohmann::json meta;
  meta["tool"] = tool;
  meta["command"] = cmdline;
  meta["date"] = utc_now();
  meta["wall_seconds"] = wall;
  if (!load_start.empty()) meta["load_average_start"] = load_start;
  meta["load_average_end"] = loadavg();
  meta["threads"] = threads;
  return meta;
}

void write_sidecar(const std::string& csv_path, const nlohmann::json& meta) {
  write_file(csv_path + ".json", meta.dump(2) + "\n");
}

std::string duration(double s) {
  char buf[48];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  else
    std::snprintf(buf, sizeof buf, "%d min %02d s", static_cast<int>(s) / 60,
                  static_cast<int>(s) % 60);
  return buf;
}

namespace {

const char* const kMetricCols[][2] = {
    {"head", "head index (its inputs are seeded by seed, T, d and head only)"},
    {"max_o32", "max |O32 - O_gold| over the head's elements; O32 = O before its final rounding"},
    {"mean_o32", "mean |O32 - O_gold|"},
    {"std_o32", "population std of |O32 - O_gold|"},
    {"max_o", "max |O - O_gold|, O = the stored O (format out)"},
    {"mean_o", "mean |O - O_gold|"},
    {"std_o", "population std of |O - O_gold|"},
    {"bias_o32", "mean signed O32 - O_gold"},
    {"bias_o", "mean signed O - O_gold"},
    {"mean_abs_golden", "mean |O_gold| (the scale of O)"},
    {"delta_mean_abs", "mean |delta - delta_gold| over rows (empty without deltas)"},
    {"delta_bias", "mean signed delta - delta_gold over rows"},
    {"tied_rows", "rows whose maximum is tied within tie_tol"},
    {"rows", "query rows"},
    {"seconds", "thread time of the head (the machine may be shared)"},
};

std::string g(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6e", x);
  return buf;
}

}  // namespace

std::string head_csv_header() {
  std::string h;
  for (const auto& [c, v] : DeviationSpec{}.columns()) h += c + ",";
  for (const auto& c : kMetricCols) h += std::string(c[0]) + ",";
  h.back() = '\n';
  return h;
}

nlohmann::json head_csv_columns() {
  nlohmann::json j;
  for (const auto& k : deviation_spec_keys()) j[k.name] = k.help;
  j.erase("tile");
  j.erase("heads");
  j["round_ops"] = "1: every op's intermediate result rounded too (every_op, every_mac)";
  j["beta"] = "stabilized flash's beta (empty for other backends)";
  j["block_q"] = "flash query tile Br, 0: one tile (empty for baseline)";
  j["block_k"] = "flash key tile Bc, 0: one tile per row (empty for baseline)";
  for (const auto& c : kMetricCols) j[c[0]] = c[1];
  return j;
}

std::string head_csv_rows(const DeviationSpec& s, const std::vector<HeadDeviation>& heads) {
  std::string prefix;
  for (const auto& [c, v] : s.columns()) prefix += v + ",";
  std::string out;
  for (const HeadDeviation& h : heads) {
    out += prefix + std::to_string(h.head) + "," + g(h.o32.max) + "," + g(h.o32.mean()) + "," +
           g(h.o32.sd()) + "," + g(h.o.max) + "," + g(h.o.mean()) + "," + g(h.o.sd()) + "," +
           g(h.bias_o32) + "," + g(h.bias_o) + "," + g(h.mean_abs_golden) + "," +
           (s.deltas ? g(h.delta_mean_abs) : "") + "," + (s.deltas ? g(h.delta_bias) : "") + "," +
           std::to_string(h.tied_rows) + "," + std::to_string(h.rows) + "," +
           std::to_string(h.seconds) + "\n";
  }
  return out;
}

Summary summarize(const std::vector<HeadDeviation>& heads) {
  std::vector<double> v[9];
  Summary s;
  int64_t tied = 0, rows = 0;
  for (const auto& h : heads) {
    const double x[9] = {h.o32.mean(), h.o.mean(), h.o32.max, h.o.max, h.bias_o32, h.bias_o,
                         h.mean_abs_golden > 0 ? h.o.mean() / h.mean_abs_golden : 0.0,
                         h.delta_mean_abs, h.delta_bias};
    for (int i = 0; i < 9; ++i) v[i].push_back(x[i]);
    tied += h.tied_rows;
    rows += h.rows;
    s.seconds += h.seconds;
  }
  MeanSe* m[9] = {&s.mean_o32, &s.mean_o, &s.max_o32, &s.max_o, &s.bias_o32,
                  &s.bias_o, &s.rel_o, &s.delta_abs, &s.delta_bias};
  for (int i = 0; i < 9; ++i) *m[i] = mean_se(v[i]);
  s.tied_frac = rows ? static_cast<double>(tied) / rows : 0.0;
  return s;
}

std::string pm(const MeanSe& m) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3e ± %.1e", m.mean, m.se);
  return buf;
}

}  // namespace st::attn_tool
