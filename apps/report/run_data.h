// Reading a run directory for `report` (formats: docs/run_files.md). Every file but the
// directory itself and metrics.jsonl is optional: a missing one leaves a one-line note that
// the report prints in its place (one that is there but not a regular file, or unreadable,
// is an error). CSV files are read by their header
// (columns in any order; an empty layer / head field is -1, an empty number NaN); a last
// line without its newline is a run still writing and is skipped, as is a JSON line that
// does not parse. Every other hook-CSV row is checked: field count, each field parsed whole,
// step >= 0, layer / head indices below the run's model.n_layer / n_head (config.yaml, whose
// shape keys are checked against train's bounds); a bad row throws st::Error naming
// file:line and the field.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace st::report {

struct CsvTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;  // each has header.size() fields
  std::vector<size_t> line_no;                 // rows[i]'s line in the file (from 1)
  size_t skipped_incomplete = 0;  // a last line without a newline
  size_t skipped_bad = 0;         // always 0: a line with the wrong number of fields throws
  int col(const std::string& name) const;  // -1 when absent
};
// Throws st::Error naming the path when the file is not a regular file, cannot be read or
// has no header, and naming path:line when a line has another number of fields than the
// header (a last line without its newline is skipped: the run is still writing).
CsvTable read_csv(const std::string& path);
// Splits one CSV line (no quoting beyond stripping surrounding double quotes).
std::vector<std::string> split_csv_line(const std::string& line);

// One number from a CSV field: NaN for an empty or unparsable field.
double to_num(const std::string& s);
// A layer / head field: -1 when empty.
int to_index(const std::string& s);

struct SpectralRow {
  int64_t step = 0;
  int layer = -1, head = -1;
  std::string matrix;
  double sigma = 0;
};
struct AttnRow {
  int64_t step = 0;
  int layer = -1, head = -1;
  std::string stat;
  double value = 0;
};
struct DriftRow {
  int64_t step = 0;
  int layer = -1, head = -1;
  double drift = 0, cum = 0, abs_err = 0, dwq_err_norm = 0, dwq_rel_err = 0, cos_prev = 0;
};
struct GradRow {  // grad_norms.csv
  int64_t step = 0;
  std::string tensor;
  int layer = -1, head = -1;
  double norm = 0;
};
struct DistRow {  // wasserstein.csv, or computed from two runs' checkpoints
  int64_t step = 0;
  std::string tensor;
  int layer = -1, head = -1;
  double w1 = 0, w1_normalized = 0, max_abs_diff = 0;
};
struct Event {
  int64_t step = 0;
  std::string event, metric, action;
  double value = 0, mean = 0, std = 0, z = 0;
  std::string raw;  // the JSON line, for hover text
};

// An optional file: present (and parsed) or a note saying why not.
struct FileState {
  bool present = false;
  std::string note;  // "no spectral.csv: ..." / parse trouble / skipped-line remarks
};

struct RunData {
  std::string dir;   // as given
  std::string name;  // run.name from config.yaml, else the directory's name
  // config.yaml: "section.key" -> value as text (only scalars); empty when absent.
  std::map<std::string, std::string> config;
  std::string config_note;

  // metrics.jsonl
  std::vector<int64_t> steps;
  std::vector<double> loss, lr, grad_norm, loss_scale;
  std::vector<bool> skipped;
  std::vector<int64_t> val_steps;
  std::vector<double> val_loss;
  std::string metrics_note;  // skipped lines
  size_t metrics_records = 0;  // readable lines (a JSON object with a step)
  // Lines skipped in metrics.jsonl and events.jsonl, one remark per file naming its path
  // and the count: `report` prints them on the console as well as in the page.
  std::vector<std::string> skipped_lines;

  std::map<int64_t, std::string> checkpoints;  // step -> path (ckpt_NNNNNNNN.bin)

  std::vector<Event> events;
  FileState events_state;
  std::vector<SpectralRow> spectral;
  FileState spectral_state;
  std::vector<AttnRow> attn;
  FileState attn_state;
  std::vector<DriftRow> drift;
  FileState drift_state;
  std::vector<GradRow> grad;
  FileState grad_state;
  std::vector<DistRow> wasserstein;
  FileState wasserstein_state;

  std::string cfg(const std::string& key, const std::string& fallback = "") const;
  int n_layer() const;  // from the config, else the data; 0 when unknown
  int n_head() const;
};

// Values over steps keyed by (layer, head), from any of the row types above: rows that
// pass `keep`, sorted by step; a step written twice (a resumed run) keeps its last value.
struct XY {
  std::vector<double> x, y;
};
using SeriesByKey = std::map<std::pair<int, int>, XY>;
template <class Row, class Keep, class Value>
SeriesByKey series_by_key(const std::vector<Row>& rows, Keep keep, Value value) {
  std::map<std::pair<int, int>, std::map<int64_t, double>> m;
  for (const Row& r : rows)
    if (keep(r)) m[{r.layer, r.head}][r.step] = value(r);
  SeriesByKey out;
  for (const auto& [k, pts] : m) {
    XY& xy = out[k];
    for (const auto& [s, v] : pts) {
      xy.x.push_back(static_cast<double>(s));
      xy.y.push_back(v);
    }
  }
  return out;
}
SeriesByKey spectral_series(const RunData& r, const std::string& matrix);

// Loads a run directory. Throws st::Error (one line, naming the path) when the directory
// does not exist or has no readable metrics.jsonl; every other file is optional.
RunData load_run(const std::string& dir);

// "(the run had hooks.every: 0)" and the like: why a hook file may be missing.
std::string hooks_hint(const RunData& r, const std::string& file);

}  // namespace st::report
