// compare (apps/compare.cpp): the loss comparison of two runs (shared steps, first
// differing step, divergence, max |delta loss|), the W1 aggregate of a pair's weight
// distances, and the console summary printed per pair (config, loss, checkpoints, per step
// the W1 aggregate, per layer and the top-K slices, the slope).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "apps/compare/compare.h"

namespace st::compare_tool {

namespace {

// The first and last step a run logged a training loss at ({-1, -1}: none).
std::pair<int64_t, int64_t> loss_range(const Run& r) {
  std::pair<int64_t, int64_t> out{-1, -1};
  for (const auto& [step, p] : r.metrics)
    if (p.has_loss) {
      if (out.first < 0) out.first = step;
      out.second = step;
    }
  return out;
}

std::string range_text(const std::pair<int64_t, int64_t>& r) {
  return r.first < 0 ? "no loss" : std::to_string(r.first) + ".." + std::to_string(r.second);
}

// "10 20", nearest pairs as "A~B" ("3~4 6~4 12"); long lists shortened as step_list does.
std::string pair_list(const std::vector<StepPair>& steps) {
  if (steps.empty()) return "(none)";
  std::string s;
  const size_t n = steps.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 12 && i == 5) {
      s += " ...";
      i = n - 5;
    }
    if (!s.empty()) s += ' ';
    s += std::to_string(steps[i].a);
    if (steps[i].b != steps[i].a) s += "~" + std::to_string(steps[i].b);
  }
  if (n > 12) s += " (" + std::to_string(n) + " pairs)";
  return s;
}

}  // namespace

LossSummary compare_losses(const Run& a, const Run& b, double tol) {
  LossSummary s;
  for (const auto& [step, pa] : a.metrics) {
    const auto it = b.metrics.find(step);
    if (it == b.metrics.end()) continue;
    const LossPoint& pb = it->second;
    if (pa.has_loss && pb.has_loss) {
      if (s.shared == 0) s.first_step = step;
      s.last_step = step;
      ++s.shared;
      const double d = std::fabs(pb.loss - pa.loss);
      if (s.first_diff < 0 && !same_bits(pa.loss, pb.loss)) s.first_diff = step;
      if (s.diverge < 0 && (d > tol || std::isnan(d))) s.diverge = step;
      if (d > s.max_abs || (std::isnan(d) && !std::isnan(s.max_abs))) {
        s.max_abs = d;
        s.max_step = step;
      }
    }
    if (pa.has_val && pb.has_val) {
      ++s.val_shared;
      if (s.val_first_diff < 0 && !same_bits(pa.val, pb.val)) s.val_first_diff = step;
      const double d = std::fabs(pb.val - pa.val);
      if (d > s.val_max_abs || std::isnan(d)) s.val_max_abs = d;
    }
  }
  return s;
}

// The last logged training loss / validation loss of a run: {step, value} or {-1, NaN}.
std::pair<int64_t, double> last_loss(const Run& r, bool val) {
  for (auto it = r.metrics.rbegin(); it != r.metrics.rend(); ++it)
    if (val ? it->second.has_val : it->second.has_loss)
      return {it->first, val ? it->second.val : it->second.loss};
  return {-1, kNaN};
}

// Mean of w1_normalized over the whole 2-D weight tensors (head == -1); per layer too.
double w1_aggregate(const PairResult& p, const std::vector<DistanceRow>& rows, int layer_only,
                    int* count) {
  double sum = 0;
  int n = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const WeightSlice& s = p.slices[i];
    if (!s.is_2d_weight() || s.head >= 0) continue;
    if (layer_only >= 0 && s.layer != layer_only) continue;
    sum += rows[i].w1_normalized;
    ++n;
  }
  if (count) *count = n;
  return n ? sum / n : kNaN;
}

void print_summary(const std::vector<Run>& runs, const std::vector<PairResult>& pairs,
                   bool file_mode, double tol, int top_k) {
  const Run& A = runs[0];
  std::printf("reference: %s (%s)\n", A.name.c_str(), A.path.c_str());
  for (size_t k = 1; k < runs.size(); ++k) {
    const Run& X = runs[k];
    const PairResult& p = pairs[k];
    std::printf("\n== %s vs %s ==\n", X.name.c_str(), A.name.c_str());
    if (!file_mode) {
      const auto diffs = config_diffs(A, X);
      if (A.config_path.empty() || X.config_path.empty())
        std::printf("config:      (no config.yaml in one of the runs)\n");
      else if (diffs.empty())
        std::printf("config:      identical (config.yaml, run name and directory aside)\n");
      else
        for (size_t i = 0; i < diffs.size(); ++i)
          std::printf("%s%s\n", i == 0 ? "config:      differs in " : "             ",
                      diffs[i].c_str());
      const LossSummary s = compare_losses(A, X, tol);
      const auto ra = loss_range(A), rx = loss_range(X);
      if (s.shared == 0) {
        std::printf("loss:        no training step logged by both runs (%s logged %s, %s %s)\n",
                    A.name.c_str(), range_text(ra).c_str(), X.name.c_str(),
                    range_text(rx).c_str());
      } else {
        std::printf("loss:        %lld shared steps (%lld..%lld)", (long long)s.shared,
                    (long long)s.first_step, (long long)s.last_step);
        // Runs of different lengths (or log_every): compared over the common range only.
        if (ra != rx)
          std::printf(", the range both runs logged (%s %s, %s %s)", A.name.c_str(),
                      range_text(ra).c_str(), X.name.c_str(), range_text(rx).c_str());
        if (s.first_diff < 0) {
          std::printf("; losses identical (bitwise) at every shared step\n");
        } else {
          std::printf("; first differing step %lld; ", (long long)s.first_diff);
          if (s.diverge >= 0)
            std::printf("diverged (|dloss| > %g) at step %lld", tol, (long long)s.diverge);
          else
            std::printf("no divergence (|dloss| <= %g throughout)", tol);
          std::printf("; max |dloss| %.6g at step %lld\n", s.max_abs, (long long)s.max_step);
        }
      }
      if (s.val_shared > 0) {
        if (s.val_first_diff < 0)
          std::printf("val_loss:    identical (bitwise) at %lld shared evaluations\n",
                      (long long)s.val_shared);
        else
          std::printf("val_loss:    %lld shared evaluations; first differing step %lld; max "
                      "|dval_loss| %.6g\n", (long long)s.val_shared,
                      (long long)s.val_first_diff, s.val_max_abs);
      }
      const auto la = last_loss(A, false), lx = last_loss(X, false);
      const auto va = last_loss(A, true), vx = last_loss(X, true);
      std::printf("final:       loss %s %.6f (step %lld), %s %.6f (step %lld)", A.name.c_str(),
                  la.second, (long long)la.first, X.name.c_str(), lx.second, (long long)lx.first);
      if (va.first >= 0 && vx.first >= 0)
        std::printf("; val_loss %s %.6f (step %lld), %s %.6f (step %lld)", A.name.c_str(),
                    va.second, (long long)va.first, X.name.c_str(), vx.second,
                    (long long)vx.first);
      if (la.first != lx.first && s.shared > 0) {
        const LossPoint& pa = A.metrics.at(s.last_step);
        const LossPoint& px = X.metrics.at(s.last_step);
        std::printf("; at the last shared step %lld: %s %.6f, %s %.6f", (long long)s.last_step,
                    A.name.c_str(), pa.loss, X.name.c_str(), px.loss);
      }
      std::printf("\n");
      std::printf("checkpoints: %s has %s; %s has %s; compared: %s\n", A.name.c_str(),
                  step_list(keys(A.ckpts)).c_str(), X.name.c_str(),
                  step_list(keys(X.ckpts)).c_str(), pair_list(p.steps).c_str());
      if (!p.not_compared.empty()) {
        std::printf("weights:     not compared: %s; losses only\n", p.not_compared.c_str());
        continue;
      }
      int n_exact = 0;
      const StepPair* widest = nullptr;
      for (const StepPair& sp : p.steps) {
        n_exact += sp.a == sp.b;
        if (!widest || sp.gap() > widest->gap()) widest = &sp;
      }
      std::printf("weights:     %zu checkpoint pairs: %d exact, %zu nearest; largest step gap "
                  "%lld", p.steps.size(), n_exact, p.steps.size() - size_t(n_exact),
                  (long long)widest->gap());
      if (widest->gap() > 0)
        std::printf(" (%s %lld vs %s %lld)", A.name.c_str(), (long long)widest->a,
                    X.name.c_str(), (long long)widest->b);
      if (!p.too_far.empty())
        std::printf("; not compared, no checkpoint of %s within --max-step-gap: %s %s",
                    X.name.c_str(), A.name.c_str(), step_list(p.too_far).c_str());
      std::printf("\n");
    } else {
      const StepPair& sp = p.steps.front();
      if (sp.a == sp.b)
        std::printf("checkpoints: %s vs %s (step %lld)\n", X.path.c_str(), A.path.c_str(),
                    (long long)sp.a);
      else
        std::printf("checkpoints: %s (step %lld) vs %s (step %lld)\n", X.path.c_str(),
                    (long long)sp.b, A.path.c_str(), (long long)sp.a);
    }

    // Per step: aggregate, per layer, top-K.
    int n_mats = 0;
    std::vector<std::pair<int64_t, double>> agg;
    int n_layer = 0;
    for (const auto& s : p.slices) n_layer = std::max(n_layer, s.layer + 1);
    for (const StepPair& sp : p.steps) {
      const int64_t step = sp.a;
      const auto& rows = p.rows.at(step);
      const double a = w1_aggregate(p, rows, -1, &n_mats);
      agg.emplace_back(step, a);
      bool identical = true;
      for (const auto& r : rows) identical &= r.w1 == 0 && r.max_abs_diff == 0;
      if (sp.a == sp.b)
        std::printf("step %lld: W1 aggregate %.4e", (long long)step, a);
      else
        std::printf("step %lld (%s step %lld, %s): W1 aggregate %.4e", (long long)step,
                    X.name.c_str(), (long long)sp.b, pairing_name(sp, file_mode), a);
      if (agg.size() > 1) {
        const auto& prev = agg[agg.size() - 2];
        std::printf(" (%+.3e per step since step %lld)",
                    (a - prev.second) / double(step - prev.first), (long long)prev.first);
      }
      std::printf("\n");
      if (identical) {
        std::printf("  weights identical: w1 = 0 and max|dW| = 0 in all %zu slices\n",
                    rows.size());
        continue;
      }
      std::string layers = "  per layer:";
      for (int l = 0; l < n_layer; ++l) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "  L%d %.3e", l, w1_aggregate(p, rows, l, nullptr));
        layers += buf;
      }
      std::printf("%s\n", layers.c_str());
      if (top_k > 0) {
        std::vector<size_t> idx;
        for (size_t i = 0; i < rows.size(); ++i)
          if (p.slices[i].is_2d_weight()) idx.push_back(i);
        std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
          const double a = rows[x].w1_normalized, b = rows[y].w1_normalized;
          if (std::isnan(a) != std::isnan(b)) return std::isnan(a);
          return a > b;
        });
        if (idx.size() > size_t(top_k)) idx.resize(size_t(top_k));
        std::printf("  %-14s %12s %12s %12s\n", "slice", "w1_norm", "w1", "max|dW|");
        for (size_t i : idx)
          std::printf("  %-14s %12.4e %12.4e %12.4e\n", slice_label(p.slices[i]).c_str(),
                      rows[i].w1_normalized, rows[i].w1, rows[i].max_abs_diff);
      }
    }
    if (agg.size() >= 2) {
      double ms = 0, mw = 0;
      for (const auto& [s, w] : agg) {
        ms += double(s);
        mw += w;
      }
      ms /= double(agg.size());
      mw /= double(agg.size());
      double sxy = 0, sxx = 0;
      for (const auto& [s, w] : agg) {
        sxy += (double(s) - ms) * (w - mw);
        sxx += (double(s) - ms) * (double(s) - ms);
      }
      std::string line = "slope:       W1 aggregate per step:";
      for (size_t i = 1; i < agg.size(); ++i) {
        char buf[96];
        std::snprintf(buf, sizeof buf, " %lld->%lld %+.3e%s", (long long)agg[i - 1].first,
                      (long long)agg[i].first,
                      (agg[i].second - agg[i - 1].second) / double(agg[i].first - agg[i - 1].first),
                      i + 1 < agg.size() ? "," : "");
        line += buf;
      }
      std::printf("%s; least squares %+.3e over %zu checkpoints\n", line.c_str(), sxy / sxx,
                  agg.size());
    }
    if (std::any_of(p.steps.begin(), p.steps.end(), [](const StepPair& x) { return x.a != x.b; }))
      std::printf("(pairs of different steps (nearest, given): their W1 also holds the"
                  " weights' own change over the step gap, as two identical runs would show)\n");
    if (p.steps.empty()) continue;
    std::printf("(W1 aggregate: mean w1_normalized over the %d whole 2-D weight matrices: wte,"
                " wpe, qkvw/attprojw/fcw/fcprojw per layer)\n", n_mats);
  }
}

}  // namespace st::compare_tool
