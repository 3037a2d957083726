// `report`'s HTML page (see html_report.h). Each section is built from the runs' files by
// one function; a run without the section's file gets one line saying so.
#include "tools/report/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "analysis/weight_distance.h"
#include "core/error.h"
#include "tools/report/svg_chart.h"

namespace st::report {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kContent = 1144;  // content width in px
constexpr int kGap = 16;
constexpr const char* kGrey = "#b4bac5";

const char* const kCss = R"CSS(
*{box-sizing:border-box}
html{background:#eef0f4}
body{margin:0;color:#1f2430;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue","Noto Sans","Liberation Sans","DejaVu Sans",Arial,sans-serif;-webkit-font-smoothing:antialiased}
main{max-width:1200px;margin:24px auto;padding:32px 28px 56px;background:#fff;border-radius:10px;box-shadow:0 1px 3px rgba(20,30,50,.08)}
h1{font-size:26px;line-height:1.2;margin:0 0 4px;font-weight:650;letter-spacing:-.01em}
h2{font-size:19px;margin:40px 0 6px;padding-top:22px;border-top:1px solid #e3e6ec;font-weight:650}
h2 .num{display:inline-block;min-width:26px;height:26px;margin-right:10px;border-radius:13px;background:#1f2430;color:#fff;font-size:14px;line-height:26px;text-align:center;vertical-align:2px}
h3{font-size:15px;margin:22px 0 6px;font-weight:600}
h4{font-size:13px;margin:14px 0 4px;font-weight:600;color:#3d4452}
p{margin:4px 0 10px}
.sub{color:#5b6271;margin:0 0 18px}
.caption{color:#4a5160;font-size:13.5px;max-width:96ch}
.note{color:#6b7280;font-size:13px;margin:4px 0}
.note::before{content:"\2014\00a0"}
code{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px;background:#f2f4f7;padding:1px 4px;border-radius:4px}
nav{margin:14px 0 0;font-size:13.5px}
nav a{color:#1f5fa8;text-decoration:none;margin-right:16px}
nav a:hover{text-decoration:underline}
table{border-collapse:collapse;font-size:13px}
table.runs{width:100%;margin:8px 0 4px}
table th{text-align:left;font-weight:600;color:#5b6271;border-bottom:1px solid #d9dde5;padding:5px 10px 5px 0;white-space:nowrap}
table td{border-bottom:1px solid #eef0f4;padding:5px 10px 5px 0;vertical-align:top}
table td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table td.path{color:#6b7280;font-size:12px;word-break:break-all;max-width:280px}
.badge{display:inline-block;font-size:11px;padding:0 6px;margin:1px 3px 1px 0;border-radius:8px;background:#e8f3ec;color:#23683f}
.badge.off{background:#f2f3f5;color:#9aa1ad;text-decoration:line-through}
.swatch{display:inline-block;width:11px;height:11px;border-radius:3px;margin-right:7px;vertical-align:-1px}
.runname{font-weight:600}
.grid{display:flex;flex-wrap:wrap;gap:10px 16px;align-items:flex-start;margin:6px 0 8px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12px;color:#3d4452;margin:6px 0 2px}
.legend .key{white-space:nowrap}
.legend .sw{display:inline-block;width:16px;height:3px;border-radius:2px;margin-right:6px;vertical-align:3px}
.legend .dot{display:inline-block;width:9px;height:9px;border-radius:5px;margin-right:6px;vertical-align:0}
svg.chart{display:block;max-width:100%;height:auto;overflow:visible}
svg text{font-family:inherit;font-size:11px;fill:#5b6271}
svg text.t{font-size:13px;font-weight:600;fill:#1f2430}
svg .st{font-size:11px;font-weight:400;fill:#7a8190}
svg text.al{font-size:11.5px;fill:#3d4452}
svg text.el{font-size:11px;font-weight:600}
svg text.rl{font-size:10px;fill:#8a909c}
svg text.cv{font-size:9.5px}
svg .cbl text,svg .hl text{font-size:10.5px}
svg text.empty{fill:#9aa1ad;font-style:italic}
footer{margin-top:44px;color:#9aa1ad;font-size:12px}
)CSS";

// ---------------------------------------------------------------- small helpers

struct Range {
  double lo = kInf, hi = -kInf;
  void add(double v, bool positive_only = false) {
    if (!std::isfinite(v) || (positive_only && v <= 0)) return;
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  void add(const std::vector<double>& v, bool positive_only = false) {
    for (double x : v) add(x, positive_only);
  }
  bool ok() const { return lo <= hi; }
};

std::string swatch(const std::string& color) {
  return "<span class=\"swatch\" style=\"background:" + color + "\"></span>";
}

std::string run_tag(const RunData& r, size_t i) {
  return swatch(run_color(i)) + "<span class=\"runname\">" + esc(r.name) + "</span>";
}

std::string note(const std::string& text) { return "<p class=\"note\">" + esc(text) + "</p>\n"; }

std::string run_note(const RunData& r, size_t i, const std::string& text) {
  return "<p class=\"note\">" + run_tag(r, i) + ": " + esc(text) + "</p>\n";
}

std::string fig_grid(const std::vector<std::string>& svgs) {
  std::string o = "<div class=\"grid\">";
  for (const auto& s : svgs) o += s;
  return o + "</div>\n";
}

std::string sec_open(const std::string& id, int num, const std::string& title) {
  return "<section id=\"" + id + "\"><h2><span class=\"num\">" + std::to_string(num) + "</span>" + esc(title) +
         "</h2>\n";
}

// Centred moving average over w points (odd), NaN-aware; the ends use shorter windows.
std::vector<double> moving_average(const std::vector<double>& y, int w) {
  if (w <= 1) return y;
  const int h = w / 2, n = static_cast<int>(y.size());
  std::vector<double> out(y.size(), kNaN);
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(y[i])) continue;
    double s = 0;
    int c = 0;
    const int k = std::min({h, i, n - 1 - i});  // symmetric window: no lag at the ends
    for (int j = i - k; j <= i + k; ++j)
      if (std::isfinite(y[j])) s += y[j], ++c;
    out[i] = s / c;
  }
  return out;
}

std::vector<double> to_double(const std::vector<int64_t>& v) {
  return std::vector<double>(v.begin(), v.end());
}

enum class Agg { kMax, kMin, kMean };
const char* agg_name(Agg a) { return a == Agg::kMax ? "max" : a == Agg::kMin ? "min" : "mean"; }

// Per layer: the values of all heads of a step combined with `agg` (NaN ignored).
std::map<int, XY> per_layer(const SeriesByKey& m, Agg agg) {
  std::map<int, std::map<double, std::vector<double>>> acc;
  for (const auto& [k, xy] : m)
    for (size_t i = 0; i < xy.x.size(); ++i)
      if (std::isfinite(xy.y[i])) acc[k.first][xy.x[i]].push_back(xy.y[i]);
      else acc[k.first][xy.x[i]];  // keep the step (a gap)
  std::map<int, XY> out;
  for (const auto& [l, steps] : acc) {
    XY& xy = out[l];
    for (const auto& [s, v] : steps) {
      double r = kNaN;
      if (!v.empty()) {
        if (agg == Agg::kMax) r = *std::max_element(v.begin(), v.end());
        else if (agg == Agg::kMin) r = *std::min_element(v.begin(), v.end());
        else {
          r = 0;
          for (double x : v) r += x;
          r /= static_cast<double>(v.size());
        }
      }
      xy.x.push_back(s);
      xy.y.push_back(r);
    }
  }
  return out;
}

double last_finite(const std::vector<double>& v) {
  for (size_t i = v.size(); i-- > 0;)
    if (std::isfinite(v[i])) return v[i];
  return kNaN;
}
double first_finite(const std::vector<double>& v) {
  for (double x : v)
    if (std::isfinite(x)) return x;
  return kNaN;
}

std::string layer_name(int l) { return l >= 0 ? "L" + std::to_string(l) : "embeddings"; }

std::vector<std::pair<std::string, std::string>> layer_legend(const std::vector<int>& layers, int n_layers) {
  std::vector<std::pair<std::string, std::string>> v;
  for (int l : layers) v.push_back({layer_name(l), l >= 0 ? layer_color(l, n_layers) : "#4D4D4D"});
  return v;
}

// Panel widths so that `per_row` panels fill the content width.
int panel_width(int per_row) { return (kContent - kGap * (per_row - 1)) / per_row; }

// ---------------------------------------------------------------- header

std::string model_shape(const RunData& r) {
  const std::string L = r.cfg("model.n_layer"), H = r.cfg("model.n_head"), C = r.cfg("model.n_embd");
  if (L.empty()) return "–";
  std::string s = L + "L · " + H + "H · " + C + "C";
  const std::string T = r.cfg("train.seq_len", r.cfg("model.max_seq_len"));
  if (!T.empty()) s += " · T " + T;
  if (!r.cfg("model.vocab_size").empty()) s += " · V " + r.cfg("model.vocab_size");
  return s;
}

std::string header(const std::vector<RunData>& runs, const HtmlOptions& opt) {
  std::ostringstream o;
  o << "<header><h1>Training stability report</h1><p class=\"sub\">" << runs.size() << " run"
    << (runs.size() == 1 ? "" : "s");
  if (!opt.generated.empty()) o << " · " << esc(opt.generated);
  o << " · stabletrain <code>report</code></p>\n";
  o << "<table class=\"runs\"><thead><tr><th>run</th><th>precision</th><th>attention</th><th>seed</th>"
       "<th>model</th><th>steps</th><th>loss</th><th>val loss</th><th>hooks</th><th>files</th></tr></thead><tbody>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    std::string attn = r.cfg("attention.backend", "–");
    if (!r.cfg("attention.layer_backends").empty()) attn += " (" + r.cfg("attention.layer_backends") + ")";
    if (!r.cfg("attention.accum").empty() && r.cfg("attention.accum") != "auto") attn += ", accum " + r.cfg("attention.accum");
    std::string steps = "–";
    if (!r.steps.empty()) {
      steps = std::to_string(r.steps.front()) + "–" + std::to_string(r.steps.back());
      const std::string ms = r.cfg("train.max_steps");
      if (!ms.empty() && ms != std::to_string(r.steps.back())) steps += " of " + ms;
    }
    const std::string every = r.cfg("hooks.every");
    const std::string hooks = every.empty() ? "–" : every == "0" ? "off" : "every " + every;
    auto badge = [](const std::string& name, bool on) {
      return std::string("<span class=\"badge") + (on ? "" : " off") + "\">" + name + "</span>";
    };
    o << "<tr><td>" << run_tag(r, i) << "<div class=\"path\" style=\"color:#8a909c;font-size:12px\">" << esc(r.dir)
      << "</div></td><td>" << esc(r.cfg("precision.compute", "–")) << "</td><td>" << esc(attn) << "</td><td class=\"n\">"
      << esc(r.cfg("run.seed", "–")) << "</td><td>" << esc(model_shape(r)) << "</td><td class=\"n\">" << esc(steps)
      << "</td><td class=\"n\">" << short_num(last_finite(r.loss), 4) << "</td><td class=\"n\">"
      << (r.val_loss.empty() ? "–" : short_num(last_finite(r.val_loss), 4)) << "</td><td>" << esc(hooks) << "</td><td>"
      << badge("spectral", r.spectral_state.present) << badge("attn", r.attn_state.present)
      << badge("drift", r.drift_state.present) << badge("events", r.events_state.present)
      << badge("wasserstein", r.wasserstein_state.present)
      << badge(std::to_string(r.checkpoints.size()) + " ckpt", !r.checkpoints.empty()) << "</td></tr>\n";
  }
  o << "</tbody></table>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i].config_note.empty()) o << run_note(runs[i], i, runs[i].config_note);
    if (!runs[i].metrics_note.empty()) o << run_note(runs[i], i, runs[i].metrics_note);
  }
  o << "<nav><a href=\"#loss\">1 Loss</a><a href=\"#spectral\">2 Spectral norms</a><a href=\"#attention\">3 "
       "Attention statistics</a><a href=\"#drift\">4 δ drift</a><a href=\"#distance\">5 Weight distance</a></nav>"
       "</header>\n";
  return o.str();
}

// ---------------------------------------------------------------- 1. loss

std::string event_title(const RunData& r, const Event& e) {
  std::ostringstream t;
  t << r.name << ": " << (e.event.empty() ? "event" : e.event);
  if (!e.metric.empty()) t << " in " << e.metric;
  t << " at step " << e.step;
  if (std::isfinite(e.value)) t << ": " << short_num(e.value, 4);
  if (std::isfinite(e.mean)) t << " (mean " << short_num(e.mean, 4);
  if (std::isfinite(e.std)) t << " ± " << short_num(e.std, 3);
  if (std::isfinite(e.mean)) t << ")";
  if (std::isfinite(e.z)) t << ", z " << short_num(e.z, 3);
  if (!e.action.empty()) t << ", action: " << e.action;
  return t.str();
}

std::string loss_section(const std::vector<RunData>& runs) {
  std::ostringstream o;
  o << sec_open("loss", 1, "Loss");
  // Smoothing window per run: about 1/60 of its steps, odd.
  std::vector<int> win;
  std::string wtext;
  for (const auto& r : runs) {
    int w = static_cast<int>(r.steps.size() / 60);
    if (w % 2 == 0) ++w;
    win.push_back(std::clamp(w, 1, 501));
    if (win.back() > 1) wtext += (wtext.empty() ? "" : ", ") + std::to_string(win.back()) + " for " + esc(r.name);
  }
  o << "<p class=\"caption\">Training loss per step of every run (" << runs.size() << " overlaid). "
    << (!wtext.empty() ? "Solid: centred moving average over about 1/60 of a run's steps (" + wtext +
                             "); faint: the raw per-step loss. "
                       : "One point per step (too few steps to smooth). ")
    << "Dots: validation loss. Triangles: loss / gradient-norm spikes from <code>events.jsonl</code> (hover for "
       "details). Right: the global gradient norm before clipping (log scale) and the "
    << "learning rate (or the loss scale of fp16 runs).</p>\n";

  LineChart loss;
  loss.title = "Loss";
  loss.subtitle = "nats per token";
  loss.width = kContent;
  loss.height = 380;
  loss.x.label = "step";
  loss.y.label = "loss";
  LineChart gn, side;
  gn.title = "Gradient norm";
  gn.subtitle = "before clipping";
  gn.width = side.width = panel_width(2);
  gn.height = side.height = 250;
  gn.x.label = side.x.label = "step";
  gn.y.log = true;
  gn.legend = side.legend = false;
  bool any_scale = false;
  for (const auto& r : runs)
    for (double v : r.loss_scale) any_scale |= std::isfinite(v);
  side.title = any_scale ? "Loss scale" : "Learning rate";
  side.subtitle = any_scale ? "fp16 dynamic loss scaling" : "";
  side.y.log = any_scale;

  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    const std::string c = run_color(i);
    const int w = win[i];
    std::vector<double> x = to_double(r.steps);
    auto add = [&](LineChart& ch, const std::vector<double>& y, const std::string& name, bool raw_too) {
      if (raw_too && w > 1) {
        Series raw = line_series(name + " (raw)", x, y, c, 1.0, 0.22);
        raw.in_legend = false;
        decimate(raw.x, raw.y, 3000);
        ch.series.push_back(std::move(raw));
      }
      Series s = line_series(name, x, raw_too ? moving_average(y, w) : y, c, 2.0, 1.0);
      decimate(s.x, s.y, 3000);
      ch.series.push_back(std::move(s));
    };
    add(loss, r.loss, r.name, true);
    add(gn, r.grad_norm, r.name, true);
    add(side, any_scale ? r.loss_scale : r.lr, r.name, false);
    if (!r.val_steps.empty()) {
      Series v = line_series(r.name + " · val", to_double(r.val_steps), r.val_loss, c);
      v.markers = true;
      v.marker_r = 3.6;
      for (size_t k = 0; k < r.val_steps.size(); ++k)
        v.point_titles.push_back(r.name + ": val_loss " + short_num(r.val_loss[k], 5) + " at step " +
                                 std::to_string(r.val_steps[k]));
      loss.series.push_back(std::move(v));
    }
    std::map<int64_t, std::pair<double, double>> at;  // step -> loss, grad norm
    for (size_t k = 0; k < r.steps.size(); ++k) at[r.steps[k]] = {r.loss[k], r.grad_norm[k]};
    for (const Event& e : r.events) {
      const auto it = at.find(e.step);
      EventMark m;
      m.x = static_cast<double>(e.step);
      m.color = c;
      m.title = event_title(r, e);
      m.y = it != at.end() ? it->second.first : (e.metric == "loss" ? e.value : kNaN);
      loss.events.push_back(m);
      if (e.metric == "grad_norm" || it != at.end()) {
        EventMark g = m;
        g.y = it != at.end() ? it->second.second : e.value;
        gn.events.push_back(g);
      }
    }
  }
  o << fig_grid({loss.render()}) << fig_grid({gn.render(), side.render()});
  // Events list and notes.
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    if (!r.events_state.present) {
      o << run_note(r, i, r.events_state.note);
      continue;
    }
    if (!r.events_state.note.empty()) o << run_note(r, i, r.events_state.note);
    if (r.events.empty()) {
      o << run_note(r, i, "events.jsonl holds no events");
      continue;
    }
    o << "<h4>" << run_tag(r, i) << ": " << r.events.size() << " event" << (r.events.size() == 1 ? "" : "s")
      << " (events.jsonl)</h4><table><thead><tr><th>step</th><th>event</th><th>metric</th><th>value</th><th>mean</th>"
         "<th>std</th><th>z</th><th>action</th></tr></thead><tbody>";
    const size_t shown = std::min<size_t>(r.events.size(), 25);
    for (size_t k = 0; k < shown; ++k) {
      const Event& e = r.events[k];
      o << "<tr><td class=\"n\">" << e.step << "</td><td>" << esc(e.event) << "</td><td>" << esc(e.metric)
        << "</td><td class=\"n\">" << short_num(e.value, 4) << "</td><td class=\"n\">" << short_num(e.mean, 4)
        << "</td><td class=\"n\">" << short_num(e.std, 3) << "</td><td class=\"n\">" << short_num(e.z, 3)
        << "</td><td>" << esc(e.action) << "</td></tr>";
    }
    o << "</tbody></table>";
    if (shown < r.events.size()) o << note("first " + std::to_string(shown) + " of " + std::to_string(r.events.size()));
  }
  o << "</section>\n";
  return o.str();
}

// ---------------------------------------------------------------- 2. spectral norms

// Small multiples: one panel per layer, a line per head; the three heads with the largest
// final value (|value| when by_abs) coloured and labelled, the others grey (hover text
// `what` L.. H..). `y` is shared by the panels.
std::vector<std::string> head_panels(const SeriesByKey& m, const Axis& y, const std::string& what,
                                     const std::vector<RefLine>& refs, bool by_abs) {
  std::vector<std::string> out;
  std::set<int> layers;
  for (const auto& [k, xy] : m)
    if (k.second >= 0) layers.insert(k.first);
  const int per_row = 4;
  for (int l : layers) {
    std::vector<std::pair<double, int>> order;  // (final value, head)
    for (const auto& [k, xy] : m)
      if (k.first == l && k.second >= 0) {
        const double f = last_finite(xy.y);
        order.push_back({std::isfinite(f) ? (by_abs ? std::fabs(f) : f) : -kInf, k.second});
      }
    std::sort(order.begin(), order.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    const size_t k = std::min<size_t>(3, order.size());
    LineChart ch;
    ch.title = "layer " + std::to_string(l);
    if (k) ch.subtitle = "top: H" + std::to_string(order[0].second);
    ch.width = panel_width(per_row);
    ch.height = 212;
    ch.x.label = "step";
    ch.y = y;
    ch.legend = false;
    ch.ref_lines = refs;
    // Grey heads first, highlighted ones on top (largest last).
    for (size_t i = order.size(); i-- > k;) {
      const XY& xy = m.at({l, order[i].second});
      Series s = line_series(what + " L" + std::to_string(l) + " H" + std::to_string(order[i].second), xy.x, xy.y, kGrey, 1.1, 0.85);
      decimate(s.x, s.y, 1500);
      ch.series.push_back(std::move(s));
    }
    for (size_t i = k; i-- > 0;) {
      const XY& xy = m.at({l, order[i].second});
      Series s = line_series("H" + std::to_string(order[i].second), xy.x, xy.y, highlight_color(i), 1.9);
      s.end_label = true;
      decimate(s.x, s.y, 1500);
      ch.series.push_back(std::move(s));
    }
    out.push_back(ch.render());
  }
  return out;
}

// Layers x heads heatmap of a per-head series' final value or growth (last / first).
Heatmap head_heatmap(const SeriesByKey& m, int n_layers, int n_heads, bool growth) {
  Heatmap h;
  int L = n_layers, H = n_heads;
  for (const auto& [k, xy] : m) L = std::max(L, k.first + 1), H = std::max(H, k.second + 1);
  h.values.assign(L, std::vector<double>(H, kNaN));
  h.titles.assign(L, std::vector<std::string>(H));
  for (int l = 0; l < L; ++l) h.row_labels.push_back("L" + std::to_string(l));
  for (int c = 0; c < H; ++c) h.col_labels.push_back("H" + std::to_string(c));
  for (const auto& [k, xy] : m) {
    if (k.first < 0 || k.second < 0) continue;
    const double f = first_finite(xy.y), la = last_finite(xy.y);
    const double v = growth ? (f != 0 ? la / f : kNaN) : la;
    h.values[k.first][k.second] = v;
    h.titles[k.first][k.second] = "L" + std::to_string(k.first) + " H" + std::to_string(k.second) + ": σ " +
                                  short_num(f, 4) + " → " + short_num(la, 4) + " (×" + short_num(f != 0 ? la / f : kNaN, 3) +
                                  ")";
  }
  if (growth) h.scale = Heatmap::Scale::kLogDivergingAtOne;
  return h;
}

const std::map<std::string, std::string>& matrix_names() {
  static const std::map<std::string, std::string> m = {
      {"wq", "W_Q"}, {"wk", "W_K"}, {"wv", "W_V"}, {"wo", "W_O"}, {"qkvw", "qkvw (fused W_QKV)"},
      {"attprojw", "attprojw (attention out)"}, {"fcw", "fcw (MLP in)"}, {"fcprojw", "fcprojw (MLP out)"},
      {"wte", "wte"}, {"wpe", "wpe"}};
  return m;
}

std::string spectral_section(const std::vector<RunData>& runs) {
  std::ostringstream o;
  o << sec_open("spectral", 2, "Spectral norms");
  o << "<p class=\"caption\">Largest singular value σ of the weight matrices at each hook step "
       "(<code>spectral.csv</code>, power iteration). Per run: W<sub>Q</sub> per head in small multiples (one panel "
       "per layer, a line per head; the three heads with the largest final σ of each layer coloured and labelled, "
       "the others grey; the y axis is shared by all layers and runs), layers × heads heatmaps of the final σ and of "
       "its growth σ<sub>last</sub>/σ<sub>first</sub> for W<sub>Q</sub>, W<sub>K</sub>, W<sub>V</sub> and "
       "W<sub>O</sub> (growth: white = unchanged, red = grew, blue = shrank), and the whole per-layer matrices.</p>\n";
  // Shared y range for the W_Q panels over all runs.
  Range wq;
  for (const auto& r : runs)
    for (const auto& s : r.spectral)
      if (s.matrix == "wq" && s.head >= 0) wq.add(s.sigma);
  Axis y;
  y.label = "σ";
  if (wq.ok()) {
    const double pad = 0.04 * (wq.hi - wq.lo);
    y.fix(std::max(0.0, wq.lo - pad), wq.hi + pad);
    if (wq.hi == wq.lo) y.fix(wq.lo * 0.9, wq.hi * 1.1 + 1e-12);
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    o << "<h3>" << run_tag(r, i) << "</h3>\n";
    if (!r.spectral_state.present) {
      o << note(r.spectral_state.note);
      continue;
    }
    if (!r.spectral_state.note.empty()) o << note(r.spectral_state.note);
    const int L = r.n_layer(), H = r.n_head();
    int64_t last_step = 0;
    for (const auto& s : r.spectral) last_step = std::max(last_step, s.step);
    const SeriesByKey q = spectral_series(r, "wq");
    bool has_heads = false;
    for (const auto& [k, xy] : q) has_heads |= k.second >= 0;
    if (has_heads) {
      o << "<h4>W<sub>Q</sub> per head</h4>" << fig_grid(head_panels(q, y, "σ(W_Q)", {}, false));
    } else {
      o << note("spectral.csv has no per-head wq rows");
    }
    // Heatmaps.
    std::vector<std::string> finals, growths;
    for (const char* mname : {"wq", "wk", "wv", "wo"}) {
      const SeriesByKey m = spectral_series(r, mname);
      bool any = false;
      for (const auto& [k, xy] : m) any |= k.second >= 0;
      if (!any) continue;
      Heatmap f = head_heatmap(m, L, H, false);
      f.title = matrix_names().at(mname) + " final σ";
      f.subtitle = "step " + std::to_string(last_step);
      f.max_width = panel_width(4);
      f.value_label = "final σ";
      finals.push_back(f.render());
      Heatmap g = head_heatmap(m, L, H, true);
      g.title = matrix_names().at(mname) + " growth";
      g.subtitle = "σ last / σ first";
      g.max_width = panel_width(4);
      g.value_label = "σ last / σ first";
      growths.push_back(g.render());
    }
    if (!finals.empty()) o << "<h4>Per head: final σ and growth (layers × heads)</h4>" << fig_grid(finals) << fig_grid(growths);
    // Per-layer matrices.
    std::vector<std::string> panels;
    std::set<int> layer_set;
    for (const char* mname : {"qkvw", "attprojw", "fcw", "fcprojw"}) {
      const SeriesByKey m = spectral_series(r, mname);
      LineChart ch;
      ch.title = matrix_names().at(mname);
      ch.width = panel_width(5);
      ch.height = 210;
      ch.legend = false;
      ch.x.label = "step";
      for (const auto& [k, xy] : m) {
        if (k.second >= 0 || k.first < 0) continue;
        layer_set.insert(k.first);
        Series s = line_series("L" + std::to_string(k.first), xy.x, xy.y, layer_color(k.first, L), 1.6);
        decimate(s.x, s.y, 1500);
        ch.series.push_back(std::move(s));
      }
      if (!ch.series.empty()) panels.push_back(ch.render());
    }
    {
      LineChart ch;
      ch.title = "embeddings";
      ch.width = panel_width(5);
      ch.height = 210;
      ch.legend = false;
      ch.x.label = "step";
      for (const char* mname : {"wte", "wpe"}) {
        const SeriesByKey m = spectral_series(r, mname);
        const auto it = m.find({-1, -1});
        if (it == m.end()) continue;
        Series s = line_series(mname, it->second.x, it->second.y, std::string(mname) == "wte" ? "#4D4D4D" : "#9a6324", 1.6);
        s.end_label = true;
        decimate(s.x, s.y, 1500);
        ch.series.push_back(std::move(s));
      }
      if (!ch.series.empty()) panels.push_back(ch.render());
    }
    if (!panels.empty()) {
      o << "<h4>Per-layer matrices</h4>"
        << html_legend(layer_legend(std::vector<int>(layer_set.begin(), layer_set.end()), L)) << fig_grid(panels);
    }
  }
  o << "</section>\n";
  return o.str();
}

// ---------------------------------------------------------------- 3. attention statistics

std::string attention_section(const std::vector<RunData>& runs) {
  std::ostringstream o;
  o << sec_open("attention", 3, "Attention statistics");
  struct StatInfo {
    const char* key;
    const char* title;
    const char* unit;
    Agg agg;
  };
  const StatInfo stats[] = {{"max_logit", "max logit", "largest scaled score", Agg::kMax},
                            {"tied_row_frac", "tied rows", "fraction of rows", Agg::kMax},
                            {"tied_in_tile_frac", "tied in a tile", "fraction of rows", Agg::kMax},
                            {"p_one", "P = 1 entries (normalised P, all backends)", "entries", Agg::kMax},
                            {"p_tilde_one", "P~ = 1 entries (unnormalised exp numerators)", "entries",
                             Agg::kMax},
                            {"entropy", "entropy", "nats per row", Agg::kMin}};
  o << "<p class=\"caption\">Attention statistics over the hook steps (<code>attn_stats.csv</code>, the hook step's "
       "last micro-batch), a line per layer. Each line is the most extreme head of its layer: the <b>maximum over "
       "heads</b> for the max logit, the tied-row fractions (maximum tied within <code>attention.tie_tol</code>; "
       "two tied maxima in one key tile) and the two counts of entries equal to 1, and the <b>minimum over "
       "heads</b> for the entropy (a collapsing head). <b>P = 1</b> counts the normalised P, the same definition "
       "for every backend (flash: P as its backward recomputes it from lse), so backends compare on one axis; "
       "<b>P~ = 1</b> counts the unnormalised exponentials exp(S − m): flash per key tile against the running "
       "max (at least one per tile that raises it), baseline against the row max (one tile per row), so it "
       "grows with the number of key tiles. The y axes are shared across runs.</p>\n";
  // Shared y ranges per stat.
  std::map<std::string, Range> ranges;
  for (const auto& r : runs)
    for (const auto& a : r.attn) ranges[a.stat].add(a.value);
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    o << "<h3>" << run_tag(r, i) << "</h3>\n";
    if (!r.attn_state.present) {
      o << note(r.attn_state.note);
      continue;
    }
    if (!r.attn_state.note.empty()) o << note(r.attn_state.note);
    const int L = r.n_layer();
    std::vector<std::string> panels;
    std::set<int> layer_set;
    for (const StatInfo& st : stats) {
      const SeriesByKey m = series_by_key(
          r.attn, [&](const AttnRow& a) { return a.stat == st.key; }, [](const AttnRow& a) { return a.value; });
      if (m.empty()) continue;
      const std::map<int, XY> pl = per_layer(m, st.agg);
      LineChart ch;
      ch.title = st.title;
      ch.subtitle = std::string(agg_name(st.agg)) + " over heads";
      ch.width = panel_width(3);  // six panels: two rows of three
      ch.height = 210;
      ch.legend = false;
      ch.x.label = "step";
      const Range& rg = ranges[st.key];
      if (rg.ok()) {
        const double pad = rg.hi > rg.lo ? 0.04 * (rg.hi - rg.lo) : std::max(1e-9, std::fabs(rg.hi) * 0.1);
        const bool frac = std::string(st.key).find("frac") != std::string::npos;
        double lo = rg.lo - pad, hi = rg.hi + pad;
        if (rg.lo >= 0) lo = std::max(lo, 0.0);
        if (frac) lo = std::max(lo, 0.0), hi = std::min(std::max(hi, lo + 0.01), 1.0);
        ch.y.fix(lo, hi);
      }
      for (const auto& [l, xy] : pl) {
        layer_set.insert(l);
        Series s = line_series(layer_name(l), xy.x, xy.y, l >= 0 ? layer_color(l, L) : "#4D4D4D", 1.6);
        decimate(s.x, s.y, 1500);
        ch.series.push_back(std::move(s));
      }
      panels.push_back(ch.render());
    }
    if (panels.empty()) {
      o << note("attn_stats.csv has none of the stats max_logit, tied_row_frac, tied_in_tile_frac, p_one, "
                "p_tilde_one, entropy");
      continue;
    }
    o << html_legend(layer_legend(std::vector<int>(layer_set.begin(), layer_set.end()), L)) << fig_grid(panels);
  }
  o << "</section>\n";
  return o.str();
}

// ---------------------------------------------------------------- 4. delta drift

std::string drift_section(const std::vector<RunData>& runs) {
  std::ostringstream o;
  o << sec_open("drift", 4, "δ drift (Qiu & Yao)");
  o << "<p class=\"caption\">The attention backward's row term δ of the run's own attention against an FP64 "
       "recompute of the same inputs (<code>delta_drift.csv</code>). Small multiples: the running sum "
       "<code>delta_drift_cum</code> = Σ over hook steps of Σ<sub>rows</sub>(δ<sub>run</sub> − δ<sub>fp64</sub>), one "
       "panel per layer, a line per head (the three heads with the largest final |sum| coloured). A biased rounding "
       "error — the Qiu &amp; Yao signature — is <b>one-signed and grows steadily</b>; unbiased noise wanders around "
       "zero. The heatmaps give, per head, the one-signedness |Σ drift| / Σ |drift| (1: every step erred the same "
       "way) and the final running sum. Below: the cosine between consecutive hook steps' W<sub>Q</sub>-gradient "
       "error directions (near 1: the error keeps pushing the same way) and its relative size, mean over heads.</p>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    o << "<h3>" << run_tag(r, i) << "</h3>\n";
    if (!r.drift_state.present) {
      o << note(r.drift_state.note);
      continue;
    }
    if (!r.drift_state.note.empty()) o << note(r.drift_state.note);
    const int L = r.n_layer(), H = r.n_head();
    const SeriesByKey cum =
        series_by_key(r.drift, [](const DriftRow&) { return true; }, [](const DriftRow& d) { return d.cum; });
    Range rg;
    for (const auto& d : r.drift) rg.add(d.cum);
    Axis y;
    y.label = "Σ drift";
    if (rg.ok()) {
      const double lo = std::min(rg.lo, 0.0), hi = std::max(rg.hi, 0.0);
      const double pad = hi > lo ? 0.05 * (hi - lo) : 1e-12;
      y.fix(lo - pad, hi + pad);
    }
    RefLine zero;
    zero.y = 0;
    zero.color = "#9aa1ad";
    o << "<h4>Running sum of the δ error per head</h4>"
      << fig_grid(head_panels(cum, y, "delta_drift_cum", {zero}, true));
    // Heatmaps: one-signedness and final sum.
    std::map<std::pair<int, int>, std::pair<double, double>> acc;  // signed sum, abs sum
    for (const auto& d : r.drift) {
      if (!std::isfinite(d.drift)) continue;
      auto& a = acc[{d.layer, d.head}];
      a.first += d.drift;
      a.second += std::fabs(d.drift);
    }
    Heatmap one;
    one.title = "one-signedness";
    one.subtitle = "|Σ drift| / Σ |drift|";
    one.fixed_range = true;
    one.range_lo = 0, one.range_hi = 1;
    one.max_width = panel_width(3);
    Heatmap fin = head_heatmap(cum, L, H, false);
    fin.title = "final running sum";
    fin.subtitle = "delta_drift_cum at the last hook step";
    fin.scale = Heatmap::Scale::kDivergingAtZero;
    fin.max_width = panel_width(3);
    for (size_t rr = 0; rr < fin.values.size(); ++rr)
      for (size_t c = 0; c < fin.values[rr].size(); ++c)
        fin.titles[rr][c] = "L" + std::to_string(rr) + " H" + std::to_string(c) + ": " + short_num(fin.values[rr][c], 4);
    one.row_labels = fin.row_labels;
    one.col_labels = fin.col_labels;
    one.values.assign(fin.values.size(), std::vector<double>(fin.col_labels.size(), kNaN));
    one.titles.assign(fin.values.size(), std::vector<std::string>(fin.col_labels.size()));
    for (const auto& [k, a] : acc) {
      if (k.first < 0 || k.second < 0 || k.first >= static_cast<int>(one.values.size()) ||
          k.second >= static_cast<int>(one.col_labels.size()))
        continue;
      const double v = a.second > 0 ? std::fabs(a.first) / a.second : kNaN;
      one.values[k.first][k.second] = v;
      one.titles[k.first][k.second] = "L" + std::to_string(k.first) + " H" + std::to_string(k.second) +
                                      ": |Σ drift| / Σ|drift| = " + short_num(v, 3) + " (Σ drift " +
                                      short_num(a.first, 3) + ")";
    }
    std::vector<std::string> maps;
    if (!acc.empty()) maps.push_back(one.render());
    maps.push_back(fin.render());
    // Cosine and relative error, mean over heads.
    const SeriesByKey cs =
        series_by_key(r.drift, [](const DriftRow&) { return true; }, [](const DriftRow& d) { return d.cos_prev; });
    const SeriesByKey re =
        series_by_key(r.drift, [](const DriftRow&) { return true; }, [](const DriftRow& d) { return d.dwq_rel_err; });
    std::set<int> layer_set;
    LineChart cc, rc;
    cc.title = "dW_Q error direction";
    cc.subtitle = "cos to previous hook step, mean over heads";
    rc.title = "dW_Q relative error";
    rc.subtitle = "‖ΔdW_Q‖ / ‖dW_Q‖, mean over heads";
    for (LineChart* ch : {&cc, &rc}) {
      ch->width = panel_width(3);
      ch->height = 230;
      ch->legend = false;
      ch->x.label = "step";
    }
    cc.y.fix(-1, 1);
    cc.ref_lines.push_back(zero);
    rc.y.log = true;
    for (const auto& [l, xy] : per_layer(cs, Agg::kMean)) {
      layer_set.insert(l);
      cc.series.push_back(line_series(layer_name(l), xy.x, xy.y, layer_color(l, L), 1.6));
    }
    for (const auto& [l, xy] : per_layer(re, Agg::kMean)) {
      layer_set.insert(l);
      rc.series.push_back(line_series(layer_name(l), xy.x, xy.y, layer_color(l, L), 1.6));
    }
    o << "<h4>Per head and per layer</h4>" << fig_grid(maps)
      << html_legend(layer_legend(std::vector<int>(layer_set.begin(), layer_set.end()), L))
      << fig_grid({cc.render(), rc.render()});
  }
  o << "</section>\n";
  return o.str();
}

// ---------------------------------------------------------------- 5. weight distance

// Per layer over steps: mean w1_normalized over the layer's 2-D weights (qkvw, attprojw,
// fcw, fcprojw; layer -1: wte, wpe) and max |dW| over all its tensors (biases and
// layernorms included; layer -1: wte, wpe, lnfw, lnfb).
struct LayerDistances {
  std::map<int, XY> w1n, maxabs;
  bool all_zero = true;
};
LayerDistances aggregate(const std::vector<DistRow>& rows) {
  static const std::set<std::string> mats = {"qkvw", "attprojw", "fcw", "fcprojw", "wte", "wpe"};
  std::map<int, std::map<int64_t, std::pair<double, int>>> w1;
  std::map<int, std::map<int64_t, double>> mx;
  LayerDistances d;
  for (const DistRow& r : rows) {
    if (r.head >= 0) continue;  // per-head slices are parts of qkvw / attprojw
    if (r.w1 != 0 || r.max_abs_diff != 0) d.all_zero = false;
    if (mats.count(r.tensor) && std::isfinite(r.w1_normalized)) {
      auto& a = w1[r.layer][r.step];
      a.first += r.w1_normalized, a.second += 1;
    }
    if (std::isfinite(r.max_abs_diff)) {
      auto it = mx[r.layer].find(r.step);
      if (it == mx[r.layer].end()) mx[r.layer][r.step] = r.max_abs_diff;
      else it->second = std::max(it->second, r.max_abs_diff);
    }
  }
  for (const auto& [l, steps] : w1)
    for (const auto& [s, a] : steps) {
      d.w1n[l].x.push_back(static_cast<double>(s));
      d.w1n[l].y.push_back(a.first / a.second);
    }
  for (const auto& [l, steps] : mx)
    for (const auto& [s, v] : steps) {
      d.maxabs[l].x.push_back(static_cast<double>(s));
      d.maxabs[l].y.push_back(v);
    }
  return d;
}

std::string distance_panels(const std::vector<DistRow>& rows, int n_layers, const std::string& against) {
  const LayerDistances d = aggregate(rows);
  std::ostringstream o;
  if (d.all_zero) {
    o << note("the weights are identical at every compared step (W1 = max |ΔW| = 0)");
    return o.str();
  }
  LineChart a, b;
  a.title = "W1 / mean |w|";
  a.subtitle = "mean over the layer's 2-D weights, vs " + against;
  b.title = "max |ΔW|";
  b.subtitle = "over all the layer's tensors, vs " + against;
  std::set<int> layer_set;
  for (LineChart* ch : {&a, &b}) {
    ch->width = panel_width(2);
    ch->height = 280;
    ch->legend = false;
    ch->x.label = "step";
    ch->y.log = true;
  }
  for (const auto& [l, xy] : d.w1n) {
    layer_set.insert(l);
    a.series.push_back(line_series(layer_name(l), xy.x, xy.y, l >= 0 ? layer_color(l, n_layers) : "#4D4D4D", 1.8));
  }
  for (const auto& [l, xy] : d.maxabs) {
    layer_set.insert(l);
    b.series.push_back(line_series(layer_name(l), xy.x, xy.y, l >= 0 ? layer_color(l, n_layers) : "#4D4D4D", 1.8));
  }
  for (LineChart* ch : {&a, &b})
    for (Series& s : ch->series) {
      if (s.name == "embeddings") s.dash = "5 3";
      s.dots = true;  // few points (checkpoint steps): show where they are
    }
  o << html_legend(layer_legend(std::vector<int>(layer_set.begin(), layer_set.end()), n_layers))
    << fig_grid({a.render(), b.render()});
  return o.str();
}

std::string distance_section(const std::vector<RunData>& runs, const HtmlOptions& opt, std::FILE* log) {
  std::ostringstream o;
  o << sec_open("distance", 5, "Weight distance between runs");
  o << "<p class=\"caption\">How far the weights of two runs have moved apart (Golden et al.): per layer, the "
       "1-D Wasserstein distance W1 between the two runs' weight values divided by the mean |w| of the first run "
       "(averaged over the layer's 2-D weights <code>qkvw attprojw fcw fcprojw</code>; <i>embeddings</i>, dashed: "
       "<code>wte wpe</code>), and the largest element-wise difference max |ΔW| over all of the layer's tensors. "
       "Both on log scales; a zero distance is not drawn. Computed from the checkpoints "
       "(<code>ckpt_NNNNNNNN.bin</code>) at the steps both runs have, against the first run given";
  o << (runs.size() >= 2 ? " (" + esc(runs[0].name) + ")" : "") << ", and from <code>wasserstein.csv</code> for "
    << "runs trained with <code>hooks.reference_run</code>.</p>\n";
  if (runs.size() < 2)
    o << note("one run given: pass two or more runs to compare their checkpoints against the first");
  for (size_t i = 1; i < runs.size(); ++i) {
    const RunData& a = runs[0];
    const RunData& b = runs[i];
    o << "<h3>" << run_tag(b, i) << " vs " << run_tag(a, 0) << "</h3>\n";
    if (!opt.compare_checkpoints) {
      o << note("checkpoint comparison off (--no-checkpoints)");
      continue;
    }
    std::vector<int64_t> shared;
    for (const auto& [s, p] : b.checkpoints)
      if (a.checkpoints.count(s)) shared.push_back(s);
    if (shared.empty()) {
      o << note("no checkpoint step shared by " + a.name + " (" + std::to_string(a.checkpoints.size()) +
                " checkpoints) and " + b.name + " (" + std::to_string(b.checkpoints.size()) + ")");
      continue;
    }
    std::vector<int64_t> use = shared;
    if (opt.max_checkpoint_pairs > 1 && use.size() > opt.max_checkpoint_pairs) {
      use.clear();
      const size_t n = opt.max_checkpoint_pairs;
      for (size_t k = 0; k < n; ++k) {
        const int64_t s = shared[k * (shared.size() - 1) / (n - 1)];
        if (use.empty() || use.back() != s) use.push_back(s);
      }
    }
    std::vector<DistRow> rows;
    std::vector<std::string> problems;
    int n_layers = 0;
    for (int64_t s : use) {
      try {
        if (log) std::fprintf(log, "report: comparing checkpoints of step %lld: %s vs %s\n", static_cast<long long>(s),
                              b.name.c_str(), a.name.c_str());
        const CheckpointWeights wa = load_checkpoint_weights(a.checkpoints.at(s));
        const CheckpointWeights wb = load_checkpoint_weights(b.checkpoints.at(s));
        const GPT2Config& ca = wa.config;
        const GPT2Config& cb = wb.config;
        if (ca.n_layer != cb.n_layer || ca.n_head != cb.n_head || ca.n_embd != cb.n_embd ||
            ca.max_seq_len != cb.max_seq_len || ca.vocab_size != cb.vocab_size || ca.vp() != cb.vp()) {
          problems.push_back("different model shapes (" + std::to_string(ca.n_layer) + "L " + std::to_string(ca.n_embd) +
                             "C vs " + std::to_string(cb.n_layer) + "L " + std::to_string(cb.n_embd) +
                             "C): no weight distance");
          break;
        }
        n_layers = ca.n_layer;
        for (const DistanceRow& d : weight_distances(ca, wa.master, wb.master))
          rows.push_back({s, d.tensor, d.layer, d.head, d.w1, d.w1_normalized, d.max_abs_diff});
      } catch (const std::exception& e) {
        problems.push_back(std::string("step ") + std::to_string(s) + ": " + e.what());
      }
    }
    for (const auto& p : problems) o << note(p);
    if (rows.empty()) continue;
    std::string took = std::to_string(use.size()) + " shared checkpoint step" + (use.size() == 1 ? "" : "s");
    if (use.size() < shared.size()) took += " (evenly spaced, of " + std::to_string(shared.size()) + ")";
    o << "<p class=\"caption\">" << esc(took) << ": " << use.front() << " … " << use.back() << ".</p>"
      << distance_panels(rows, n_layers, a.name);
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    if (!r.wasserstein_state.present) {
      if (r.cfg("hooks.reference_run").empty() && runs.size() >= 2) continue;  // the usual case: say nothing
      o << run_note(r, i, r.wasserstein_state.note);
      continue;
    }
    const std::string ref = r.cfg("hooks.reference_run", "its reference run");
    o << "<h3>" << run_tag(r, i) << " vs its reference run <code>" << esc(ref) << "</code> (wasserstein.csv)</h3>\n";
    if (!r.wasserstein_state.note.empty()) o << note(r.wasserstein_state.note);
    if (r.wasserstein.empty()) {
      o << note("wasserstein.csv has no rows yet");
      continue;
    }
    o << distance_panels(r.wasserstein, r.n_layer(), "reference");
  }
  o << "</section>\n";
  return o.str();
}

// Distinct display names: a repeated run.name gets its directory added.
std::vector<RunData> distinct_names(std::vector<RunData> runs) {
  std::map<std::string, int> count;
  for (const auto& r : runs) ++count[r.name];
  for (auto& r : runs)
    if (count[r.name] > 1) r.name += " (" + r.dir + ")";
  return runs;
}

}  // namespace

std::string html_report(const std::vector<RunData>& in, const HtmlOptions& opt, std::FILE* log) {
  if (in.empty()) fail("html_report: no runs");
  const std::vector<RunData> runs = distinct_names(in);
  std::ostringstream o;
  std::string names;
  for (const auto& r : runs) names += (names.empty() ? "" : ", ") + r.name;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
       "<meta name=\"generator\" content=\"stabletrain report\">"
       "<title>Stability report: "
    << esc(names) << "</title><style>" << kCss << "</style></head>\n<body><main>\n";
  o << header(runs, opt);
  o << loss_section(runs);
  o << spectral_section(runs);
  o << attention_section(runs);
  o << drift_section(runs);
  o << distance_section(runs, opt, log);
  o << "<footer>Written by stabletrain <code>report</code>. File formats: docs/run_files.md. Hover a line, dot, "
       "triangle or cell for its values.</footer>\n</main></body></html>\n";
  return o.str();
}

}  // namespace st::report
