// compare (apps/compare.cpp), internal: the types shared by its files (a run, its loss
// points, a pair's weight distances, a loss summary) and the functions each file provides
// to the others. Not used outside the compare executable.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "analysis/slices.h"
#include "analysis/weight_distance.h"

namespace st::compare_tool {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------- types

struct LossPoint {
  bool has_loss = false, has_val = false;
  double loss = kNaN, val = kNaN;
};

struct Run {
  std::string arg;   // as given on the command line
  std::string path;  // run directory or checkpoint file, lexically normal
  std::string name;  // in tables and CSV files
  std::map<int64_t, LossPoint> metrics;
  std::map<int64_t, std::string> ckpts;  // step -> file (run directories)
  std::string config_path;               // "" when the run has no config.yaml
  std::map<std::string, std::string> config;  // flattened "section.key" -> scalar text
};

struct LossSummary {
  int64_t shared = 0, first_step = 0, last_step = 0;
  int64_t first_diff = -1, diverge = -1, max_step = -1;
  double max_abs = 0;
  int64_t val_shared = 0, val_first_diff = -1;
  double val_max_abs = 0;
};

// One compared pair of checkpoints: run A's step a against the other run's step b. a == b:
// "exact"; otherwise "nearest" (b is the other run's checkpoint step nearest to a) or, for
// two checkpoint files given on the command line, "given".
struct StepPair {
  int64_t a = 0, b = 0;
  int64_t gap() const { return a > b ? a - b : b - a; }
};

struct PairResult {
  std::vector<StepPair> steps;                             // compared, by run A's step
  std::map<int64_t, std::vector<DistanceRow>> rows;        // per run A's step, in slice order
  std::vector<WeightSlice> slices;                         // weight_slices(config, true)
  std::vector<int64_t> too_far;   // run A's steps with no checkpoint within --max-step-gap
  std::string not_compared;       // why no weights were compared ("" when some were)
};

// nearest_step: analysis/weight_distance.h (shared with `report`).
// "exact", "nearest" or, in file mode, "given".
const char* pairing_name(const StepPair& p, bool file_mode);

// ---------------------------------------------------------------- runs (compare/runs.cpp)

std::string normal_path(const std::string& arg);
// The name of a run directory ("runs/a/" -> "a", "." -> the current folder's name).
std::string dir_name(const std::string& dir);
void read_metrics(Run& r);
void list_checkpoints(Run& r);
void read_config(Run& r);
// Model-shape checks: "" when the shapes agree, else what differs and where ("n_layer 2 vs 3
// (A/config.yaml, B/config.yaml)"). From config.yaml (before any checkpoint is read; "" when
// a run has none) and from two checkpoints.
std::string config_shape_diff(const Run& a, const Run& b);
std::string ckpt_shape_diff(const std::string& fa, const GPT2Config& ca, const std::string& fb,
                            const GPT2Config& cb);
// Keys whose values differ between two configs (run.name and run.out_dir left out).
std::vector<std::string> config_diffs(const Run& a, const Run& b);

// ---------------------------------------------------------------- loss comparison and
// console summary (compare/summary.cpp)

LossSummary compare_losses(const Run& a, const Run& b, double tol);
// The last logged training loss / validation loss of a run: {step, value} or {-1, NaN}.
std::pair<int64_t, double> last_loss(const Run& r, bool val);
// Mean of w1_normalized over the whole 2-D weight tensors (head == -1); per layer too.
double w1_aggregate(const PairResult& p, const std::vector<DistanceRow>& rows, int layer_only,
                    int* count);
// The console summary of every pair (run A, runs[k]), after the files are written.
void print_summary(const std::vector<Run>& runs, const std::vector<PairResult>& pairs,
                   bool file_mode, double tol, int top_k);

// ---------------------------------------------------------------- helpers and output files
// (compare/output.cpp)

std::string one_line(std::string s);
std::string num(double v);  // shortest round-trip
std::string csv_field(const std::string& s);
bool same_bits(double a, double b);
// "10 20 30", or "10 20 30 ... 380 390 400 (40 steps)" for long lists; "(none)" if empty.
template <class Range>
std::string step_list(const Range& steps) {
  std::vector<int64_t> v(steps.begin(), steps.end());
  if (v.empty()) return "(none)";
  std::string s;
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 12 && i == 5) {
      s += " ...";
      i = n - 5;
    }
    if (!s.empty()) s += ' ';
    s += std::to_string(v[i]);
  }
  if (n > 12) s += " (" + std::to_string(n) + " steps)";
  return s;
}

std::vector<int64_t> keys(const std::map<int64_t, std::string>& m);
void write_atomically(const std::string& path, const std::string& text, std::string& tmp_out);
int usage_error(const std::string& msg);
// compare.csv: the header, and one row's fields after run_a,run_b (step = step_a; layer and
// head -1 when the slice is not per layer / per head). No newline.
extern const char* const kCompareCsvHeader;
std::string compare_csv_fields(const StepPair& sp, const char* pairing, const DistanceRow& r);
// compare.csv (out_csv) and, for run directories, the loss CSV (loss_csv): built, written
// to temporary files and renamed into place; n_rows / n_loss_rows: the rows written.
void write_outputs(const std::vector<Run>& runs, const std::vector<PairResult>& pairs,
                   bool file_mode, const std::string& out_csv, const std::string& loss_csv,
                   size_t& n_rows, size_t& n_loss_rows);

}  // namespace st::compare_tool
