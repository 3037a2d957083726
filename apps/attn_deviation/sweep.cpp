// attn_deviation sweep: a YAML plan of `run` configurations (bench/plans/*.yaml), each run
// once, with flash/baseline-style ratio tables. Plan format:
//
//   defaults: {KEY: VALUE, ...}          settings of every run (the `run` flags' names)
//   groups:
//     - name: seq                         --group selects one
//       title: "..."
//       axes: {KEY: [VALUES], ...}         cartesian product, in the order written
//       heads: 4 | {T: HEADS, ...}         heads per run, or per sequence length
//       skip: [{KEY: VALUE | [VALUES]}]    axis points matching every key listed are skipped
//       ratio: {num: {KEY: VALUE}, den: {KEY: VALUE}}   the two runs of each axis point
//
// Each axis point gives the runs defaults + point + num and defaults + point + den; runs with
// identical settings are computed once across the plan. Inputs depend only on seed, T, d
// and head, so num and den see the same inputs and the ratio's standard error is taken over
// paired heads (delta method with their covariance).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/error.h"
#include "apps/attn_deviation/common.h"

namespace st::attn_tool {
namespace {

using Settings = std::vector<std::pair<std::string, std::string>>;

struct Group {
  std::string name, title;
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  std::vector<Settings> skips;  // value lists joined by '|'
  Settings num, den;
  int heads = 0;
  std::map<int, int> heads_by_T;
};

struct Plan {
  Settings defaults;
  std::vector<Group> groups;
};

std::string scalar(const YAML::Node& n, const std::string& where) {
  if (!n.IsScalar()) fail(where, ": expected a single value");
  return n.as<std::string>();
}

Settings settings_of(const YAML::Node& n, const std::string& where) {
  Settings s;
  if (!n) return s;
  if (!n.IsMap()) fail(where, ": expected a map of settings {KEY: VALUE}");
  for (const auto& kv : n) {
    const std::string k = kv.first.as<std::string>();
    std::string v;
    if (kv.second.IsSequence()) {
      for (const auto& e : kv.second) v += (v.empty() ? "" : "|") + scalar(e, where + "." + k);
    } else {
      v = scalar(kv.second, where + "." + k);
    }
    s.emplace_back(k, v);
  }
  return s;
}

Plan load_plan(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail(path, ": cannot read the plan file (check the path)");
  } catch (const YAML::Exception& e) {
    fail(path, ": not valid YAML: ", e.what());
  }
  Plan p;
  for (const auto& kv : root) {
    const std::string k = kv.first.as<std::string>();
    if (k != "defaults" && k != "groups" && k != "title")
      fail(path, ": unknown top-level key '", k, "' (expected title, defaults, groups)");
  }
  p.defaults = settings_of(root["defaults"], path + ": defaults");
  if (!root["groups"] || !root["groups"].IsSequence())
    fail(path, ": 'groups' is missing or not a list");
  for (const auto& gn : root["groups"]) {
    Group g;
    const std::string where = path + ": group " + std::to_string(p.groups.size());
    for (const auto& kv : gn) {
      const std::string k = kv.first.as<std::string>();
      if (k != "name" && k != "title" && k != "axes" && k != "heads" && k != "skip" && k != "ratio")
        fail(where, ": unknown key '", k, "' (expected name, title, axes, heads, skip, ratio)");
    }
    if (!gn["name"]) fail(where, ": 'name' is missing");
    g.name = scalar(gn["name"], where + ".name");
    g.title = gn["title"] ? scalar(gn["title"], where + ".title") : g.name;
    const std::string gw = path + ": group " + g.name;
    if (gn["axes"]) {
      if (!gn["axes"].IsMap()) fail(gw, ".axes: expected a map {KEY: [VALUES]}");
      for (const auto& kv : gn["axes"]) {
        std::vector<std::string> vals;
        if (kv.second.IsSequence())
          for (const auto& e : kv.second) vals.push_back(scalar(e, gw + ".axes"));
        else
          vals.push_back(scalar(kv.second, gw + ".axes"));
        g.axes.emplace_back(kv.first.as<std::string>(), vals);
      }
    }
    if (gn["skip"]) {
      if (!gn["skip"].IsSequence()) fail(gw, ".skip: expected a list of maps");
      for (const auto& e : gn["skip"]) g.skips.push_back(settings_of(e, gw + ".skip"));
    }
    if (gn["ratio"]) {
      g.num = settings_of(gn["ratio"]["num"], gw + ".ratio.num");
      g.den = settings_of(gn["ratio"]["den"], gw + ".ratio.den");
      if (g.num.empty() || g.den.empty()) fail(gw, ".ratio: needs num and den settings");
    }
    if (gn["heads"]) {
      if (gn["heads"].IsMap()) {
        for (const auto& kv : gn["heads"]) g.heads_by_T[kv.first.as<int>()] = kv.second.as<int>();
      } else {
        g.heads = gn["heads"].as<int>();
      }
    }
    p.groups.push_back(g);
  }
  return p;
}

// The axis points of a group, in order (last axis fastest).
std::vector<Settings> points(const Group& g) {
  std::vector<Settings> out{{}};
  for (const auto& [k, vals] : g.axes) {
    std::vector<Settings> next;
    for (const auto& p : out)
      for (const auto& v : vals) {
        Settings q = p;
        q.emplace_back(k, v);
        next.push_back(q);
      }
    out = next;
  }
  return out;
}

bool skipped(const Group& g, const Settings& point) {
  for (const auto& sk : g.skips) {
    bool all = true;
    for (const auto& [k, vals] : sk) {
      bool hit = false;
      for (const auto& [pk, pv] : point)
        if (pk == k && ("|" + vals + "|").find("|" + pv + "|") != std::string::npos) hit = true;
      all = all && hit;
    }
    if (all && !sk.empty()) return true;
  }
  return false;
}

struct Job {
  DeviationSpec spec;
  std::vector<HeadDeviation> heads;
  bool done = false;
};

DeviationSpec make_spec(const Plan& p, const Group& g, const Settings& point,
                        const Settings& side, const std::string& where) {
  DeviationSpec s;
  for (const auto& [k, v] : p.defaults) set_spec_field(s, k, v, where + " defaults");
  for (const auto& [k, v] : point) set_spec_field(s, k, v, where + " axes");
  for (const auto& [k, v] : side) set_spec_field(s, k, v, where + " ratio");
  if (g.heads > 0) s.heads = g.heads;
  if (!g.heads_by_T.empty()) {
    auto it = g.heads_by_T.find(s.T);
    if (it == g.heads_by_T.end()) fail(where, ": heads has no entry for T = ", s.T);
    s.heads = it->second;
  }
  try {
    validate(s);
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return s;
}

// Ratio of mean a to mean b over paired heads, with the delta-method standard error; NaN
// when b's mean is 0 (e.g. baseline in FP64 is the golden itself).
MeanSe paired_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  MeanSe r;
  r.mean = r.se = std::nan("");
  const int n = static_cast<int>(std::min(a.size(), b.size()));
  r.n = n;
  if (n == 0) return r;
  double ma = 0, mb = 0;
  for (int i = 0; i < n; ++i) ma += a[i], mb += b[i];
  ma /= n, mb /= n;
  if (mb == 0) return r;
  r.mean = ma / mb;
  r.se = 0;
  if (n < 2) return r;
  double va = 0, vb = 0, cab = 0;
  for (int i = 0; i < n; ++i) {
    va += (a[i] - ma) * (a[i] - ma);
    vb += (b[i] - mb) * (b[i] - mb);
    cab += (a[i] - ma) * (b[i] - mb);
  }
  va /= n - 1, vb /= n - 1, cab /= n - 1;
  const double var = (va - 2 * r.mean * cab + r.mean * r.mean * vb) / (mb * mb) / n;
  r.se = std::sqrt(std::max(0.0, var));
  return r;
}

std::string ratio_text(const MeanSe& r) {
  if (!std::isfinite(r.mean)) return "- (baseline error 0)";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f ± %.1g", r.mean, r.se);
  return buf;
}

}  // namespace

int sweep_cmd(const std::string& plan_file, int threads, const std::string& csv,
              bool plan_only, const std::string& only_group, const std::string& cmdline) {
  const Plan plan = load_plan(plan_file);
  // Runs, deduplicated across the plan; per group: (point, num job, den job).
  std::vector<Job> jobs;
  std::map<std::string, size_t> index;
  struct Row {
    Settings point;
    size_t num, den;
  };
  std::vector<std::vector<Row>> rows(plan.groups.size());
  bool any = false;
  for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
    const Group& g = plan.groups[gi];
    if (!only_group.empty() && g.name != only_group) continue;
    any = true;
    const std::string where = plan_file + ": group " + g.name;
    for (const Settings& pt : points(g)) {
      if (skipped(g, pt)) continue;
      size_t ids[2];
      for (int side = 0; side < 2; ++side) {
        const DeviationSpec s = make_spec(plan, g, pt, side == 0 ? g.num : g.den, where);
        const std::string key = s.key() + "heads=" + std::to_string(s.heads);
        auto it = index.find(key);
        if (it == index.end()) {
          it = index.emplace(key, jobs.size()).first;
          jobs.push_back({s, {}, false});
        }
        ids[side] = it->second;
        if (g.num.empty()) break;  // no ratio: one run per point
      }
      rows[gi].push_back({pt, ids[0], g.num.empty() ? ids[0] : ids[1]});
    }
  }
  if (!any) fail(plan_file, ": no group named '", only_group, "'");
  double est = 0;
  for (const Job& j : jobs) est += estimate_seconds(j.spec);
  const int nthreads = threads > 0 ? threads : 2;
  std::fprintf(stderr,
               "attn_deviation sweep %s: %zu runs; estimated %s of CPU time (about %s on %d "
               "threads)\n",
               plan_file.c_str(), jobs.size(), duration(est).c_str(),
               duration(est / nthreads).c_str(), nthreads);
  if (plan_only) {
    for (const Job& j : jobs) {
      std::printf("%8.1f s  heads=%d", estimate_seconds(j.spec), j.spec.heads);
      for (const auto& [c, v] : j.spec.columns())
        if (!v.empty()) std::printf(" %s=%s", c.c_str(), v.c_str());
      std::printf("\n");
    }
    return 0;
  }
  const double t0 = now_s();
  const std::string load0 = loadavg();
  double spent_est = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].heads = run_deviation(jobs[i].spec, threads);
    spent_est += estimate_seconds(jobs[i].spec);
    const double el = now_s() - t0;
    std::fprintf(stderr, "  run %zu/%zu done, %s elapsed, about %s left\n", i + 1, jobs.size(),
                 duration(el).c_str(), duration(el / spent_est * (est - spent_est)).c_str());
  }
  const double wall = now_s() - t0;

  std::printf("## attn_deviation sweep\n\n%s\n\nPlan %s: %zu runs, wall %s on %d threads, load "
              "average %s at start, %s at end. Golden: baseline in FP64 on the same rounded "
              "inputs. Per head: mean |O - O_gold| (o32: before the final rounding; O: stored); "
              "cells: mean ± SE over heads; ratio = num / den of those means, SE over paired "
              "heads.\n",
              cmdline.c_str(), plan_file.c_str(), jobs.size(), duration(wall).c_str(), nthreads,
              load0.c_str(), loadavg().c_str());
  std::string ratio_csv =
      "group,num,den,point,heads,num_mean_o32,num_se_o32,den_mean_o32,den_se_o32,ratio_o32,"
      "ratio_o32_se,num_mean_o,num_se_o,den_mean_o,den_se_o,ratio_o,ratio_o_se\n";
  for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
    const Group& g = plan.groups[gi];
    if (rows[gi].empty()) continue;
    auto text = [](const Settings& s) {
      std::string t;
      for (const auto& [k, v] : s) t += (t.empty() ? "" : " ") + k + "=" + v;
      return t;
    };
    std::printf("\n### %s\n\n", g.title.c_str());
    std::string common;
    for (const auto& [k, v] : plan.defaults) common += (common.empty() ? "" : " ") + k + "=" + v;
    std::printf("Defaults: %s.%s%s\n\n", common.c_str(),
                g.num.empty() ? "" : (" num: " + text(g.num)).c_str(),
                g.num.empty() ? "" : (", den: " + text(g.den)).c_str());
    std::string head = "|", rule = "|";
    for (const auto& [k, vals] : g.axes) head += " " + k + " |", rule += "---|";
    if (g.num.empty()) {
      std::printf("%s heads | mean abs err o32 | mean abs err O | bias O | mean abs O_gold |\n", head.c_str());
      std::printf("%s--:|---|---|---|---|\n", rule.c_str());
    } else {
      const std::string n = text(g.num), d = text(g.den);
      std::printf("%s heads | %s o32 | %s o32 | ratio o32 | %s O | %s O | ratio O |\n",
                  head.c_str(), n.c_str(), d.c_str(), n.c_str(), d.c_str());
      std::printf("%s--:|---|---|---|---|---|---|\n", rule.c_str());
    }
    for (const Row& r : rows[gi]) {
      std::string line = "|";
      for (const auto& [k, v] : r.point) line += " " + v + " |";
      const Job& a = jobs[r.num];
      const Job& b = jobs[r.den];
      const Summary sa = summarize(a.heads), sb = summarize(b.heads);
      if (g.num.empty()) {
        std::vector<double> gold;
        for (const auto& h : a.heads) gold.push_back(h.mean_abs_golden);
        std::printf("%s %d | %s | %s | %s | %s |\n", line.c_str(), a.spec.heads,
                    pm(sa.mean_o32).c_str(), pm(sa.mean_o).c_str(), pm(sa.bias_o).c_str(),
                    pm(mean_se(gold)).c_str());
        continue;
      }
      std::vector<double> a32, b32, ao, bo;
      for (const auto& h : a.heads) a32.push_back(h.o32.mean()), ao.push_back(h.o.mean());
      for (const auto& h : b.heads) b32.push_back(h.o32.mean()), bo.push_back(h.o.mean());
      const MeanSe r32 = paired_ratio(a32, b32), ro = paired_ratio(ao, bo);
      std::printf("%s %d | %s | %s | %s | %s | %s | %s |\n", line.c_str(), a.spec.heads,
                  pm(sa.mean_o32).c_str(), pm(sb.mean_o32).c_str(), ratio_text(r32).c_str(),
                  pm(sa.mean_o).c_str(), pm(sb.mean_o).c_str(), ratio_text(ro).c_str());
      // An undefined ratio is an empty field (pandas reads NaN).
      auto field = [](double x, const char* fmt) {
        if (!std::isfinite(x)) return std::string();
        char b[48];
        std::snprintf(b, sizeof b, fmt, x);
        return std::string(b);
      };
      char buf[512];
      std::snprintf(buf, sizeof buf, "%s,%s,%s,%s,%d,%.6e,%.3e,%.6e,%.3e,", g.name.c_str(),
                    text(g.num).c_str(), text(g.den).c_str(), text(r.point).c_str(),
                    a.spec.heads, sa.mean_o32.mean, sa.mean_o32.se, sb.mean_o32.mean,
                    sb.mean_o32.se);
      ratio_csv += buf + field(r32.mean, "%.6g") + "," + field(r32.se, "%.3g");
      std::snprintf(buf, sizeof buf, ",%.6e,%.3e,%.6e,%.3e,", sa.mean_o.mean, sa.mean_o.se,
                    sb.mean_o.mean, sb.mean_o.se);
      ratio_csv += buf + field(ro.mean, "%.6g") + "," + field(ro.se, "%.3g") + "\n";
    }
  }
  if (!csv.empty()) {
    std::string text = head_csv_header();
    for (const Job& j : jobs) text += head_csv_rows(j.spec, j.heads);
    write_file(csv, text);
    const std::string rpath = csv.substr(0, csv.rfind(".csv")) + "_ratios.csv";
    write_file(rpath, ratio_csv);
    nlohmann::json meta = sidecar_meta("attn_deviation sweep", cmdline, wall, load0, nthreads);
    meta["plan"] = plan_file;
    meta["runs"] = jobs.size();
    meta["golden"] = "baseline attention with every point in FP64 on the same rounded inputs";
    meta["columns"] = head_csv_columns();
    meta["ratios_csv"] = rpath;
    write_sidecar(csv, meta);
    std::fprintf(stderr, "wrote %s, %s.json and %s\n", csv.c_str(), csv.c_str(), rpath.c_str());
  }
  return 0;
}

}  // namespace st::attn_tool
