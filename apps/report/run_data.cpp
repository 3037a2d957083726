// Reading a run directory for `report` (see run_data.h).
#include "apps/report/run_data.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "data/excerpt.h"
#include "train/config.h"

namespace fs = std::filesystem;

namespace st::report {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The file's complete lines; *incomplete is set when the last line has no newline (and
// is not returned). Throws naming the path when the file cannot be opened.
std::vector<std::string> read_lines(const std::string& path, bool* incomplete) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    fail("'", path, "' is not a regular file (a directory, FIFO or device?); expected the file",
         " train writes there");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read '", path, "': ", std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::vector<std::string> lines;
  size_t pos = 0;
  *incomplete = false;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) {
      // Whitespace only after the last newline is not a line.
      if (text.find_first_not_of(" \t\r", pos) != std::string::npos) *incomplete = true;
      break;
    }
    std::string l = text.substr(pos, nl - pos);
    if (!l.empty() && l.back() == '\r') l.pop_back();
    lines.push_back(std::move(l));
    pos = nl + 1;
  }
  return lines;
}

std::string fname(const std::string& path) { return fs::path(path).filename().string(); }

std::string skipped_note(const std::string& file, size_t incomplete, size_t bad) {
  std::string n;
  if (incomplete) n += file + ": skipped an incomplete last line (the run is still writing)";
  if (bad) {
    if (!n.empty()) n += "; ";
    n += file + ": skipped " + std::to_string(bad) + " malformed line" + (bad == 1 ? "" : "s");
  }
  return n;
}

// Column indices of `names` in t; fails naming the first that is absent.
std::vector<int> need_cols(const CsvTable& t, const std::string& path, const std::vector<std::string>& names) {
  std::vector<int> out;
  for (const auto& n : names) {
    const int c = t.col(n);
    if (c < 0) fail(fname(path), " has no column '", n, "' (header: ", [&] {
        std::string h;
        for (const auto& x : t.header) h += (h.empty() ? "" : ",") + x;
        return h;
      }(), ")");
    out.push_back(c);
  }
  return out;
}

// Strict parsing of one hook-CSV row: every field named in an error with file:line, the
// value (a printable excerpt) and what was expected.
struct RowCtx {
  const std::string& path;
  const CsvTable& t;
  size_t row;
  [[noreturn]] void bad(int c, const std::string& value, const std::string& expected) const {
    fail(path, ":", t.line_no[row], ": field '", t.header[static_cast<size_t>(c)], "' = '",
         excerpt(value), "': expected ", expected, " (the file is written by train's hooks:",
         " repair or delete that line)");
  }
  const std::string& at(int c) const { return t.rows[row][static_cast<size_t>(c)]; }
  // A whole-field integer in [lo, hi].
  int64_t integer(int c, int64_t lo, int64_t hi, const std::string& expected) const {
    const std::string& s = at(c);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi)
      bad(c, s, expected);
    return v;
  }
  int64_t step(int c) const {
    return integer(c, 0, std::numeric_limits<int64_t>::max(), "an integer step >= 0");
  }
  // A layer / head index below `n`; -1, or empty as files written before the hooks wrote
  // -1 have it: -1 (not per layer / head).
  int index(int c, int n, const char* what) const {
    if (at(c).empty() || at(c) == "-1") return -1;
    return static_cast<int>(integer(c, 0, n - 1, "-1 or a " + std::string(what) + " index in [0, " +
                                                      std::to_string(n - 1) + "] (" + what +
                                                      "s of the run: " + std::to_string(n) + ")"));
  }
  // A number (nan / inf allowed: the hooks write them); empty: NaN; absent column: NaN.
  double number(int c) const {
    if (c < 0) return kNaN;
    const std::string& s = at(c);
    if (s.empty()) return kNaN;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size()) bad(c, s, "a number");
    return v;
  }
};

// The rows of a hook CSV whose columns are `names` (checked present), appended to `out`:
// step, layer (below L) and head (below H) from the columns named so, the row's own fields
// set by fill(x, c, row) (c: the columns of `names`, in order), every field parsed strictly.
template <class Row, class Fill>
void hook_rows(std::vector<Row>& out, const CsvTable& t, const std::string& p, const std::vector<std::string>& names,
               int L, int H, Fill fill) {
  const auto c = need_cols(t, p, names);
  const int cs = t.col("step"), cl = t.col("layer"), ch = t.col("head");
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const RowCtx x{p, t, i};
    Row row;
    row.step = x.step(cs);
    row.layer = x.index(cl, L, "layer");
    row.head = x.index(ch, H, "head");
    fill(x, c, row);
    out.push_back(row);
  }
}

// Loads an optional CSV file with `parse` run on the table; a missing file becomes the note,
// one that cannot be read or holds a bad row throws.
template <class F>
void optional_csv(const std::string& dir, const std::string& file, FileState& state, const RunData& r, F parse) {
  const std::string path = (fs::path(dir) / file).string();
  if (!fs::exists(path)) {
    state.present = false;
    const std::string hint = hooks_hint(r, file);
    state.note = "no " + file + (hint.empty() ? "" : ": " + hint);
    return;
  }
  // A file that is there but cannot be read, or holds a malformed row, is an error: a report
  // that silently leaves out data would mislead.
  const CsvTable t = read_csv(path);
  parse(t, path);
  state.present = true;
  state.note = skipped_note(file, t.skipped_incomplete, t.skipped_bad);
}

void flatten(const YAML::Node& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      flatten(kv.second, prefix.empty() ? k : prefix + "." + k, out);
    }
  } else if (n.IsScalar()) {
    out[prefix] = n.as<std::string>();
  } else if (n.IsNull()) {
    out[prefix] = "";
  }
}

}  // namespace

int CsvTable::col(const std::string& name) const {
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i] == name) return static_cast<int>(i);
  return -1;
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> f;
  std::string cur;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      f.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  f.push_back(cur);
  for (auto& s : f) {  // trim
    const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    s = a == std::string::npos ? "" : s.substr(a, b - a + 1);
  }
  return f;
}

CsvTable read_csv(const std::string& path) {
  bool incomplete = false;
  const std::vector<std::string> lines = read_lines(path, &incomplete);
  CsvTable t;
  t.skipped_incomplete = incomplete ? 1 : 0;
  size_t i = 0;
  while (i < lines.size() && lines[i].find_first_not_of(" \t") == std::string::npos) ++i;
  if (i == lines.size()) fail("'", path, "' has no header line");
  t.header = split_csv_line(lines[i]);
  for (++i; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t") == std::string::npos) continue;
    auto f = split_csv_line(lines[i]);
    if (f.size() != t.header.size())
      fail(path, ":", i + 1, ": ", f.size(), " field", f.size() == 1 ? "" : "s", " ('",
           excerpt(lines[i]), "'), expected ", t.header.size(), " as in the header; repair or",
           " delete that line");
    t.rows.push_back(std::move(f));
    t.line_no.push_back(i + 1);
  }
  return t;
}

double to_num(const std::string& s) {
  if (s.empty()) return kNaN;
  const char* b = s.c_str();
  char* e = nullptr;
  const double v = std::strtod(b, &e);
  if (e == b || *e != '\0') return kNaN;
  return v;
}

int to_index(const std::string& s) {
  const double v = to_num(s);  // out of int's range: -1, as unparsable (lround would overflow)
  return std::isfinite(v) && std::fabs(v) < 2147483647.0 ? static_cast<int>(std::lround(v)) : -1;
}

std::string RunData::cfg(const std::string& key, const std::string& fallback) const {
  const auto it = config.find(key);
  return it == config.end() ? fallback : it->second;
}

namespace {
// The config's `key` when positive, else one more than the largest index(row) of the
// spectral, attention and drift rows (0 when there are none).
template <class Index>
int count_from(const RunData& r, const std::string& key, Index index) {
  const int v = to_index(r.cfg(key));
  if (v > 0) return v;
  int m = -1;
  for (const auto& x : r.spectral) m = std::max(m, index(x));
  for (const auto& x : r.attn) m = std::max(m, index(x));
  for (const auto& x : r.drift) m = std::max(m, index(x));
  return m + 1;
}
}  // namespace

int RunData::n_layer() const {
  return count_from(*this, "model.n_layer", [](const auto& x) { return x.layer; });
}

int RunData::n_head() const {
  return count_from(*this, "model.n_head", [](const auto& x) { return x.head; });
}

std::string hooks_hint(const RunData& r, const std::string& file) {
  if (r.config.empty()) return "";
  const std::string every = r.cfg("hooks.every");
  if (every.empty()) return "the run's config.yaml has no hooks.every (written before the hooks existed)";
  if (file == "events.jsonl") {
    const std::string z = r.cfg("hooks.spike_z");
    if (!z.empty() && to_num(z) == 0) return "spike detection was off (hooks.spike_z: 0)";
    return "no spike or other event was recorded";
  }
  if (to_index(every) == 0) {
    if (file == "wasserstein.csv" && r.cfg("hooks.reference_run").empty())
      return "the run had hooks.every: 0 and no hooks.reference_run";
    return "the run had hooks.every: 0";
  }
  if (file == "wasserstein.csv") {
    if (r.cfg("hooks.reference_run").empty()) return "the run had no hooks.reference_run";
    return "hooks.reference_run is set, but no checkpoint was compared yet";
  }
  const std::map<std::string, std::string> toggles = {{"spectral.csv", "hooks.spectral"},
                                                      {"attn_stats.csv", "hooks.attn_stats"},
                                                      {"delta_drift.csv", "hooks.delta_drift"},
                                                      {"grad_norms.csv", "hooks.grad_norms"}};
  const auto t = toggles.find(file);
  if (t != toggles.end() && r.cfg(t->second) == "false") return "the run had " + t->second + ": false";
  return "hooks.every is " + every + ", but the file is not there (no hook step written yet?)";
}

SeriesByKey spectral_series(const RunData& r, const std::string& matrix) {
  return series_by_key(
      r.spectral, [&](const SpectralRow& s) { return s.matrix == matrix; },
      [](const SpectralRow& s) { return s.sigma; });
}

RunData load_run(const std::string& dir) {
  RunData r;
  r.dir = dir;
  if (!fs::exists(dir)) fail("run directory '", dir, "' does not exist");
  if (!fs::is_directory(dir)) fail("'", dir, "' is not a run directory");
  const fs::path d(dir);
  r.name = fs::absolute(d).lexically_normal().filename().string();
  if (r.name.empty()) r.name = fs::absolute(d).lexically_normal().parent_path().filename().string();

  // config.yaml
  const fs::path cfg = d / "config.yaml";
  if (fs::exists(cfg)) {
    if (std::error_code ec; !fs::is_regular_file(cfg, ec))
      fail("'", cfg.string(), "' is not a regular file (a directory, FIFO or device?); restore the",
           " config.yaml train wrote, or remove it");
    try {
      flatten(YAML::LoadFile(cfg.string()), "", r.config);
    } catch (const std::exception& e) {
      r.config_note = "config.yaml could not be read: " + std::string(e.what());
    }
  } else {
    r.config_note = "no config.yaml";
  }
  // The shape keys size the report's tables: checked against train's bounds first.
  for (const auto& [key, hi] : {std::pair<const char*, int>{"model.n_layer", kMaxLayers},
                                {"model.n_head", kMaxHeads}, {"model.n_embd", kMaxEmbd},
                                {"model.max_seq_len", kMaxSeqLen}}) {
    const auto it = r.config.find(key);
    if (it == r.config.end()) continue;
    const std::string& v = it->second;
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || n < 1 || n > hi)
      fail(cfg.string(), ": ", key, " = '", excerpt(v), "': expected an integer between 1 and ", hi,
           " (train's range; config.yaml is written by train: restore it)");
  }
  if (!r.cfg("run.name").empty()) r.name = r.cfg("run.name");

  // metrics.jsonl (required)
  const fs::path mp = d / "metrics.jsonl";
  if (!fs::exists(mp)) fail("'", dir, "' has no metrics.jsonl (not a run directory, or the run never started)");
  bool incomplete = false;
  const auto lines = read_lines(mp.string(), &incomplete);
  struct StepRec {
    double loss, lr, grad_norm, loss_scale;
    bool skipped;
  };
  std::map<int64_t, StepRec> steps;
  std::map<int64_t, double> vals;
  size_t bad = 0;
  auto num = [](const nlohmann::json& j, const char* k) {
    const auto it = j.find(k);
    return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
  };
  for (const auto& l : lines) {
    if (l.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(l);
    } catch (const std::exception&) {
      ++bad;
      continue;
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) {
      ++bad;
      continue;
    }
    ++r.metrics_records;
    const int64_t s = j["step"].get<int64_t>();
    if (j.contains("loss")) {
      const auto sk = j.find("skipped");
      const bool skipped = sk != j.end() && ((sk->is_boolean() && sk->get<bool>()) ||
                                             (sk->is_number() && sk->get<double>() != 0));
      // JSON has no NaN: a non-finite loss is written as null or a string.
      double loss = num(j, "loss");
      steps[s] = {loss, num(j, "lr"), num(j, "grad_norm"), num(j, "loss_scale"), skipped};
    } else if (j.contains("val_loss")) {
      vals[s] = num(j, "val_loss");
    }
  }
  for (const auto& [s, v] : steps) {
    r.steps.push_back(s);
    r.loss.push_back(v.loss);
    r.lr.push_back(v.lr);
    r.grad_norm.push_back(v.grad_norm);
    r.loss_scale.push_back(v.loss_scale);
    r.skipped.push_back(v.skipped);
  }
  for (const auto& [s, v] : vals) {
    r.val_steps.push_back(s);
    r.val_loss.push_back(v);
  }
  r.metrics_note = skipped_note("metrics.jsonl", incomplete, bad);
  if (!r.metrics_note.empty()) r.skipped_lines.push_back(skipped_note(mp.string(), incomplete, bad));

  // checkpoints
  static const std::regex ck("ckpt_([0-9]{8})\\.bin");
  for (const auto& e : fs::directory_iterator(d)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(n, m, ck)) r.checkpoints[std::stoll(m[1].str())] = e.path().string();
  }

  // events.jsonl
  const fs::path ep = d / "events.jsonl";
  if (fs::exists(ep)) {
    if (std::error_code ec; !fs::is_regular_file(ep, ec))
      fail("'", ep.string(), "' is not a regular file (a directory, FIFO or device?); expected the",
           " file train writes there");
    try {
      bool inc = false;
      size_t ebad = 0;
      for (const auto& l : read_lines(ep.string(), &inc)) {
        if (l.find_first_not_of(" \t") == std::string::npos) continue;
        try {
          const auto j = nlohmann::json::parse(l);
          Event e;
          e.step = j.at("step").get<int64_t>();
          e.event = j.value("event", std::string());
          e.metric = j.value("metric", std::string());
          e.value = num(j, "value");
          e.mean = num(j, "mean");
          e.std = num(j, "std");
          e.z = num(j, "z");
          if (j.contains("action")) {
            const auto& a = j["action"];
            if (a.is_string()) e.action = a.get<std::string>();
            else if (a.is_array())
              for (const auto& x : a) e.action += (e.action.empty() ? "" : "+") + x.get<std::string>();
          }
          e.raw = l;
          r.events.push_back(e);
        } catch (const std::exception&) {
          ++ebad;
        }
      }
      r.events_state.present = true;
      r.events_state.note = skipped_note("events.jsonl", inc, ebad);
      if (!r.events_state.note.empty()) r.skipped_lines.push_back(skipped_note(ep.string(), inc, ebad));
    } catch (const std::exception& e) {
      r.events_state.note = std::string("events.jsonl could not be read: ") + e.what();
    }
  } else {
    const std::string hint = hooks_hint(r, "events.jsonl");
    r.events_state.note = "no events.jsonl" + (hint.empty() ? "" : ": " + hint);
  }

  // Indices are bounded by the run's shape (config.yaml), else by train's limits.
  const int L = r.cfg("model.n_layer").empty() ? kMaxLayers : to_index(r.cfg("model.n_layer"));
  const int H = r.cfg("model.n_head").empty() ? kMaxHeads : to_index(r.cfg("model.n_head"));
  using Cols = std::vector<int>;
  // A hook CSV into `rows` (hook_rows: its columns `names`, fill sets the row's own fields).
  const auto hook_csv = [&](const char* file, auto& rows, FileState& state, const std::vector<std::string>& names,
                            auto fill) {
    optional_csv(dir, file, state, r,
                 [&](const CsvTable& t, const std::string& p) { hook_rows(rows, t, p, names, L, H, fill); });
  };
  hook_csv("spectral.csv", r.spectral, r.spectral_state, {"step", "layer", "head", "matrix", "sigma"},
           [](const RowCtx& x, const Cols& c, SpectralRow& s) {
             s.matrix = x.at(c[3]);
             s.sigma = x.number(c[4]);
           });
  hook_csv("attn_stats.csv", r.attn, r.attn_state, {"step", "layer", "head", "stat", "value"},
           [](const RowCtx& x, const Cols& c, AttnRow& a) {
             a.stat = x.at(c[3]);
             a.value = x.number(c[4]);
           });
  optional_csv(dir, "delta_drift.csv", r.drift_state, r, [&](const CsvTable& t, const std::string& p) {
    const int cd = t.col("delta_drift"), ca = t.col("delta_abs_err"), cn = t.col("dwq_err_norm"),
              cr = t.col("dwq_rel_err"), cc = t.col("dwq_cos_prev");
    hook_rows(r.drift, t, p, {"step", "layer", "head", "delta_drift_cum"}, L, H,
              [&](const RowCtx& x, const Cols& c, DriftRow& d) {
                d.cum = x.number(c[3]);
                d.drift = x.number(cd);
                d.abs_err = x.number(ca);
                d.dwq_err_norm = x.number(cn);
                d.dwq_rel_err = x.number(cr);
                d.cos_prev = x.number(cc);
              });
  });
  hook_csv("grad_norms.csv", r.grad, r.grad_state, {"step", "tensor", "layer", "head", "norm"},
           [](const RowCtx& x, const Cols& c, GradRow& g) {
             g.tensor = x.at(c[1]);
             g.norm = x.number(c[4]);
           });
  hook_csv("wasserstein.csv", r.wasserstein, r.wasserstein_state,
           {"step", "tensor", "layer", "head", "w1", "w1_normalized", "max_abs_diff"},
           [](const RowCtx& x, const Cols& c, DistRow& d) {
             d.tensor = x.at(c[1]);
             d.w1 = x.number(c[4]);
             d.w1_normalized = x.number(c[5]);
             d.max_abs_diff = x.number(c[6]);
           });
  return r;
}

}  // namespace st::report
