// `report`'s HTML page: one self-contained file (inline CSS and SVG, no scripts, no
// external resources) with a header describing the runs and five sections: loss curves,
// spectral norms, attention statistics, delta drift, weight distances between runs.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "tools/report/run_data.h"

namespace st::report {

struct HtmlOptions {
  size_t max_checkpoint_pairs = 24;  // section 5: checkpoint steps compared per run pair
  bool compare_checkpoints = true;   // section 5: read checkpoints (off: wasserstein.csv only)
  std::string generated;             // "generated ..." text in the header (e.g. a date)
};

// The page. Progress lines (checkpoint loading) go to `log` when it is not null.
std::string html_report(const std::vector<RunData>& runs, const HtmlOptions& opt, std::FILE* log = nullptr);

}  // namespace st::report
