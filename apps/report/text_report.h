// `report --text`: the spectral-norm table of one run for the terminal.
#pragma once
#include <string>

#include "apps/report/run_data.h"

namespace st::report {

// Per (layer, head) sigma of the per-head matrix `matrix` (wq, wk, wv or wo) at its first
// and last hook step and the growth last/first, largest last sigma first (at most `top`
// rows; 0: all), then the per-layer matrices (qkvw, attprojw, fcw, fcprojw, wte, wpe).
// Aligned columns. Throws st::Error (naming the run) when the run has no spectral.csv or
// no row of `matrix`.
std::string text_report(const RunData& r, const std::string& matrix, int top);

}  // namespace st::report
