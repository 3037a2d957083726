// SVG line charts and heatmaps for `report` (see svg_chart.h).
#include "tools/report/svg_chart.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace st::report {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kTickFont = 11, kTitleFont = 13, kLabelFont = 11.5;
constexpr const char* kGrid = "#e6e9ef";
constexpr const char* kAxis = "#9aa1ad";

double text_w(const std::string& s, double font) {
  // Code points, not bytes (superscripts, sigma, times sign are multi-byte).
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return 0.6 * font * static_cast<double>(n);
}

// Coordinates with one decimal.
std::string n1(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  std::string s = b;
  if (s == "-0.0") s = "0.0";
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

int next_id() {
  static std::atomic<int> id{0};
  return ++id;
}

double nice_step(double span, int target) {
  if (!(span > 0)) return 1;
  const double raw = span / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
}

std::string superscript(int e) {
  static const char* d[] = {"⁰", "¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹"};
  std::string s = e < 0 ? "⁻" : "";
  const std::string digits = std::to_string(std::abs(e));
  for (char c : digits) s += d[c - '0'];
  return s;
}

struct Rgb {
  double r, g, b;
};
Rgb hex_rgb(const std::string& h) {
  unsigned v = 0;
  std::sscanf(h.c_str() + (h[0] == '#'), "%6x", &v);
  return {double((v >> 16) & 255), double((v >> 8) & 255), double(v & 255)};
}
std::string rgb_hex(Rgb c) {
  char b[8];
  auto cl = [](double v) { return static_cast<int>(std::lround(std::clamp(v, 0.0, 255.0))); };
  std::snprintf(b, sizeof b, "#%02x%02x%02x", cl(c.r), cl(c.g), cl(c.b));
  return b;
}
std::string interpolate(const std::vector<const char*>& stops, double t) {
  if (!std::isfinite(t)) t = 0;
  t = std::clamp(t, 0.0, 1.0) * static_cast<double>(stops.size() - 1);
  const size_t i = std::min(static_cast<size_t>(t), stops.size() - 2);
  const double f = t - static_cast<double>(i);
  const Rgb a = hex_rgb(stops[i]), b = hex_rgb(stops[i + 1]);
  return rgb_hex({a.r + (b.r - a.r) * f, a.g + (b.g - a.g) * f, a.b + (b.b - a.b) * f});
}

}  // namespace

std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return t;
  if (hi < lo) std::swap(lo, hi);
  const double step = nice_step(hi - lo, target);
  if (hi == lo) return {lo};
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) {
    double v = k * step;
    if (std::fabs(v) < step * 1e-9) v = 0;
    t.push_back(v);
    if (t.size() > 200) break;
  }
  return t;
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  if (!(lo > 0) || !(hi > 0)) return t;
  if (hi < lo) std::swap(lo, hi);
  const int elo = static_cast<int>(std::floor(std::log10(lo)));
  const int ehi = static_cast<int>(std::ceil(std::log10(hi)));
  const int decades = ehi - elo;
  const int every = decades > 8 ? (decades + 5) / 6 : 1;
  std::vector<double> mults = decades >= 3 ? std::vector<double>{1}
                              : decades == 2 ? std::vector<double>{1, 2, 5}
                                             : std::vector<double>{1, 2, 3, 5};
  for (int e = elo; e <= ehi; ++e) {
    if ((e - elo) % every) continue;
    for (double m : mults) {
      const double v = m * std::pow(10.0, e);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
    }
  }
  if (t.size() < 2) {
    t.clear();
    for (double v : nice_ticks(lo, hi, 4))
      if (v > 0) t.push_back(v);
  }
  return t;
}

std::string short_num(double v, int sig) {
  if (std::isnan(v)) return "–";
  if (std::isinf(v)) return v > 0 ? "∞" : "-∞";
  if (v == 0) return "0";
  char b[48];
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-3) {
    std::snprintf(b, sizeof b, "%.*e", std::max(0, sig - 1), v);
    std::string s = b;
    const size_t e = s.find('e');
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    if (mant.find('.') != std::string::npos) {
      while (mant.back() == '0') mant.pop_back();
      if (mant.back() == '.') mant.pop_back();
    }
    const int exv = std::stoi(ex);
    return mant + "e" + std::to_string(exv);
  }
  const int mag = static_cast<int>(std::floor(std::log10(a)));
  const int dec = std::max(0, sig - 1 - mag);
  std::snprintf(b, sizeof b, "%.*f", dec, v);
  std::string s = b;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < std::fabs(step) * 1e-6) return "0";
  char b[48];
  if (step >= 1) {
    if (std::fabs(v) >= 1e7) return short_num(v, 3);
    if (step >= 1000) {  // every tick of the axis a multiple of 1000: "5k", "20k"
      std::snprintf(b, sizeof b, "%.0fk", v / 1000);
      return b;
    }
    std::snprintf(b, sizeof b, "%.0f", v);
    return b;
  }
  const int dec = static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  if (dec <= 4 && std::fabs(v) < 1e5) {
    std::snprintf(b, sizeof b, "%.*f", dec, v);
    return b;
  }
  const int sig = static_cast<int>(std::floor(std::log10(std::fabs(v))) - std::floor(std::log10(step))) + 1;
  return short_num(v, std::max(1, sig));
}

std::string log_tick_label(double v) {
  if (v >= 1e-3 && v < 1e4) return short_num(v, 2);
  const int e = static_cast<int>(std::floor(std::log10(v) + 1e-9));
  const double m = v / std::pow(10.0, e);
  if (std::fabs(m - 1) < 1e-6) return "10" + superscript(e);
  return short_num(m, 2) + "×10" + superscript(e);
}

const std::string& run_color(size_t i) {
  static const std::vector<std::string> c = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                             "#E69F00", "#56B4E9", "#8C564B", "#4D4D4D"};
  return c[i % c.size()];
}

const std::string& highlight_color(size_t i) {
  static const std::vector<std::string> c = {"#D62728", "#1F77B4", "#2CA02C", "#9467BD",
                                             "#FF7F0E"};
  return c[i % c.size()];
}

std::string viridis(double t) {
  static const std::vector<const char*> s = {"#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c",
                                             "#28ae80", "#5ec962", "#addc30", "#fde725"};
  return interpolate(s, t);
}

std::string layer_color(int layer, int n_layers) {
  if (n_layers <= 1) return viridis(0.35);
  return viridis(0.85 * layer / (n_layers - 1));
}

std::string diverging(double t) {
  static const std::vector<const char*> s = {"#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7",
                                             "#fddbc7", "#f4a582", "#d6604d", "#b2182b"};
  return interpolate(s, (t + 1) / 2);
}

bool is_dark(const std::string& hex) {
  const Rgb c = hex_rgb(hex);
  return (0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b) / 255 < 0.5;
}

void decimate(std::vector<double>& x, std::vector<double>& y, size_t max_points) {
  const size_t n = std::min(x.size(), y.size());
  if (n <= max_points || max_points < 6) return;
  const size_t b = (n + max_points / 3 - 1) / (max_points / 3);
  std::vector<double> ox, oy;
  for (size_t s = 0; s < n; s += b) {
    const size_t e = std::min(n, s + b);
    size_t lo = s, hi = s;
    bool gap = false;
    for (size_t i = s; i < e; ++i) {
      if (!std::isfinite(y[i])) {
        gap = true;
        continue;
      }
      if (!std::isfinite(y[lo]) || y[i] < y[lo]) lo = i;
      if (!std::isfinite(y[hi]) || y[i] > y[hi]) hi = i;
    }
    std::vector<size_t> keep = {s, lo, hi};
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    for (size_t i : keep) {
      ox.push_back(x[i]);
      oy.push_back(y[i]);
    }
    if (gap) {
      ox.push_back(x[e - 1]);
      oy.push_back(kNaN);
    }
  }
  x.swap(ox);
  y.swap(oy);
}

Series line_series(std::string name, std::vector<double> x, std::vector<double> y, std::string color,
                   double width, double opacity) {
  Series s;
  s.name = std::move(name);
  s.x = std::move(x);
  s.y = std::move(y);
  s.color = std::move(color);
  s.width = width;
  s.opacity = opacity;
  return s;
}

bool LineChart::data_range(double& xlo, double& xhi, double& ylo, double& yhi) const {
  xlo = ylo = std::numeric_limits<double>::infinity();
  xhi = yhi = -std::numeric_limits<double>::infinity();
  bool any = false;
  for (const Series& s : series) {
    const size_t n = std::min(s.x.size(), s.y.size());
    for (size_t i = 0; i < n; ++i) {
      const double xv = s.x[i], yv = s.y[i];
      if (!std::isfinite(xv) || !std::isfinite(yv) || (y.log && yv <= 0)) continue;
      any = true;
      xlo = std::min(xlo, xv), xhi = std::max(xhi, xv);
      ylo = std::min(ylo, yv), yhi = std::max(yhi, yv);
    }
  }
  for (const RefLine& r : ref_lines)
    if (std::isfinite(r.y) && (!y.log || r.y > 0)) ylo = std::min(ylo, r.y), yhi = std::max(yhi, r.y);
  return any;
}

std::string LineChart::render() const {
  const int id = next_id();
  double xlo, xhi, ylo, yhi;
  const bool any = data_range(xlo, xhi, ylo, yhi);
  std::ostringstream o;
  const double W = width, H = height;
  o << "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\""
    << height << "\" viewBox=\"0 0 " << width << " " << height << "\" role=\"img\"";
  if (!title.empty()) o << " aria-label=\"" << esc(title) << "\"";
  o << ">";
  const bool sub_line = !subtitle.empty() &&
                        text_w(title, kTitleFont) + 8 + text_w(subtitle, kTickFont) > W - 4;
  const double top = title.empty() ? 10 : sub_line ? 42 : 30;
  if (!title.empty()) {
    o << "<text class=\"t\" x=\"2\" y=\"16\">" << esc(title);
    if (!subtitle.empty() && !sub_line) o << "<tspan class=\"st\" dx=\"8\">" << esc(subtitle) << "</tspan>";
    o << "</text>";
    if (sub_line) o << "<text class=\"st\" x=\"2\" y=\"30\">" << esc(subtitle) << "</text>";
  }
  if (!any) {
    o << "<text class=\"empty\" x=\"" << n1(W / 2) << "\" y=\"" << n1(H / 2)
      << "\" text-anchor=\"middle\">no data</text></svg>";
    return o.str();
  }
  if (x.has_min) xlo = x.min;
  if (x.has_max) xhi = x.max;
  if (y.has_min) ylo = y.min;
  if (y.has_max) yhi = y.max;

  // ---- x domain and ticks (linear) ----
  if (xhi <= xlo) xlo -= 1, xhi += 1;
  const double plot_w_guess = W - 80;
  double xstep = nice_step(xhi - xlo, std::max(2, static_cast<int>(plot_w_guess / 62)));
  if (xstep < 1 && std::floor(xlo) == xlo && std::floor(xhi) == xhi) xstep = 1;
  // The x domain is the data's (time series end where the data ends).
  const double dx0 = xlo, dx1 = xhi;
  std::vector<double> xt;
  for (double k = std::ceil(dx0 / xstep - 1e-9); k * xstep <= dx1 + xstep * 1e-9; k += 1)
    xt.push_back(std::fabs(k * xstep) < xstep * 1e-9 ? 0 : k * xstep);

  // ---- y domain and ticks ----
  const double plot_h = H - top - (x.label.empty() ? 26 : 42);
  double dy0, dy1, ystep = 1;
  std::vector<double> yt;
  std::vector<std::string> ytl;
  if (y.log) {
    if (ylo <= 0) ylo = yhi > 0 ? yhi * 1e-3 : 1e-3;
    if (yhi <= ylo) yhi = ylo * 10, ylo = ylo / 10;
    const double l0 = std::log10(ylo), l1 = std::log10(yhi);
    const double pad = std::max(0.06 * (l1 - l0), 0.02);
    dy0 = y.has_min ? ylo : std::pow(10.0, l0 - pad);
    dy1 = y.has_max ? yhi : std::pow(10.0, l1 + pad);
    yt = log_ticks(dy0, dy1);
    for (double v : yt) ytl.push_back(log_tick_label(v));
  } else {
    if (yhi <= ylo) {
      const double d = ylo == 0 ? 1 : std::fabs(ylo) * 0.1;
      ylo -= d, yhi += d;
    }
    ystep = nice_step(yhi - ylo, std::max(2, static_cast<int>(plot_h / 42)));
    dy0 = y.has_min ? ylo : std::floor(ylo / ystep - 1e-9) * ystep;
    dy1 = y.has_max ? yhi : std::ceil(yhi / ystep + 1e-9) * ystep;
    if (!y.has_min && dy0 == ylo && ylo != 0) dy0 -= ystep * 0;  // keep tick at the edge
    for (double k = std::ceil(dy0 / ystep - 1e-9); k * ystep <= dy1 + ystep * 1e-9; k += 1)
      yt.push_back(std::fabs(k * ystep) < ystep * 1e-9 ? 0 : k * ystep);
    for (double v : yt) ytl.push_back(tick_label(v, ystep));
  }

  // ---- margins ----
  double ytw = 0;
  for (const auto& s : ytl) ytw = std::max(ytw, text_w(s, kTickFont));
  const double left = ytw + 10 + (y.label.empty() ? 0 : 18);
  double right = 14;
  double end_w = 0;
  for (const Series& s : series)
    if (s.end_label) end_w = std::max(end_w, text_w(s.name, kTickFont));
  if (end_w > 0) right = std::max(right, end_w + 10);
  std::vector<const Series*> leg;
  if (legend)
    for (const Series& s : series)
      if (s.in_legend && !s.name.empty()) leg.push_back(&s);
  double leg_w = 0;
  for (const Series* s : leg) leg_w = std::max(leg_w, text_w(s->name, kTickFont));
  const double leg_x = W - right - (leg.empty() ? 0 : leg_w + 32) + (leg.empty() ? 0 : 10);
  if (!leg.empty()) right += leg_w + 32;
  const double bottom = x.label.empty() ? 26 : 42;
  const double px0 = left, px1 = W - right, py0 = top, py1 = H - bottom;
  const double pw = px1 - px0, ph = py1 - py0;
  auto sx = [&](double v) { return px0 + (v - dx0) / (dx1 - dx0) * pw; };
  auto ty = [&](double v) { return y.log ? std::log10(v) : v; };
  const double ty0 = ty(dy0), ty1 = ty(dy1);
  auto sy = [&](double v) { return py1 - (ty(v) - ty0) / (ty1 - ty0) * ph; };

  // ---- grid, axes, ticks ----
  o << "<defs><clipPath id=\"clip" << id << "\"><rect x=\"" << n1(px0) << "\" y=\"" << n1(py0 - 2)
    << "\" width=\"" << n1(pw) << "\" height=\"" << n1(ph + 4) << "\"/></clipPath></defs>";
  o << "<g class=\"grid\" stroke=\"" << kGrid << "\" stroke-width=\"1\">";
  for (double v : yt) {
    if (v < std::min(dy0, dy1) - 1e-12 || v > std::max(dy0, dy1) * (1 + 1e-12) + 1e-300) continue;
    o << "<line x1=\"" << n1(px0) << "\" x2=\"" << n1(px1) << "\" y1=\"" << n1(sy(v)) << "\" y2=\""
      << n1(sy(v)) << "\"/>";
  }
  for (double v : xt)
    o << "<line x1=\"" << n1(sx(v)) << "\" x2=\"" << n1(sx(v)) << "\" y1=\"" << n1(py0) << "\" y2=\""
      << n1(py1) << "\" stroke-opacity=\"0.6\"/>";
  o << "</g>";
  o << "<g class=\"axis\" stroke=\"" << kAxis << "\"><line x1=\"" << n1(px0) << "\" x2=\"" << n1(px1)
    << "\" y1=\"" << n1(py1) << "\" y2=\"" << n1(py1) << "\"/><line x1=\"" << n1(px0) << "\" x2=\""
    << n1(px0) << "\" y1=\"" << n1(py0) << "\" y2=\"" << n1(py1) << "\"/></g>";
  o << "<g class=\"ticks\">";
  for (size_t i = 0; i < yt.size(); ++i)
    o << "<text x=\"" << n1(px0 - 5) << "\" y=\"" << n1(sy(yt[i]) + 3.8) << "\" text-anchor=\"end\">"
      << esc(ytl[i]) << "</text>";
  // x tick labels: drop ones that would overlap their neighbour.
  double last_end = -1e9;
  for (double v : xt) {
    const std::string l = tick_label(v, xstep);
    const double w = text_w(l, kTickFont), cx = sx(v);
    double lx = std::clamp(cx, px0 + w / 2 - 4, W - w / 2 - 1);
    if (lx - w / 2 < last_end + 6) continue;
    last_end = lx + w / 2;
    o << "<text x=\"" << n1(lx) << "\" y=\"" << n1(py1 + 15) << "\" text-anchor=\"middle\">" << esc(l)
      << "</text>";
  }
  o << "</g>";
  if (!x.label.empty())
    o << "<text class=\"al\" x=\"" << n1(px0 + pw / 2) << "\" y=\"" << n1(H - 6)
      << "\" text-anchor=\"middle\">" << esc(x.label) << "</text>";
  if (!y.label.empty())
    o << "<text class=\"al\" transform=\"translate(" << n1(12) << "," << n1(py0 + ph / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">" << esc(y.label) << "</text>";

  // ---- reference lines ----
  for (const RefLine& r : ref_lines) {
    if (!std::isfinite(r.y) || (y.log && r.y <= 0)) continue;
    o << "<line x1=\"" << n1(px0) << "\" x2=\"" << n1(px1) << "\" y1=\"" << n1(sy(r.y)) << "\" y2=\""
      << n1(sy(r.y)) << "\" stroke=\"" << r.color << "\" stroke-dasharray=\"" << r.dash << "\"/>";
    if (!r.label.empty())
      o << "<text class=\"rl\" x=\"" << n1(px1 - 3) << "\" y=\"" << n1(sy(r.y) - 4)
        << "\" text-anchor=\"end\">" << esc(r.label) << "</text>";
  }

  // ---- series ----
  o << "<g clip-path=\"url(#clip" << id << ")\" fill=\"none\" stroke-linejoin=\"round\" stroke-linecap=\"round\">";
  struct EndLabel {
    double y;
    const Series* s;
  };
  std::vector<EndLabel> ends;
  for (const Series& s : series) {
    const size_t n = std::min(s.x.size(), s.y.size());
    auto ok = [&](size_t i) {
      return std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && (!y.log || s.y[i] > 0);
    };
    if (s.markers) {
      o << "<g class=\"m\" fill=\"" << s.color << "\" fill-opacity=\"" << s.opacity
        << "\" stroke=\"#fff\" stroke-width=\"1\">";
      for (size_t i = 0; i < n; ++i) {
        if (!ok(i)) continue;
        o << "<circle cx=\"" << n1(sx(s.x[i])) << "\" cy=\"" << n1(sy(s.y[i])) << "\" r=\"" << s.marker_r
          << "\">";
        if (i < s.point_titles.size() && !s.point_titles[i].empty())
          o << "<title>" << esc(s.point_titles[i]) << "</title>";
        o << "</circle>";
      }
      o << "</g>";
    } else {
      std::string d;
      bool pen = false;
      size_t pts = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!ok(i)) {
          pen = false;
          continue;
        }
        d += pen ? "L" : "M";
        d += n1(sx(s.x[i]));
        d += ' ';
        d += n1(sy(s.y[i]));
        pen = true;
        ++pts;
      }
      if (pts == 1) d += "h0.01";  // a lone point: round caps draw a dot
      if (!d.empty()) {
        o << "<path d=\"" << d << "\" stroke=\"" << s.color << "\" stroke-width=\"" << s.width << "\"";
        if (s.opacity < 1) o << " stroke-opacity=\"" << s.opacity << "\"";
        if (!s.dash.empty()) o << " stroke-dasharray=\"" << s.dash << "\"";
        o << ">";
        if (!s.name.empty()) o << "<title>" << esc(s.name) << "</title>";
        o << "</path>";
      }
      if (s.dots) {
        o << "<g fill=\"" << s.color << "\" stroke=\"none\">";
        for (size_t i = 0; i < n; ++i)
          if (ok(i))
            o << "<circle cx=\"" << n1(sx(s.x[i])) << "\" cy=\"" << n1(sy(s.y[i])) << "\" r=\"2.4\"><title>"
              << esc(s.name) << ": " << short_num(s.y[i], 4) << " at " << short_num(s.x[i], 6) << "</title></circle>";
        o << "</g>";
      }
    }
    if (s.end_label && !s.name.empty())
      for (size_t i = n; i-- > 0;)
        if (ok(i)) {
          ends.push_back({std::clamp(sy(s.y[i]), py0, py1), &s});
          break;
        }
  }
  o << "</g>";

  // ---- events ----
  if (!events.empty()) {
    o << "<g class=\"ev\">";
    for (const EventMark& e : events) {
      if (!std::isfinite(e.x) || e.x < dx0 || e.x > dx1) continue;
      const double ex = sx(e.x);
      double ey = std::isfinite(e.y) && (!y.log || e.y > 0) ? sy(e.y) : py0 + 8;
      ey = std::clamp(ey, py0 + 9, py1);
      o << "<g><title>" << esc(e.title) << "</title><line x1=\"" << n1(ex) << "\" x2=\"" << n1(ex)
        << "\" y1=\"" << n1(py0) << "\" y2=\"" << n1(py1) << "\" stroke=\"" << e.color
        << "\" stroke-opacity=\"0.25\" stroke-dasharray=\"2 2\"/><path d=\"M" << n1(ex - 5) << " "
        << n1(ey - 10) << "L" << n1(ex + 5) << " " << n1(ey - 10) << "L" << n1(ex) << " " << n1(ey - 2)
        << "Z\" fill=\"" << e.color << "\" stroke=\"#fff\" stroke-width=\"0.8\"/></g>";
    }
    o << "</g>";
  }

  // ---- end labels, pushed apart ----
  if (!ends.empty()) {
    std::sort(ends.begin(), ends.end(), [](const EndLabel& a, const EndLabel& b) { return a.y < b.y; });
    const double gap = 12;
    for (size_t i = 1; i < ends.size(); ++i) ends[i].y = std::max(ends[i].y, ends[i - 1].y + gap);
    const double over = ends.back().y - (py1 + 2);
    if (over > 0)
      for (auto& e : ends) e.y -= over;
    for (size_t i = ends.size() - 1; i-- > 0;) ends[i].y = std::min(ends[i].y, ends[i + 1].y - gap);
    for (const EndLabel& e : ends)
      o << "<text class=\"el\" x=\"" << n1(px1 + 4) << "\" y=\"" << n1(e.y + 3.8) << "\" style=\"fill:"
        << e.s->color << "\">" << esc(e.s->name) << "</text>";
  }

  // ---- legend ----
  if (!leg.empty()) {
    const double row = 16;
    const size_t fit = std::max<size_t>(1, static_cast<size_t>(ph / row));
    o << "<g class=\"lg\">";
    for (size_t i = 0; i < leg.size() && i < fit; ++i) {
      const Series& s = *leg[i];
      const double ly = py0 + 6 + row * static_cast<double>(i);
      if (i + 1 == fit && leg.size() > fit) {
        o << "<text x=\"" << n1(leg_x) << "\" y=\"" << n1(ly + 4) << "\">+" << (leg.size() - i)
          << " more</text>";
        break;
      }
      if (s.markers)
        o << "<circle cx=\"" << n1(leg_x + 9) << "\" cy=\"" << n1(ly) << "\" r=\"" << s.marker_r
          << "\" fill=\"" << s.color << "\"/>";
      else
        o << "<line x1=\"" << n1(leg_x) << "\" x2=\"" << n1(leg_x + 18) << "\" y1=\"" << n1(ly)
          << "\" y2=\"" << n1(ly) << "\" stroke=\"" << s.color << "\" stroke-width=\""
          << std::max(2.0, s.width) << "\"" << (s.dash.empty() ? "" : " stroke-dasharray=\"" + s.dash + "\"")
          << "/>";
      o << "<text x=\"" << n1(leg_x + 24) << "\" y=\"" << n1(ly + 3.8) << "\">" << esc(s.name) << "</text>";
    }
    o << "</g>";
  }
  o << "</svg>";
  return o.str();
}

std::string Heatmap::render() const {
  const int id = next_id();
  const size_t R = values.size(), C = R ? values[0].size() : 0;
  std::ostringstream o;
  // Colour mapping.
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& r : values)
    for (double v : r) {
      if (!std::isfinite(v) || ((log_color || scale == Scale::kLogDivergingAtOne) && v <= 0)) continue;
      const double t = log_color ? std::log10(v) : scale == Scale::kLogDivergingAtOne ? std::log(v) : v;
      lo = std::min(lo, t), hi = std::max(hi, t);
    }
  const bool any = lo <= hi;
  if (any && fixed_range && scale == Scale::kSequential) {
    lo = log_color ? std::log10(range_lo) : range_lo;
    hi = log_color ? std::log10(range_hi) : range_hi;
  }
  double m = 0;  // diverging half-range
  if (any && scale != Scale::kSequential) m = std::max({std::fabs(lo), std::fabs(hi), 1e-300});
  if (scale == Scale::kLogDivergingAtOne) m = std::max(m, std::log(1.05));
  auto colour_t = [&](double t) -> std::string {  // t in the mapped domain
    if (scale == Scale::kSequential) return viridis(hi > lo ? (t - lo) / (hi - lo) : 0.5);
    return diverging(t / m);
  };
  auto colour = [&](double v) -> std::string {
    if (!std::isfinite(v)) return "";
    if (scale == Scale::kLogDivergingAtOne) return v > 0 ? colour_t(std::log(v)) : "";
    if (log_color) return v > 0 ? colour_t(std::log10(v)) : "";
    return colour_t(v);
  };
  // Colour bar range in data units: (bottom, top) and its tick values.
  double bar_lo = 0, bar_hi = 0;
  if (any) {
    if (scale == Scale::kSequential) bar_lo = lo, bar_hi = hi;
    else bar_lo = -m, bar_hi = m;
  }
  auto to_value = [&](double t) {
    if (scale == Scale::kLogDivergingAtOne) return std::exp(t);
    if (log_color) return std::pow(10.0, t);
    return t;
  };

  // Layout.
  double rl_w = 0;
  for (const auto& s : row_labels) rl_w = std::max(rl_w, text_w(s, kTickFont));
  const double left = rl_w + 8;
  std::vector<std::string> bar_labels = {short_num(to_value(bar_hi), 3), short_num(to_value((bar_lo + bar_hi) / 2), 3),
                                         short_num(to_value(bar_lo), 3)};
  double bl_w = 0;
  for (const auto& s : bar_labels) bl_w = std::max(bl_w, text_w(s, 10.5));
  const double bar_w = 12 + 6 + bl_w + 4;
  double cell = C ? std::floor((max_width - left - bar_w - 10) / static_cast<double>(C)) : 20;
  cell = std::clamp(cell, 7.0, 34.0);
  const double top = (title.empty() ? 4 : 30) + 16;
  const double gw = cell * static_cast<double>(C), gh = cell * static_cast<double>(R);
  const double bar_h = std::max(gh, 70.0);
  // At least max_width wide, so heatmaps in a grid line up column by column.
  const double W = std::ceil(std::max({left + gw + 10 + bar_w, title.empty() ? 0.0 : text_w(title, kTitleFont) + 6,
                                       static_cast<double>(max_width)}));
  const double H = std::ceil(top + std::max(gh, bar_h) + 8);
  o << "<svg class=\"chart heatmap\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\"";
  if (!title.empty()) o << " aria-label=\"" << esc(title) << "\"";
  o << ">";
  if (!title.empty()) {
    o << "<text class=\"t\" x=\"2\" y=\"16\">" << esc(title) << "</text>";
    if (!subtitle.empty()) o << "<text class=\"st\" x=\"2\" y=\"30\">" << esc(subtitle) << "</text>";
  }
  if (!any || R == 0 || C == 0) {
    o << "<text class=\"empty\" x=\"" << n1(W / 2) << "\" y=\"" << n1(top + 20)
      << "\" text-anchor=\"middle\">no data</text></svg>";
    return o.str();
  }
  const double gx = left, gy = top;
  // Column labels (thinned when cells are narrow).
  double cl_w = 0;
  for (const auto& s : col_labels) cl_w = std::max(cl_w, text_w(s, 10.5));
  const size_t cstep = std::max<size_t>(1, static_cast<size_t>(std::ceil((cl_w + 3) / cell)));
  const size_t rstep = std::max<size_t>(1, static_cast<size_t>(std::ceil(12.0 / cell)));
  o << "<g class=\"ticks hl\">";
  for (size_t c = 0; c < C && c < col_labels.size(); c += cstep)
    o << "<text x=\"" << n1(gx + cell * (c + 0.5)) << "\" y=\"" << n1(gy - 5) << "\" text-anchor=\"middle\">"
      << esc(col_labels[c]) << "</text>";
  for (size_t r = 0; r < R && r < row_labels.size(); r += rstep)
    o << "<text x=\"" << n1(gx - 5) << "\" y=\"" << n1(gy + cell * (r + 0.5) + 3.8) << "\" text-anchor=\"end\">"
      << esc(row_labels[r]) << "</text>";
  o << "</g>";
  // Cells.
  bool numbers = cell >= 26;  // in-cell values only when every one fits
  for (size_t r = 0; r < R && numbers; ++r)
    for (double v : values[r])
      if (std::isfinite(v) && text_w(short_num(v, 2), 9.5) > cell - 3) numbers = false;
  o << "<g class=\"cells\">";
  for (size_t r = 0; r < R; ++r)
    for (size_t c = 0; c < values[r].size() && c < C; ++c) {
      const double v = values[r][c];
      const std::string col = colour(v);
      const double x0 = gx + cell * c, y0 = gy + cell * r;
      o << "<rect x=\"" << n1(x0) << "\" y=\"" << n1(y0) << "\" width=\"" << n1(cell - 1) << "\" height=\""
        << n1(cell - 1) << "\" fill=\"" << (col.empty() ? "#eef0f3" : col) << "\">";
      std::string tt = r < titles.size() && c < titles[r].size() ? titles[r][c] : "";
      if (tt.empty())
        tt = (r < row_labels.size() ? row_labels[r] : "") + " " + (c < col_labels.size() ? col_labels[c] : "") +
             ": " + short_num(v, 4);
      o << "<title>" << esc(tt) << "</title></rect>";
      if (numbers && !col.empty()) {
        const std::string s = short_num(v, 2);
        o << "<text class=\"cv\" x=\"" << n1(x0 + (cell - 1) / 2) << "\" y=\"" << n1(y0 + cell / 2 + 3)
            << "\" text-anchor=\"middle\" style=\"fill:" << (is_dark(col) ? "#fff" : "#222") << "\">" << esc(s)
            << "</text>";
      }
    }
  o << "</g>";
  // Colour bar.
  const double bx = gx + gw + 10, by = gy;
  o << "<defs><linearGradient id=\"cb" << id << "\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (int i = 0; i <= 16; ++i) {
    const double t = bar_lo + (bar_hi - bar_lo) * i / 16.0;
    o << "<stop offset=\"" << n1(i * 100.0 / 16) << "%\" stop-color=\"" << colour_t(t) << "\"/>";
  }
  o << "</linearGradient></defs><rect x=\"" << n1(bx) << "\" y=\"" << n1(by) << "\" width=\"12\" height=\""
    << n1(bar_h) << "\" fill=\"url(#cb" << id << ")\" stroke=\"" << kGrid << "\"/>";
  o << "<g class=\"ticks cbl\">";
  const double ys[3] = {by + 4, by + bar_h / 2 + 3.5, by + bar_h};
  for (int i = 0; i < 3; ++i)
    o << "<text x=\"" << n1(bx + 16) << "\" y=\"" << n1(ys[i]) << "\">" << esc(bar_labels[i]) << "</text>";
  o << "</g>";
  if (!value_label.empty()) o << "<title>" << esc(value_label) << "</title>";
  o << "</svg>";
  return o.str();
}

std::string html_legend(const std::vector<std::pair<std::string, std::string>>& name_color, bool lines) {
  std::ostringstream o;
  o << "<div class=\"legend\">";
  for (const auto& [name, color] : name_color)
    o << "<span class=\"key\"><span class=\"" << (lines ? "sw" : "dot") << "\" style=\"background:" << color
      << "\"></span>" << esc(name) << "</span>";
  o << "</div>";
  return o.str();
}

}  // namespace st::report
