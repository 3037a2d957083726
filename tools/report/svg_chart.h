// Inline SVG charts for `report`: line charts (linear or log y, lines, markers, event
// triangles, reference lines, legend or labels at the line ends) and heatmaps with a
// colour bar. Each render() returns one <svg class="chart"> element, self-contained
// (no scripts, no external fonts; hover text through SVG <title>). Text is sized for the
// page's system font stack; widths are estimated at 0.6 em per character (DejaVu Sans, the
// widest common fallback), so labels do not collide with wider fonts either.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace st::report {

// XML/HTML text escaping (& < > " ').
std::string esc(const std::string& s);

// "Nice" axis ticks (1, 2, 5 x 10^k) covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target);
// Ticks for a log axis over [lo, hi] (both > 0): decades, with 2 and 5 added when few.
std::vector<double> log_ticks(double lo, double hi);
// Tick label for v on an axis whose ticks are `step` apart ("0.25", "10k", "2e-9").
std::string tick_label(double v, double step);
// Label for a log-axis tick ("1", "0.01", "10⁻⁵", "2×10⁻⁵").
std::string log_tick_label(double v);
// A number with about `sig` significant digits, short ("4.03", "0.0012", "1.2e-9").
std::string short_num(double v, int sig = 3);

// Colours.
const std::string& run_color(size_t i);        // one per run (Okabe-Ito, no yellow)
const std::string& highlight_color(size_t i);  // the highlighted heads of a panel
std::string viridis(double t);                 // t in [0, 1]
std::string layer_color(int layer, int n_layers);  // viridis, dark (L0) to green-yellow
std::string diverging(double t);               // t in [-1, 1]: blue - white - red
bool is_dark(const std::string& hex);          // for text on a coloured cell

// Min/max decimation for long series: keeps at most ~max_points points, each bucket's
// first, minimum and maximum, so spikes stay visible.
void decimate(std::vector<double>& x, std::vector<double>& y, size_t max_points);

struct Series {
  std::string name;          // legend entry / end label / hover text
  std::vector<double> x, y;  // a non-finite y breaks the line (markers: skipped)
  std::string color = "#333";
  double width = 1.6, opacity = 1.0;
  bool markers = false;      // circles instead of a line
  bool dots = false;         // small circles on the line's points as well
  double marker_r = 3.2;
  std::string dash;          // stroke-dasharray, e.g. "4 3"
  bool in_legend = true;
  bool end_label = false;    // write `name` after the line's last point
  std::vector<std::string> point_titles;  // markers: hover text per point (optional)
};

// A line series (the common case).
Series line_series(std::string name, std::vector<double> x, std::vector<double> y, std::string color,
                   double width = 1.6, double opacity = 1.0);

// An event drawn as a small downward triangle above (x, y).
struct EventMark {
  double x = 0, y = 0;
  std::string color = "#c0392b", title;
};

struct RefLine {  // horizontal reference line
  double y = 0;
  std::string color = "#888", dash = "3 3", label;
};

struct Axis {
  std::string label;
  bool log = false;
  bool has_min = false, has_max = false;  // fixed bounds, else from the data
  double min = 0, max = 0;
  void fix(double lo, double hi) { has_min = has_max = true, min = lo, max = hi; }
};

struct LineChart {
  std::string title, subtitle;  // subtitle: smaller, grey, after the title
  int width = 560, height = 300;
  Axis x, y;
  std::vector<Series> series;
  std::vector<EventMark> events;
  std::vector<RefLine> ref_lines;
  bool legend = true;  // a legend in the right margin (series with in_legend)
  std::string render() const;
  // The data range of all series (finite values; y > 0 only on a log axis). False when
  // there is no finite point.
  bool data_range(double& xlo, double& xhi, double& ylo, double& yhi) const;
};

struct Heatmap {
  std::string title, subtitle;
  std::string row_axis = "layer", col_axis = "head";
  std::vector<std::string> row_labels, col_labels;
  std::vector<std::vector<double>> values;  // [row][col]; NaN: no data (hatched grey)
  std::vector<std::vector<std::string>> titles;  // hover text per cell (optional)
  enum class Scale { kSequential, kDivergingAtZero, kLogDivergingAtOne } scale = Scale::kSequential;
  bool log_color = false;  // sequential on log10(v) (v > 0)
  bool fixed_range = false;  // sequential: colour range [range_lo, range_hi], not the data's
  double range_lo = 0, range_hi = 1;
  std::string value_label;  // colour bar caption
  int max_width = 300;      // cells shrink to fit
  std::string render() const;
};

// An HTML legend strip: coloured swatches with names (for a group of panels).
std::string html_legend(const std::vector<std::pair<std::string, std::string>>& name_color,
                        bool lines = true);

}  // namespace st::report
