// `report --text`: the spectral-norm table of one run (see text_report.h).
#include "apps/report/text_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "core/error.h"

namespace st::report {

namespace {

std::string num(double v) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string fixed3(double v) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  return b;
}

// A table whose columns are padded to their widest cell; `right[i]`: right-aligned.
std::string table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      const size_t pad = w[i] - r[i].size();
      if (i) line += "  ";
      if (i < right.size() && right[i]) line += std::string(pad, ' ') + r[i];
      else line += r[i] + (i + 1 < r.size() ? std::string(pad, ' ') : "");
    }
    out += line + "\n";
  }
  return out;
}

struct Stat {
  std::string matrix;
  int layer, head;
  int64_t s0, s1;
  double first, last, growth;
};

std::vector<Stat> stats(const SeriesByKey& m, const std::string& matrix) {
  std::vector<Stat> out;
  for (const auto& [k, xy] : m) {
    if (xy.x.empty()) continue;
    // First and last finite values.
    size_t a = 0, b = xy.y.size();
    while (a < xy.y.size() && !std::isfinite(xy.y[a])) ++a;
    while (b > a && !std::isfinite(xy.y[b - 1])) --b;
    if (a >= b) continue;
    const double f = xy.y[a], l = xy.y[b - 1];
    out.push_back({matrix, k.first, k.second, static_cast<int64_t>(xy.x[a]), static_cast<int64_t>(xy.x[b - 1]), f, l,
                   f != 0 ? l / f : std::nan("")});
  }
  return out;
}

}  // namespace

std::string text_report(const RunData& r, const std::string& matrix, int top) {
  if (!r.spectral_state.present) fail(r.dir, ": ", r.spectral_state.note);
  std::set<int64_t> steps;
  for (const auto& s : r.spectral) steps.insert(s.step);
  std::ostringstream o;
  o << r.name << " (" << r.dir << "): spectral.csv, " << steps.size() << " hook step"
    << (steps.size() == 1 ? "" : "s");
  if (!steps.empty()) o << " (" << *steps.begin() << " .. " << *steps.rbegin() << ")";
  o << "\n";
  if (!r.spectral_state.note.empty()) o << "note: " << r.spectral_state.note << "\n";

  std::vector<Stat> heads = stats(spectral_series(r, matrix), matrix);
  std::vector<Stat> per_head;
  for (const Stat& s : heads)
    if (s.head >= 0) per_head.push_back(s);
  if (per_head.empty()) fail(r.dir, ": spectral.csv has no per-head rows of matrix '", matrix, "'");
  std::stable_sort(per_head.begin(), per_head.end(), [](const Stat& a, const Stat& b) {
    if (a.last != b.last) return a.last > b.last;
    return std::make_pair(a.layer, a.head) < std::make_pair(b.layer, b.head);
  });
  const size_t shown = top > 0 ? std::min(per_head.size(), static_cast<size_t>(top)) : per_head.size();

  // Steps in the header when every row shares them, else a column.
  auto uniform = [](const std::vector<Stat>& v) {
    for (const Stat& s : v)
      if (s.s0 != v[0].s0 || s.s1 != v[0].s1) return false;
    return true;
  };
  auto emit = [&](const std::vector<Stat>& v, size_t n, bool with_head, bool with_matrix) {
    const bool uni = uniform(v);
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> h;
    if (with_matrix) h.push_back("matrix");
    h.push_back("layer");
    if (with_head) h.push_back("head");
    h.push_back(uni ? "sigma@" + std::to_string(v[0].s0) : "sigma_first");
    h.push_back(uni ? "sigma@" + std::to_string(v[0].s1) : "sigma_last");
    h.push_back("growth");
    if (!uni) h.push_back("steps");
    rows.push_back(h);
    std::vector<bool> right;
    for (const auto& c : h) right.push_back(c != "matrix" && c != "steps");
    for (size_t i = 0; i < n; ++i) {
      const Stat& s = v[i];
      std::vector<std::string> row;
      if (with_matrix) row.push_back(s.matrix);
      row.push_back(s.layer >= 0 ? std::to_string(s.layer) : "-");
      if (with_head) row.push_back(std::to_string(s.head));
      row.push_back(num(s.first));
      row.push_back(num(s.last));
      row.push_back(fixed3(s.growth));
      if (!uni) row.push_back(std::to_string(s.s0) + ".." + std::to_string(s.s1));
      rows.push_back(row);
    }
    return std::make_pair(rows, right);
  };

  o << "\n" << matrix << " per head, largest sigma at the last step first";
  if (shown < per_head.size()) o << " (top " << shown << " of " << per_head.size() << ")";
  o << "\n";
  {
    auto [rows, right] = emit(per_head, shown, true, false);
    o << table(rows, right);
  }

  // Per-layer matrices, grouped by matrix in layer order.
  std::vector<Stat> layers;
  for (const char* m : {"qkvw", "attprojw", "fcw", "fcprojw", "wte", "wpe"})
    for (const Stat& s : stats(spectral_series(r, m), m))
      if (s.head < 0) layers.push_back(s);
  if (!layers.empty()) {
    auto [rows, right] = emit(layers, layers.size(), false, true);
    o << "\nper-layer matrices\n" << table(rows, right);
  } else {
    o << "\nper-layer matrices: no rows in spectral.csv\n";
  }
  return o.str();
}

}  // namespace st::report
