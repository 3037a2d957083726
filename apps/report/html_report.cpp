// `report`'s HTML page (see html_report.h): the runs' files turned into one JSON document,
// inlined with the chart library and the page's script. Everything a reader compares is
// computed here, in double, from the files at full resolution (Δloss against the reference
// at the steps both runs logged, per-layer gradient norms, weight distances from the
// checkpoints); the script only draws, smooths on request and aggregates for hover text.
#include "apps/report/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "analysis/weight_distance.h"
#include "core/error.h"

namespace st::report {

namespace assets {
extern const char* const uplot_js;
extern const char* const uplot_css;
extern const char* const report_kit_js;
extern const char* const report_js;
extern const char* const report_css;
}  // namespace assets

namespace {

using nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Arrays of training-step values are thinned to at most this many points per series by
// keeping, per bucket of consecutive steps, the first point and the points with the
// bucket's smallest and largest value: a one-step spike survives, a curve of 10^6 steps
// stays a few hundred kB. Runs of at most kMaxPoints steps are drawn exactly.
constexpr size_t kMaxPoints = 12000;

std::vector<size_t> thin_indices(const std::vector<double>& y, size_t max_points) {
  std::vector<size_t> keep;
  const size_t n = y.size();
  if (n <= max_points) {
    keep.resize(n);
    for (size_t i = 0; i < n; ++i) keep[i] = i;
    return keep;
  }
  const size_t buckets = std::max<size_t>(1, max_points / 3);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * n / buckets, hi = (b + 1) * n / buckets;
    size_t imin = lo, imax = lo;
    for (size_t i = lo; i < hi; ++i) {
      if (!std::isfinite(y[i])) {  // a NaN / inf loss is an event: keep it
        keep.push_back(i);
        continue;
      }
      if (!std::isfinite(y[imin]) || y[i] < y[imin]) imin = i;
      if (!std::isfinite(y[imax]) || y[i] > y[imax]) imax = i;
    }
    keep.push_back(lo);
    keep.push_back(imin);
    keep.push_back(imax);
  }
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  return keep;
}

// A number for JSON: NaN and inf become null (JSON has neither); the page draws a gap.
json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json nums(const std::vector<double>& v, const std::vector<size_t>& idx) {
  json a = json::array();
  for (size_t i : idx) a.push_back(num(v[i]));
  return a;
}
json nums(const std::vector<double>& v) {
  json a = json::array();
  for (double x : v) a.push_back(num(x));
  return a;
}
json steps_json(const std::vector<int64_t>& s, const std::vector<size_t>& idx) {
  json a = json::array();
  for (size_t i : idx) a.push_back(s[i]);
  return a;
}

std::string model_shape(const RunData& r) {
  const std::string L = r.cfg("model.n_layer"), H = r.cfg("model.n_head"), C = r.cfg("model.n_embd");
  if (L.empty()) return "";
  std::string s = L + "L · " + H + "H · " + C + "C";
  const std::string T = r.cfg("train.seq_len", r.cfg("model.max_seq_len"));
  if (!T.empty()) s += " · T " + T;
  if (!r.cfg("model.vocab_size").empty()) s += " · V " + r.cfg("model.vocab_size");
  return s;
}

std::string event_text(const RunData& r, const Event& e) {
  std::ostringstream t;
  t.precision(4);
  t << r.name << ": " << (e.event.empty() ? "event" : e.event);
  if (!e.metric.empty()) t << " in " << e.metric;
  t << " at step " << e.step;
  if (std::isfinite(e.value)) t << ": " << e.value;
  if (std::isfinite(e.mean)) t << " (mean " << e.mean;
  if (std::isfinite(e.std)) t << " ± " << e.std;
  if (std::isfinite(e.mean)) t << ")";
  if (std::isfinite(e.z)) t << ", z " << e.z;
  if (!e.action.empty()) t << ", action: " << e.action;
  return t.str();
}

// Values of `run` minus the reference's at the steps both have (the reference's value is
// looked up by step, so runs logging different steps still line up).
std::pair<std::vector<int64_t>, std::vector<double>> minus_reference(const std::vector<int64_t>& steps,
                                                                     const std::vector<double>& v,
                                                                     const std::vector<int64_t>& ref_steps,
                                                                     const std::vector<double>& ref) {
  std::map<int64_t, double> at;
  for (size_t i = 0; i < ref_steps.size(); ++i) at[ref_steps[i]] = ref[i];
  std::pair<std::vector<int64_t>, std::vector<double>> out;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto it = at.find(steps[i]);
    if (it == at.end()) continue;
    out.first.push_back(steps[i]);
    out.second.push_back(v[i] - it->second);
  }
  return out;
}

// {"l", "h", "x", "y"} per (layer, head) key, plus `extra` fields.
template <class Row, class Keep, class Value>
void add_series(json& out, const std::vector<Row>& rows, Keep keep, Value value, const json& extra) {
  for (const auto& [k, xy] : series_by_key(rows, keep, value)) {
    json s = extra;
    s["l"] = k.first;
    s["h"] = k.second;
    s["x"] = xy.x;
    s["y"] = nums(xy.y);
    out.push_back(std::move(s));
  }
}

// add_series once per distinct value of `field` in `rows` (series_by_key keys by (layer,
// head) only), each series tagged {name: value}.
template <class Row>
void add_series_by(json& out, const std::vector<Row>& rows, std::string Row::*field, double Row::*value,
                   const char* name) {
  std::set<std::string> values;
  for (const Row& r : rows) values.insert(r.*field);
  for (const auto& v : values)
    add_series(
        out, rows, [&](const Row& r) { return r.*field == v; }, [&](const Row& r) { return r.*value; },
        {{name, v}});
}

// A distance entry of the page's data (see report.js: distance[]) with no pairs and no series yet.
json distance_json(json run, json against, const char* source) {
  return {{"run", std::move(run)}, {"against", std::move(against)}, {"source", source}, {"notes", json::array()},
          {"pairs", json::array()}, {"series", json::array()}};
}
// One series of a distance entry: tensor, layer, head; its points added by add_distance_point.
json distance_series(const std::string& tensor, int layer, int head) {
  return {{"t", tensor}, {"l", layer}, {"h", head}, {"x", json::array()}, {"w1n", json::array()}, {"max", json::array()}};
}
// A point of such a series from a DistRow or an analysis DistanceRow.
template <class Row>
void add_distance_point(json& s, int64_t step, const Row& r) {
  s["x"].push_back(step);
  s["w1n"].push_back(num(r.w1_normalized));
  s["max"].push_back(num(r.max_abs_diff));
}

json file_state(const FileState& f) { return {{"present", f.present}, {"note", f.note}}; }

json run_json(const RunData& r, const RunData& ref, bool is_ref) {
  json j;
  j["name"] = r.name;
  j["dir"] = r.dir;
  j["shape"] = model_shape(r);
  json cfg = json::object();
  for (const char* k : {"precision.compute", "attention.backend", "attention.layer_backends", "attention.accum",
                        "attention.o_tilde_bits",
                        "run.seed", "train.max_steps", "train.batch_size", "train.seq_len", "train.lr",
                        "train.ckpt_every", "hooks.every", "hooks.reference_run", "device"})
    if (!r.cfg(k).empty()) cfg[k] = r.cfg(k);
  j["config"] = cfg;
  json notes = json::array();
  if (!r.config_note.empty()) notes.push_back(r.config_note);
  if (!r.metrics_note.empty()) notes.push_back(r.metrics_note);
  j["notes"] = notes;
  j["files"] = {{"spectral", file_state(r.spectral_state)},   {"attn", file_state(r.attn_state)},
                {"drift", file_state(r.drift_state)},         {"grad", file_state(r.grad_state)},
                {"events", file_state(r.events_state)},       {"wasserstein", file_state(r.wasserstein_state)}};
  j["checkpoints"] = r.checkpoints.size();

  const std::vector<size_t> idx = thin_indices(r.loss, kMaxPoints);
  bool any_scale = false;
  for (double v : r.loss_scale) any_scale |= std::isfinite(v);
  j["train"] = {{"step", steps_json(r.steps, idx)},
                {"loss", nums(r.loss, idx)},
                {"grad_norm", nums(r.grad_norm, idx)},
                {"lr", nums(r.lr, idx)}};
  if (any_scale) j["train"]["loss_scale"] = nums(r.loss_scale, idx);
  j["train"]["thinned"] = idx.size() < r.loss.size() ? r.loss.size() : 0;
  std::vector<size_t> vidx(r.val_steps.size());
  for (size_t i = 0; i < vidx.size(); ++i) vidx[i] = i;
  j["val"] = {{"step", steps_json(r.val_steps, vidx)}, {"loss", nums(r.val_loss, vidx)}};
  if (!is_ref) {
    const auto d = minus_reference(r.steps, r.loss, ref.steps, ref.loss);
    const std::vector<size_t> didx = thin_indices(d.second, kMaxPoints);
    j["dloss"] = {{"step", steps_json(d.first, didx)}, {"y", nums(d.second, didx)}};
    const auto dv = minus_reference(r.val_steps, r.val_loss, ref.val_steps, ref.val_loss);
    std::vector<size_t> all(dv.first.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    j["dval"] = {{"step", steps_json(dv.first, all)}, {"y", nums(dv.second, all)}};
  }
  json ev = json::array();
  for (const Event& e : r.events) {
    double at_loss = kNaN;
    const auto it = std::lower_bound(r.steps.begin(), r.steps.end(), e.step);
    if (it != r.steps.end() && *it == e.step) at_loss = r.loss[static_cast<size_t>(it - r.steps.begin())];
    ev.push_back({{"step", e.step}, {"event", e.event}, {"metric", e.metric}, {"value", num(e.value)},
                  {"loss", num(at_loss)}, {"action", e.action}, {"text", event_text(r, e)}});
  }
  j["events"] = ev;

  // One call per matrix (per stat, per field): series_by_key keys by (layer, head) only.
  json spec = json::array();
  add_series_by(spec, r.spectral, &SpectralRow::matrix, &SpectralRow::sigma, "m");
  j["spectral"] = spec;

  json attn = json::array();
  add_series_by(attn, r.attn, &AttnRow::stat, &AttnRow::value, "s");
  j["attn"] = attn;

  json drift = json::array();
  const auto all_rows = [](const DriftRow&) { return true; };
  add_series(drift, r.drift, all_rows, [](const DriftRow& d) { return d.cum; }, {{"f", "delta_drift_cum"}});
  add_series(drift, r.drift, all_rows, [](const DriftRow& d) { return d.drift; }, {{"f", "delta_drift"}});
  add_series(drift, r.drift, all_rows, [](const DriftRow& d) { return d.dwq_rel_err; }, {{"f", "dwq_rel_err"}});
  add_series(drift, r.drift, all_rows, [](const DriftRow& d) { return d.cos_prev; }, {{"f", "dwq_cos_prev"}});
  j["drift"] = drift;

  // Gradient norm per layer: the L2 norm over the layer's tensors (per-head slices are rows
  // and columns of qkvw / attprojw, so they are left out of the sum); layer -1: wte, wpe and
  // the final layernorm.
  std::map<int, std::map<int64_t, double>> g2;
  for (const GradRow& g : r.grad)
    if (g.head < 0) g2[g.layer][g.step] += g.norm * g.norm;
  json grad = json::array();
  for (const auto& [l, pts] : g2) {
    json s = {{"l", l}, {"x", json::array()}, {"y", json::array()}};
    for (const auto& [step, v] : pts) {
      s["x"].push_back(step);
      s["y"].push_back(num(std::sqrt(v)));
    }
    grad.push_back(std::move(s));
  }
  j["grad"] = grad;
  return j;
}

std::string canonical(const std::string& dir) {
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(dir, ec);
  return ec ? dir : p.string();
}

// Weight distances of run `b` against the reference `a` from their checkpoints.
json checkpoint_distances(const RunData& a, const RunData& b, size_t bi, size_t ai, const HtmlOptions& opt,
                          std::FILE* log) {
  json d = distance_json(bi, ai, "checkpoints");
  const std::vector<CheckpointPair> pairs = checkpoint_pairs(a.checkpoints, b.checkpoints, opt.max_checkpoint_pairs);
  if (pairs.empty()) {
    d["notes"].push_back("no checkpoints to compare: " + a.name + " has " + std::to_string(a.checkpoints.size()) +
                         ", " + b.name + " has " + std::to_string(b.checkpoints.size()));
    return d;
  }
  size_t exact = 0;
  int64_t gap = 0;
  for (const auto& p : pairs) {
    exact += p.step_a == p.step_b;
    gap = std::max<int64_t>(gap, p.step_a > p.step_b ? p.step_a - p.step_b : p.step_b - p.step_a);
  }
  std::ostringstream how;
  how << pairs.size() << " checkpoint pair" << (pairs.size() == 1 ? "" : "s") << " at " << a.name << "'s steps "
      << pairs.front().step_a << " … " << pairs.back().step_a << ": ";
  if (exact == pairs.size()) how << "the same step in both runs";
  else
    how << exact << " at the same step, " << pairs.size() - exact << " against " << b.name
        << "'s nearest checkpoint (largest gap " << gap << " steps; such a distance also holds the weights' "
        << "own change over the gap)";
  d["pairing"] = how.str();
  std::map<std::tuple<std::string, int, int>, json> by_key;
  std::vector<std::tuple<std::string, int, int>> order;
  for (const auto& p : pairs) {
    try {
      if (log)
        std::fprintf(log, "report: weights of %s step %lld vs %s step %lld\n", b.name.c_str(),
                     static_cast<long long>(p.step_b), a.name.c_str(), static_cast<long long>(p.step_a));
      const CheckpointWeights wa = load_checkpoint_weights(a.checkpoints.at(p.step_a));
      const CheckpointWeights wb = load_checkpoint_weights(b.checkpoints.at(p.step_b));
      const GPT2Config& ca = wa.config;
      const GPT2Config& cb = wb.config;
      if (ca.n_layer != cb.n_layer || ca.n_head != cb.n_head || ca.n_embd != cb.n_embd ||
          ca.max_seq_len != cb.max_seq_len || ca.vocab_size != cb.vocab_size || ca.vp() != cb.vp()) {
        d["notes"].push_back("different model shapes (" + std::to_string(ca.n_layer) + "L " +
                             std::to_string(ca.n_embd) + "C vs " + std::to_string(cb.n_layer) + "L " +
                             std::to_string(cb.n_embd) + "C): weights not compared");
        break;
      }
      d["pairs"].push_back({{"a", p.step_a}, {"b", p.step_b}});
      for (const DistanceRow& r : weight_distances(ca, wa.master, wb.master)) {
        const auto key = std::make_tuple(r.tensor, r.layer, r.head);
        auto it = by_key.find(key);
        if (it == by_key.end()) {
          it = by_key.emplace(key, distance_series(r.tensor, r.layer, r.head)).first;
          order.push_back(key);
        }
        add_distance_point(it->second, p.step_a, r);
      }
    } catch (const std::exception& e) {
      d["notes"].push_back("step " + std::to_string(p.step_a) + ": " + e.what());
    }
  }
  for (const auto& k : order) d["series"].push_back(std::move(by_key[k]));
  return d;
}

json wasserstein_distances(const RunData& r, size_t ri) {
  json d = distance_json(ri, nullptr, "wasserstein.csv");
  d["pairing"] = "from the run's wasserstein.csv, against its hooks.reference_run " +
                 r.cfg("hooks.reference_run", "?") + " at the same steps";
  if (!r.wasserstein_state.note.empty()) d["notes"].push_back(r.wasserstein_state.note);
  std::map<std::tuple<std::string, int, int>, std::map<int64_t, const DistRow*>> m;
  for (const DistRow& x : r.wasserstein) m[{x.tensor, x.layer, x.head}][x.step] = &x;
  for (const auto& [k, pts] : m) {
    json s = distance_series(std::get<0>(k), std::get<1>(k), std::get<2>(k));
    for (const auto& [step, row] : pts) add_distance_point(s, step, *row);
    d["series"].push_back(std::move(s));
  }
  return d;
}

// Distinct display names: a repeated run.name gets its directory added.
std::vector<RunData> distinct_names(std::vector<RunData> runs) {
  std::map<std::string, int> count;
  for (const auto& r : runs) ++count[r.name];
  for (auto& r : runs)
    if (count[r.name] > 1) r.name += " (" + r.dir + ")";
  return runs;
}

// Text for a <script> element: "</" would end it early.
std::string script_safe(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') {
      o += "<\\/";
      ++i;
      continue;
    }
    o += s[i];
  }
  return o;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

}  // namespace

std::vector<CheckpointPair> checkpoint_pairs(const std::map<int64_t, std::string>& a,
                                             const std::map<int64_t, std::string>& b, size_t max_pairs) {
  std::vector<CheckpointPair> all;
  if (b.empty()) return all;
  for (const auto& [s, p] : a) all.push_back({s, nearest_step(b, s, -1)});
  if (max_pairs == 0 || all.size() <= max_pairs) return all;
  std::vector<CheckpointPair> use;
  for (size_t k = 0; k < max_pairs; ++k) {
    const CheckpointPair& p = all[max_pairs == 1 ? all.size() - 1 : k * (all.size() - 1) / (max_pairs - 1)];
    if (use.empty() || use.back().step_a != p.step_a) use.push_back(p);
  }
  return use;
}

json report_data(const std::vector<RunData>& in, const HtmlOptions& opt, std::FILE* log) {
  if (in.empty()) fail("report: no runs");
  if (opt.reference >= in.size()) fail("report: reference run index out of range");
  const std::vector<RunData> runs = distinct_names(in);
  const RunData& ref = runs[opt.reference];
  json j;
  j["version"] = 1;
  j["generated"] = opt.generated;
  j["refresh_s"] = opt.refresh_s;
  j["reference"] = opt.reference;
  j["runs"] = json::array();
  for (size_t i = 0; i < runs.size(); ++i) j["runs"].push_back(run_json(runs[i], ref, i == opt.reference));
  json dist = json::array();
  json dnotes = json::array();
  if (runs.size() < 2) dnotes.push_back("one run given: pass two or more runs to compare their weights");
  if (!opt.compare_checkpoints) dnotes.push_back("checkpoints not read (--no-checkpoints): wasserstein.csv only");
  const std::string ref_dir = canonical(ref.dir);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (i == opt.reference) continue;
    json d;
    if (opt.compare_checkpoints) d = checkpoint_distances(ref, runs[i], i, opt.reference, opt, log);
    // The run's own wasserstein.csv only where the checkpoints gave nothing: drawing both
    // would show the same distances twice.
    if ((!opt.compare_checkpoints || d["series"].empty()) && runs[i].wasserstein_state.present &&
        !runs[i].wasserstein.empty()) {
      json w = wasserstein_distances(runs[i], i);
      if (canonical(runs[i].cfg("hooks.reference_run")) == ref_dir) w["against"] = opt.reference;
      if (d.is_object())  // null under --no-checkpoints
        for (const auto& n : d.value("notes", json::array())) w["notes"].push_back(n);
      d = std::move(w);
    }
    if (!d.is_null()) dist.push_back(std::move(d));
  }
  j["distance"] = dist;
  j["distance_notes"] = dnotes;
  return j;
}

std::string html_report(const std::vector<RunData>& runs, const HtmlOptions& opt, std::FILE* log) {
  const json data = report_data(runs, opt, log);
  std::string names;
  for (const auto& r : data["runs"]) names += (names.empty() ? "" : ", ") + r["name"].get<std::string>();
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
       "<meta name=\"generator\" content=\"stabletrain report\">"
       "<title>Stability report: "
    << esc(names) << "</title>\n<style>" << assets::uplot_css << "</style>\n<style>" << assets::report_css
    << "</style></head>\n<body>\n<main id=\"app\"><h1>Training stability report</h1>"
       "<noscript><p class=\"note\">This page draws its charts with JavaScript; enable it to see them. The data "
       "are in the script element <code>report-data</code> (JSON).</p></noscript></main>\n"
       "<script id=\"report-data\" type=\"application/json\">"
    << script_safe(data.dump(-1, ' ', false, json::error_handler_t::replace)) << "</script>\n<script>"
    << assets::uplot_js << "</script>\n<script>" << assets::report_kit_js << "</script>\n<script>"
    << assets::report_js << "</script>\n</body></html>\n";
  return o.str();
}

}  // namespace st::report
