// `report`'s HTML page: one offline file. The runs' data go into the page as one JSON
// document (`report_data`); the page's script (apps/report/web/report.js, its helpers in
// report_kit.js) draws it with uPlot (third_party/uplot), all compiled into the binary and
// inlined, so nothing is fetched. The page is built around comparison with a reference run:
// loss and Δloss, grad norms per layer, spectral norms, attention statistics, δ drift and
// weight distances, every per-layer panel overlaying the runs on one shared scale.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/report/run_data.h"

namespace st::report {

struct HtmlOptions {
  size_t reference = 0;              // index of the reference run in `runs`
  size_t max_checkpoint_pairs = 24;  // weight distances: checkpoint pairs compared per run
  bool compare_checkpoints = true;   // weight distances: read checkpoints (off: wasserstein.csv only)
  std::string generated;             // "generated ..." text in the header (e.g. a date)
  int refresh_s = 0;                 // > 0: the page reloads itself every refresh_s seconds (report --watch)
};

// Checkpoint pairs for the weight distances between run A (the reference) and run B, as
// `compare` pairs them: each of A's checkpoint steps with B's checkpoint of the same step,
// else B's nearest (the earlier on a tie; analysis/weight_distance.h nearest_step). At most
// `max_pairs` (evenly spaced over A's steps, the first and last kept; 0: all).
struct CheckpointPair {
  int64_t step_a = 0, step_b = 0;
};
std::vector<CheckpointPair> checkpoint_pairs(const std::map<int64_t, std::string>& a,
                                             const std::map<int64_t, std::string>& b, size_t max_pairs);

// The data document the page draws (its keys: apps/report/web/report.js, top comment).
// Progress lines (checkpoint loading) go to `log` when it is not null.
nlohmann::json report_data(const std::vector<RunData>& runs, const HtmlOptions& opt, std::FILE* log = nullptr);

// The page.
std::string html_report(const std::vector<RunData>& runs, const HtmlOptions& opt, std::FILE* log = nullptr);

}  // namespace st::report
