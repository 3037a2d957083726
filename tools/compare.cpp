// compare: side-by-side training runs — aligned loss curves and Golden et al.'s weight
// divergence metrics (analysis/weight_distance.h) at the checkpoint steps the runs share.
//
//   compare RUN_A RUN_B [RUN_C ...] [-o compare.csv] [--step N] [--top K] [--diverge-tol X]
//   compare A/ckpt_00000400.bin B/ckpt_00000400.bin [...] [-o compare.csv] [--top K]
//
// RUN_A is the reference: every other run is compared with it. A run is a run directory
// written by `train` (metrics.jsonl, config.yaml, ckpt_NNNNNNNN.bin), or — all arguments
// alike — a checkpoint file, for one checkpoint pair (no loss curves then).
//
// What is compared, per pair (A, X):
//   loss     from metrics.jsonl, aligned by step (training lines with "loss", evaluation
//            lines with "val_loss"): the steps both have, the first step whose losses differ
//            (bitwise: same config, seed and thread count give bit-identical runs), the
//            divergence step (first step with |loss_X - loss_A| > --diverge-tol, default
//            0.05 nats), the max |delta loss| and its step, the final losses.
//   weights  at every checkpoint step both runs have (keep_checkpoints may have pruned some:
//            the console lists what each run holds), or --step N only: per weight slice of
//            analysis/slices.h (every tensor per layer, plus wq/wk/wv/wo per head)
//            w1, w1_normalized (= w1 / mean |A|) and max_abs_diff of the FP32 master weights.
//   W1 aggregate (console): the mean of w1_normalized over the model's 2-D weight matrices,
//            whole tensors only (wte, wpe and per layer qkvw, attprojw, fcw, fcprojw; the
//            per-head slices are parts of qkvw / attprojw and not counted again); per layer
//            the mean over that layer's four matrices. The slope line gives the change of the
//            aggregate per training step between consecutive shared checkpoints and the
//            least-squares slope over all of them.
//   top-K    the K matrix slices (2-D weights, per-head slices included) with the largest
//            w1_normalized at each step, with w1 and max_abs_diff.
//
// Output files (long format, a header line, shortest round-trip numbers, "nan" for NaN;
// written atomically: a temporary file renamed into place; nothing is written on an error):
//   compare.csv (-o PATH; default ./compare.csv)
//     run_a,run_b,step,tensor,layer,head,w1,w1_normalized,max_abs_diff
//     run_a is the reference's name, run_b the other run's: the run directory's name, or the
//     paths as given when two runs have the same name (checkpoint files: the name of the
//     folder holding the file). step: the checkpoint step (file mode: run A's checkpoint's
//     step). tensor/layer/head name the slice as in analysis/slices.h (layer, head empty
//     when not per layer / per head). One row per pair, shared step and slice, in that order.
//   compare_loss.csv (beside the -o file: STEM_loss.csv, so compare.csv -> compare_loss.csv;
//   run directories only)
//     step,run,loss,val_loss,loss_diff_vs_a
//     one row per run and step that run logged a loss or a val_loss at, sorted by step then
//     by run in command-line order; loss / val_loss empty where the run has none at that
//     step; loss_diff_vs_a = loss - loss of run A at the same step (0 for run A, empty when
//     either loss is missing).
//
// Bad input gives one line on stderr naming the file or field and the fix, exit status 1
// (2 for usage errors): a missing run directory or metrics.jsonl, runs of different model
// shapes (the fields that differ), no shared checkpoint step (the steps each run has),
// --step N missing in a run, a truncated or corrupt checkpoint. A run still being written is
// read as far as it is complete: an incomplete last metrics.jsonl line is skipped with a
// warning, a checkpoint under its temporary name (ckpt_NNNNNNNN.bin.tmp.PID, see
// io/checkpoint.cpp) is ignored with a note.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <new>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/slices.h"
#include "analysis/weight_distance.h"
#include "core/error.h"
#include "data/excerpt.h"

using namespace st;
namespace fs = std::filesystem;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------- small helpers

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

std::string num(double v) {  // shortest round-trip
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

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

std::vector<int64_t> keys(const std::map<int64_t, std::string>& m) {
  std::vector<int64_t> v;
  for (const auto& kv : m) v.push_back(kv.first);
  return v;
}

// ---------------------------------------------------------------- runs

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

std::string normal_path(const std::string& arg) {
  std::string p = fs::path(arg).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// The name of a run directory ("runs/a/" -> "a", "." -> the current folder's name).
std::string dir_name(const std::string& dir) {
  fs::path p(dir);
  std::string n = p.filename().string();
  if (n.empty() || n == "." || n == "..") {
    std::error_code ec;
    const fs::path abs = fs::weakly_canonical(p, ec);
    n = ec ? dir : abs.filename().string();
  }
  return n.empty() ? dir : n;
}

void read_metrics(Run& r) {
  const std::string path = (fs::path(r.path) / "metrics.jsonl").string();
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    fail(path, " is not a regular file (a directory, FIFO or device?); a run directory written",
         " by train holds metrics.jsonl as a file");
  std::ifstream f(path, std::ios::binary);
  if (!f)
    fail("no metrics.jsonl in run directory '", r.arg, "' (", path,
         " cannot be read): give a run directory written by train");
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  // Lines; the last one may be incomplete (no newline) in a run that is still running.
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  size_t last = lines.size();
  while (last > 0 && lines[last - 1].find_first_not_of(" \t\r") == std::string::npos) --last;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      if (i + 1 == last) {
        std::fprintf(stderr,
                     "compare: warning: %s line %zu is incomplete (%zu bytes, not a JSON "
                     "object); skipped (the run is still being written or was cut off)\n",
                     path.c_str(), i + 1, line.size());
        continue;
      }
      fail(path, " line ", i + 1, ": not a JSON object ('", excerpt(line, 60),
           "'); metrics.jsonl is written by train: repair or",
           " delete that line");
    }
    const bool has_loss = j.contains("loss"), has_val = j.contains("val_loss");
    if (!has_loss && !has_val) continue;  // checkpoint lines and others
    if (!j.contains("step") || !j["step"].is_number_integer())
      fail(path, " line ", i + 1, ": a loss line without an integer \"step\"; repair or delete",
           " that line");
    const int64_t step = j["step"].get<int64_t>();
    auto value = [&](const char* key) {
      const auto& v = j[key];
      if (v.is_null()) return kNaN;  // JSON has no NaN: nlohmann writes NaN/Inf as null
      if (!v.is_number())
        fail(path, " line ", i + 1, ": \"", key, "\" is not a number (", excerpt(v.dump(), 60),
             "); repair or delete that line");
      return v.get<double>();
    };
    LossPoint& p = r.metrics[step];
    if (has_loss) {
      p.has_loss = true;
      p.loss = value("loss");
    }
    if (has_val) {
      p.has_val = true;
      p.val = value("val_loss");
    }
  }
}

void list_checkpoints(Run& r) {
  static const std::regex ckpt_re("ckpt_([0-9]{8})\\.bin");
  static const std::regex tmp_re("ckpt_([0-9]{8})\\.bin\\.tmp\\..*");
  std::error_code ec;
  std::vector<std::string> temps;
  for (const auto& e : fs::directory_iterator(r.path, ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, ckpt_re)) {
      if (!e.is_regular_file(ec))
        fail(e.path().string(), " is not a regular file (a directory, FIFO or device?); a",
             " checkpoint is a file written by train: remove or rename it");
      r.ckpts[std::stoll(m[1])] = e.path().string();  // 8 digits: cannot overflow
    }
    else if (std::regex_match(name, tmp_re))
      temps.push_back(e.path().string());
  }
  if (ec) fail("cannot list run directory '", r.arg, "': ", ec.message());
  std::sort(temps.begin(), temps.end());
  for (const auto& t : temps)
    std::fprintf(stderr,
                 "compare: note: ignoring %s: a checkpoint still being written (or left by a "
                 "crashed run), not a checkpoint yet\n",
                 t.c_str());
}

void flatten(const YAML::Node& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n)
      flatten(kv.second, prefix.empty() ? kv.first.as<std::string>()
                                        : prefix + "." + kv.first.as<std::string>(), out);
  } else if (n.IsScalar()) {
    out[prefix] = n.Scalar();
  } else if (n.IsSequence()) {
    YAML::Emitter e;
    e << YAML::Flow << n;
    out[prefix] = e.c_str();
  } else {
    out[prefix] = "";
  }
}

void read_config(Run& r) {
  const fs::path p = fs::path(r.path) / "config.yaml";
  if (!fs::exists(p)) {
    std::fprintf(stderr, "compare: note: %s has no config.yaml; its model shape is checked from"
                         " its checkpoints only\n", r.arg.c_str());
    return;
  }
  r.config_path = p.string();
  if (std::error_code ec; !fs::is_regular_file(p, ec))
    fail(r.config_path, " is not a regular file (a directory, FIFO or device?); restore the",
         " config.yaml train wrote, or remove it to check shapes from the checkpoints only");
  try {
    flatten(YAML::LoadFile(r.config_path), "", r.config);
  } catch (const YAML::Exception& e) {
    fail(r.config_path, ": not valid YAML (", e.what(), "); it is written by train: restore it or",
         " delete it to check shapes from the checkpoints only");
  }
}

const char* const kShapeKeys[] = {"n_layer", "n_head", "n_embd", "max_seq_len", "vocab_size"};

// Model-shape check from config.yaml, before any checkpoint is read.
void check_config_shapes(const Run& a, const Run& b) {
  if (a.config_path.empty() || b.config_path.empty()) return;
  std::string diff;
  for (const char* k : kShapeKeys) {
    const std::string key = std::string("model.") + k;
    const auto ia = a.config.find(key), ib = b.config.find(key);
    if (ia == a.config.end() || ib == b.config.end() || ia->second == ib->second) continue;
    diff += (diff.empty() ? "" : ", ") + std::string(k) + " " + ia->second + " vs " + ib->second;
  }
  if (!diff.empty())
    fail("runs '", a.name, "' and '", b.name, "' have different model shapes: ", diff, " (",
         a.config_path, ", ", b.config_path, "); compare runs of one model config");
}

void check_ckpt_shapes(const Run& a, const std::string& fa, const GPT2Config& ca, const Run& b,
                       const std::string& fb, const GPT2Config& cb) {
  std::string diff;
  auto field = [&](const char* k, int va, int vb) {
    if (va != vb)
      diff += (diff.empty() ? "" : ", ") + std::string(k) + " " + std::to_string(va) + " vs " +
              std::to_string(vb);
  };
  field("n_layer", ca.n_layer, cb.n_layer);
  field("n_head", ca.n_head, cb.n_head);
  field("n_embd", ca.n_embd, cb.n_embd);
  field("max_seq_len", ca.max_seq_len, cb.max_seq_len);
  field("vocab_size", ca.vocab_size, cb.vocab_size);
  field("padded_vocab_size", ca.vp(), cb.vp());
  if (!diff.empty())
    fail("runs '", a.name, "' and '", b.name, "' have different model shapes: ", diff, " (", fa,
         ", ", fb, "); compare runs of one model config");
}

// Keys whose values differ between two configs (run.name and run.out_dir left out).
std::vector<std::string> config_diffs(const Run& a, const Run& b) {
  std::vector<std::string> out;
  if (a.config_path.empty() || b.config_path.empty()) return out;
  std::set<std::string> all;
  for (const auto& kv : a.config) all.insert(kv.first);
  for (const auto& kv : b.config) all.insert(kv.first);
  for (const auto& k : all) {
    if (k == "run.name" || k == "run.out_dir") continue;
    const auto ia = a.config.find(k), ib = b.config.find(k);
    const std::string va = ia == a.config.end() ? "(unset)" : ia->second;
    const std::string vb = ib == b.config.end() ? "(unset)" : ib->second;
    if (va != vb) out.push_back(k + " " + (va.empty() ? "''" : va) + " vs " + (vb.empty() ? "''" : vb));
  }
  return out;
}

// ---------------------------------------------------------------- loss comparison

struct LossSummary {
  int64_t shared = 0, first_step = 0, last_step = 0;
  int64_t first_diff = -1, diverge = -1, max_step = -1;
  double max_abs = 0;
  int64_t val_shared = 0, val_first_diff = -1;
  double val_max_abs = 0;
};

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

// ---------------------------------------------------------------- weights

struct PairResult {
  std::vector<int64_t> steps;                              // compared checkpoint steps
  std::map<int64_t, std::vector<DistanceRow>> rows;        // per step, in slice order
  std::vector<WeightSlice> slices;                         // weight_slices(config, true)
};

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

// ---------------------------------------------------------------- output

void write_atomically(const std::string& path, const std::string& text, std::string& tmp_out) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("cannot write ", path, " (temporary ", tmp, "): ", std::strerror(errno),
                 "; give a writable -o path");
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      fail("cannot write ", path, " (temporary ", tmp, "): write failed (disk full?)");
    }
  }
  tmp_out = tmp;
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "compare: usage error: %s (compare RUN_A RUN_B [RUN_C ...] [-o FILE] "
               "[--step N] [--top K]; --help for more)\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"compare: loss curves and weight distances (W1, max |dW|) between training runs;"
               " the first run is the reference"};
  std::vector<std::string> args;
  std::string out_csv = "compare.csv";
  int64_t only_step = -1;
  int top_k = 5;
  double tol = 0.05;
  app.add_option("runs", args, "run directories (or checkpoint files); the first is the reference");
  app.add_option("-o,--output", out_csv, "weight-distance CSV; the loss CSV goes beside it as"
                 " STEM_loss.csv")->capture_default_str();
  app.add_option("--step", only_step, "compare the checkpoints of this step only");
  app.add_option("--top", top_k, "slices listed per checkpoint step, by w1_normalized")
      ->capture_default_str();
  app.add_option("--diverge-tol", tol, "divergence step: first step with |delta loss| above this"
                 " (nats)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(one_line(e.what()));
  }
  if (app.count("--step") && only_step < 0)
    return usage_error("--step " + std::to_string(only_step) + ": a step is >= 0");
  if (top_k < 0) return usage_error("--top " + std::to_string(top_k) + ": give K >= 0");
  if (!(tol > 0) || !std::isfinite(tol))
    return usage_error("--diverge-tol " + num(tol) + ": give a finite tolerance > 0 (nats)");
  if (args.size() < 2)
    return usage_error(args.empty() ? "no runs given; give at least two run directories"
                                    : "one run given; give at least two run directories (the"
                                      " first is the reference)");

  try {
    // ---- inputs: all run directories or all checkpoint files
    std::vector<Run> runs(args.size());
    int n_dirs = 0, n_files = 0;
    for (size_t i = 0; i < args.size(); ++i) {
      Run& r = runs[i];
      r.arg = args[i];
      r.path = normal_path(args[i]);
      if (fs::is_directory(r.path)) {
        ++n_dirs;
      } else if (fs::is_regular_file(r.path)) {
        ++n_files;
      } else {
        fail("run directory '", r.arg, "' not found: give run directories written by train (or",
             " checkpoint files)");
      }
    }
    if (n_dirs && n_files)
      return usage_error("mixed run directories and files: give all run directories or all"
                         " checkpoint files");
    const bool file_mode = n_files > 0;
    if (file_mode && only_step >= 0)
      return usage_error("--step applies to run directories; with checkpoint files drop --step");

    // Names: directory names (checkpoint files: their folder's name); the paths when two clash.
    std::set<std::string> seen;
    bool clash = false;
    for (Run& r : runs) {
      r.name = file_mode ? dir_name(fs::path(r.path).parent_path().empty()
                                        ? std::string(".")
                                        : fs::path(r.path).parent_path().string())
                         : dir_name(r.path);
      clash |= !seen.insert(r.name).second;
    }
    if (clash)
      for (Run& r : runs) r.name = r.path;
    {
      std::set<std::string> paths;
      for (const Run& r : runs)
        if (!paths.insert(r.path).second)
          return usage_error("'" + r.arg + "' is given twice; give distinct runs");
    }

    const std::string loss_csv = [&] {
      const fs::path o(out_csv);
      return (o.parent_path() / (o.stem().string() + "_loss" + o.extension().string())).string();
    }();

    Run& A = runs[0];
    std::vector<PairResult> pairs(runs.size());  // index k: A vs runs[k] (k >= 1)
    std::map<std::string, GPT2Config> file_config;  // file mode: config of each file

    if (!file_mode) {
      for (Run& r : runs) {
        read_metrics(r);
        read_config(r);
        list_checkpoints(r);
      }
      for (size_t k = 1; k < runs.size(); ++k) check_config_shapes(A, runs[k]);
      // Steps per pair.
      for (size_t k = 1; k < runs.size(); ++k) {
        const Run& X = runs[k];
        if (only_step >= 0) {
          for (const Run* r : std::vector<const Run*>{&A, &X})
            if (!r->ckpts.count(only_step))
              fail("--step ", only_step, ": run '", r->name, "' has no checkpoint of step ",
                   only_step, " (", r->name, " has ", step_list(keys(r->ckpts)),
                   "); pick a step both runs have");
          pairs[k].steps = {only_step};
        } else {
          for (const auto& kv : A.ckpts)
            if (X.ckpts.count(kv.first)) pairs[k].steps.push_back(kv.first);
          if (pairs[k].steps.empty())
            fail("runs '", A.name, "' and '", X.name, "' share no checkpoint step (", A.name,
                 " has ", step_list(keys(A.ckpts)), "; ", X.name, " has ",
                 step_list(keys(X.ckpts)), "); compare runs checkpointed at the same steps",
                 " (train.ckpt_every, train.keep_checkpoints)");
        }
      }
      // Outputs must not land on an input.
      for (const Run& r : runs)
        for (const std::string& o : {out_csv, loss_csv}) {
          std::error_code ec;
          const fs::path op(o);
          if (fs::exists(op, ec) && (fs::equivalent(op, fs::path(r.path) / "metrics.jsonl", ec) ||
                                     fs::equivalent(op, fs::path(r.path) / "config.yaml", ec)))
            fail("output ", o, " is an input file of run '", r.name, "'; give another -o path");
        }

      // Checkpoints, step by step: run A's weights loaded once per step.
      std::set<int64_t> all_steps;
      for (size_t k = 1; k < runs.size(); ++k)
        all_steps.insert(pairs[k].steps.begin(), pairs[k].steps.end());
      // A checkpoint that cannot be read: the loader's message names the file.
      auto load = [&](const std::string& f) {
        try {
          return load_checkpoint_weights(f);
        } catch (const Error& e) {
          fail(e.what(), only_step >= 0 ? "" : "; to skip it, compare one other shared step with --step N");
        }
      };
      for (const int64_t step : all_steps) {
        const std::string fa = A.ckpts.at(step);
        const CheckpointWeights wa = load(fa);
        if (wa.step != step)
          std::fprintf(stderr, "compare: warning: %s holds step %lld (file name says %lld);"
                       " aligned by the file name\n", fa.c_str(), (long long)wa.step,
                       (long long)step);
        for (size_t k = 1; k < runs.size(); ++k) {
          PairResult& p = pairs[k];
          if (!std::binary_search(p.steps.begin(), p.steps.end(), step)) continue;
          const std::string fx = runs[k].ckpts.at(step);
          const CheckpointWeights wx = load(fx);
          if (wx.step != step)
            std::fprintf(stderr, "compare: warning: %s holds step %lld (file name says %lld);"
                         " aligned by the file name\n", fx.c_str(), (long long)wx.step,
                         (long long)step);
          check_ckpt_shapes(A, fa, wa.config, runs[k], fx, wx.config);
          if (p.slices.empty()) p.slices = weight_slices(wa.config, true);
          p.rows[step] = weight_distances(wa.config, wa.master, wx.master);
        }
      }
    } else {
      const CheckpointWeights wa = load_checkpoint_weights(A.path);
      for (size_t k = 1; k < runs.size(); ++k) {
        const CheckpointWeights wx = load_checkpoint_weights(runs[k].path);
        check_ckpt_shapes(A, A.path, wa.config, runs[k], runs[k].path, wx.config);
        if (wx.step != wa.step)
          std::fprintf(stderr, "compare: note: %s is step %lld, %s step %lld; rows carry run"
                       " A's step\n", A.path.c_str(), (long long)wa.step, runs[k].path.c_str(),
                       (long long)wx.step);
        PairResult& p = pairs[k];
        p.steps = {wa.step};
        p.slices = weight_slices(wa.config, true);
        p.rows[wa.step] = weight_distances(wa.config, wa.master, wx.master);
      }
      for (const Run& r : runs)
        for (const std::string& o : {out_csv})
          if (std::error_code ec; fs::exists(o, ec) && fs::equivalent(o, r.path, ec))
            fail("output ", o, " is an input file; give another -o path");
    }

    // ---- files
    std::string csv = "run_a,run_b,";
    csv += kDistanceCsvHeader;
    csv += '\n';
    size_t n_rows = 0;
    for (size_t k = 1; k < runs.size(); ++k)
      for (const int64_t step : pairs[k].steps)
        for (const DistanceRow& row : pairs[k].rows.at(step)) {
          csv += csv_field(A.name) + "," + csv_field(runs[k].name) + "," +
                 distance_csv_line(step, row) + "\n";
          ++n_rows;
        }
    std::string loss_text;
    size_t n_loss_rows = 0;
    if (!file_mode) {
      loss_text = "step,run,loss,val_loss,loss_diff_vs_a\n";
      std::set<int64_t> steps;
      for (const Run& r : runs)
        for (const auto& kv : r.metrics) steps.insert(kv.first);
      for (const int64_t step : steps) {
        const auto ia = A.metrics.find(step);
        for (const Run& r : runs) {
          const auto it = r.metrics.find(step);
          if (it == r.metrics.end()) continue;
          const LossPoint& p = it->second;
          loss_text += std::to_string(step) + "," + csv_field(r.name) + ",";
          if (p.has_loss) loss_text += num(p.loss);
          loss_text += ",";
          if (p.has_val) loss_text += num(p.val);
          loss_text += ",";
          if (p.has_loss && ia != A.metrics.end() && ia->second.has_loss)
            loss_text += num(p.loss - ia->second.loss);
          loss_text += "\n";
          ++n_loss_rows;
        }
      }
    }
    std::string tmp_csv, tmp_loss;
    write_atomically(out_csv, csv, tmp_csv);
    if (!file_mode) {
      try {
        write_atomically(loss_csv, loss_text, tmp_loss);
      } catch (...) {
        std::remove(tmp_csv.c_str());
        throw;
      }
    }
    if (std::rename(tmp_csv.c_str(), out_csv.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      std::remove(tmp_csv.c_str());
      if (!tmp_loss.empty()) std::remove(tmp_loss.c_str());
      fail("cannot write ", out_csv, ": ", why);
    }
    if (!tmp_loss.empty() && std::rename(tmp_loss.c_str(), loss_csv.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      std::remove(tmp_loss.c_str());
      fail("wrote ", out_csv, " but cannot write ", loss_csv, ": ", why);
    }

    // ---- console summary
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
        if (s.shared == 0) {
          std::printf("loss:        no training step logged by both runs\n");
        } else {
          std::printf("loss:        %lld shared steps (%lld..%lld)", (long long)s.shared,
                      (long long)s.first_step, (long long)s.last_step);
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
        std::printf("\n");
        std::printf("checkpoints: %s has %s; %s has %s; compared: %s\n", A.name.c_str(),
                    step_list(keys(A.ckpts)).c_str(), X.name.c_str(),
                    step_list(keys(X.ckpts)).c_str(), step_list(p.steps).c_str());
      } else {
        std::printf("checkpoints: %s vs %s (step %lld)\n", X.path.c_str(), A.path.c_str(),
                    (long long)p.steps.front());
      }

      // Per step: aggregate, per layer, top-K.
      int n_mats = 0;
      std::vector<std::pair<int64_t, double>> agg;
      int n_layer = 0;
      for (const auto& s : p.slices) n_layer = std::max(n_layer, s.layer + 1);
      for (const int64_t step : p.steps) {
        const auto& rows = p.rows.at(step);
        const double a = w1_aggregate(p, rows, -1, &n_mats);
        agg.emplace_back(step, a);
        bool identical = true;
        for (const auto& r : rows) identical &= r.w1 == 0 && r.max_abs_diff == 0;
        std::printf("step %lld: W1 aggregate %.4e", (long long)step, a);
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
      std::printf("(W1 aggregate: mean w1_normalized over the %d whole 2-D weight matrices: wte,"
                  " wpe, qkvw/attprojw/fcw/fcprojw per layer)\n", n_mats);
    }
    std::printf("\nwrote %s (%zu rows)", out_csv.c_str(), n_rows);
    if (!file_mode) std::printf(" and %s (%zu rows)", loss_csv.c_str(), n_loss_rows);
    std::printf("\n");
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "compare: error: out of memory while loading checkpoints (compare fewer"
                         " runs at once, or free memory)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare: error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
  return 0;
}
