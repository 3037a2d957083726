// compare: side-by-side training runs — aligned loss curves and Golden et al.'s weight
// divergence metrics (analysis/weight_distance.h) at the checkpoint steps the runs share, or
// the nearest ones. Any two runs with a metrics.jsonl compare: the losses always.
//
//   compare RUN_A RUN_B [RUN_C ...] [-o compare.csv] [--step N] [--max-step-gap N] [--top K]
//           [--diverge-tol X]
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
//            0.05 nats), the max |delta loss| and its step, the final losses. Runs of
//            different lengths compare over the steps both logged; the console names each
//            run's range and gives both losses at the last shared step.
//   weights  at every checkpoint of run A (or --step N only), paired with the other run's
//            checkpoint of the same step ("exact") or, when it has none, with its checkpoint
//            nearest in steps ("nearest"; the earlier one on a tie), at most --max-step-gap
//            steps away (default: any; 0: exact pairs only). keep_checkpoints may have pruned
//            some: the console lists what each run holds, the pairs compared, how many are
//            exact and nearest, and the largest gap. A nearest pair's W1 also holds the
//            weights' own change over the gap. Per weight slice of analysis/slices.h (every
//            tensor per layer, plus wq/wk/wv/wo per head) w1, w1_normalized (= w1 / mean |A|)
//            and max_abs_diff of the FP32 master weights. Weights are not compared, the
//            losses still are (one console line says why, exit status 0), when either run has
//            no checkpoint, when no checkpoint is within --max-step-gap, or when the runs have
//            different model shapes (config.yaml, or the checkpoints where a run has none).
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
//     run_a,run_b,step,step_a,step_b,pairing,tensor,layer,head,w1,w1_normalized,max_abs_diff
//     run_a is the reference's name, run_b the other run's: the run directory's name, or the
//     paths as given when two runs have the same name (checkpoint files: the name of the
//     folder holding the file). step_a, step_b: the two checkpoints' steps; step = step_a;
//     pairing: exact (step_a = step_b), nearest (step_b is run B's checkpoint nearest to
//     step_a) or, for two checkpoint files, given (their steps differ). tensor/layer/head
//     name the slice as in analysis/slices.h (layer, head -1 when not per layer / per head).
//     One row per pair of runs, checkpoint pair and slice, in that order; only the header
//     when no weights were compared.
//   compare_loss.csv (beside the -o file: STEM_loss.csv, so compare.csv -> compare_loss.csv;
//   run directories only)
//     step,run,loss,val_loss,loss_diff_vs_a
//     one row per run and step that run logged a loss or a val_loss at, sorted by step then
//     by run in command-line order; loss / val_loss empty where the run has none at that
//     step; loss_diff_vs_a = loss - loss of run A at the same step (0 for run A, empty when
//     either loss is missing: outside the steps both runs logged).
//
// Bad input gives one line on stderr naming the file or field and the fix, exit status 1
// (2 for usage errors): a missing run directory or metrics.jsonl, --step N that run A has no
// checkpoint of or whose pair cannot be compared (no checkpoint of the other run within
// --max-step-gap, different model shapes), two checkpoint files of different model shapes,
// a truncated or corrupt checkpoint. A run still being written is read as far as it is
// complete: an incomplete last metrics.jsonl line is skipped with a warning, a checkpoint
// under its temporary name (ckpt_NNNNNNNN.bin.tmp.PID, see io/checkpoint.cpp) is ignored
// with a note.
//
// This file: the command line, the inputs (run directories or checkpoint files, their
// names) and the checkpoint loading; apps/compare/ holds the rest: runs.cpp reads the runs,
// summary.cpp compares losses and prints the console summary, output.cpp writes the files.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <new>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "analysis/slices.h"
#include "analysis/weight_distance.h"
#include "core/error.h"
#include "apps/compare/compare.h"

using namespace st;
using namespace st::compare_tool;
namespace fs = std::filesystem;

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
  int64_t max_gap = -1;
  app.add_option("--step", only_step, "compare run A's checkpoint of this step only (with the"
                 " other run's checkpoint of that step, else its nearest)");
  app.add_option("--max-step-gap", max_gap, "pair a checkpoint of run A with the other run's"
                 " nearest checkpoint only if their steps differ by at most N (0: exact steps"
                 " only; default: any gap)");
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
  if (app.count("--max-step-gap") && max_gap < 0)
    return usage_error("--max-step-gap " + std::to_string(max_gap) + ": give N >= 0 (0: exact"
                       " steps only)");
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
    if (file_mode && app.count("--max-step-gap"))
      return usage_error("--max-step-gap applies to run directories; with checkpoint files drop"
                         " --max-step-gap");

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
      // Checkpoint pairs per pair of runs: each of run A's checkpoints (or --step N) with the
      // other run's checkpoint of the same step, else its nearest within --max-step-gap.
      for (size_t k = 1; k < runs.size(); ++k) {
        const Run& X = runs[k];
        PairResult& p = pairs[k];
        if (only_step >= 0 && !A.ckpts.count(only_step))
          fail("--step ", only_step, ": run '", A.name, "' has no checkpoint of step ", only_step,
               " (", A.name, " has ", step_list(keys(A.ckpts)), "); pick a step of run A's");
        const std::string shape = config_shape_diff(A, X);
        if (!shape.empty()) {
          if (only_step >= 0)
            fail("--step ", only_step, ": runs '", A.name, "' and '", X.name,
                 "' have different model shapes: ", shape, "; drop --step to compare their losses");
          p.not_compared = "different model shapes: " + shape;
          continue;
        }
        if (A.ckpts.empty() || X.ckpts.empty()) {
          const Run& none = A.ckpts.empty() ? A : X;
          const std::string who =
              A.ckpts.empty() && X.ckpts.empty()
                  ? "neither run has a checkpoint (no ckpt_NNNNNNNN.bin in " + A.path + " or " +
                        X.path + ")"
                  : "run '" + none.name + "' has no checkpoint (no ckpt_NNNNNNNN.bin in " +
                        none.path + ")";
          if (only_step >= 0) fail("--step ", only_step, ": ", who);
          p.not_compared = who;
          continue;
        }
        for (const auto& kv : A.ckpts) {
          if (only_step >= 0 && kv.first != only_step) continue;
          const int64_t b = nearest_step(X.ckpts, kv.first, max_gap);
          if (b < 0)
            p.too_far.push_back(kv.first);
          else
            p.steps.push_back({kv.first, b});
        }
        if (p.steps.empty()) {
          const std::string why = "no checkpoint of '" + X.name + "' within --max-step-gap " +
                                  std::to_string(max_gap) + " of one of '" + A.name + "' (" +
                                  A.name + " has " + step_list(keys(A.ckpts)) + "; " + X.name +
                                  " has " + step_list(keys(X.ckpts)) + ")";
          if (only_step >= 0) fail("--step ", only_step, ": ", why);
          p.not_compared = why;
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
        for (const StepPair& sp : pairs[k].steps) all_steps.insert(sp.a);
      // A checkpoint that cannot be read: the loader's message names the file.
      auto load = [&](const std::string& f, int64_t step) {
        CheckpointWeights w;
        try {
          w = load_checkpoint_weights(f);
        } catch (const Error& e) {
          fail(e.what(), only_step >= 0 ? "" : "; to skip it, compare one other step with --step N");
        }
        if (w.step != step)
          std::fprintf(stderr, "compare: warning: %s holds step %lld (file name says %lld);"
                       " aligned by the file name\n", f.c_str(), (long long)w.step,
                       (long long)step);
        return w;
      };
      for (const int64_t step : all_steps) {
        bool needed = false;  // not when a pair met different shapes at an earlier step
        for (size_t k = 1; k < runs.size(); ++k)
          for (const StepPair& sp : pairs[k].steps) needed |= sp.a == step;
        if (!needed) continue;
        const std::string fa = A.ckpts.at(step);
        const CheckpointWeights wa = load(fa, step);
        for (size_t k = 1; k < runs.size(); ++k) {
          PairResult& p = pairs[k];
          const auto sp = std::find_if(p.steps.begin(), p.steps.end(),
                                       [&](const StepPair& x) { return x.a == step; });
          if (sp == p.steps.end() || !p.not_compared.empty()) continue;
          const std::string fx = runs[k].ckpts.at(sp->b);
          const CheckpointWeights wx = load(fx, sp->b);
          // Shapes that config.yaml did not tell apart (a run without one): losses only.
          const std::string shape = ckpt_shape_diff(fa, wa.config, fx, wx.config);
          if (!shape.empty()) {
            if (only_step >= 0)
              fail("--step ", only_step, ": runs '", A.name, "' and '", runs[k].name,
                   "' have different model shapes: ", shape, "; drop --step to compare their",
                   " losses");
            p.not_compared = "different model shapes: " + shape;
            p.steps.clear();
            p.rows.clear();
            p.too_far.clear();
            continue;
          }
          if (p.slices.empty()) p.slices = weight_slices(wa.config, true);
          p.rows[step] = weight_distances(wa.config, wa.master, wx.master);
        }
      }
    } else {
      const CheckpointWeights wa = load_checkpoint_weights(A.path);
      for (size_t k = 1; k < runs.size(); ++k) {
        const CheckpointWeights wx = load_checkpoint_weights(runs[k].path);
        const std::string shape = ckpt_shape_diff(A.path, wa.config, runs[k].path, wx.config);
        if (!shape.empty())
          fail("checkpoints '", A.path, "' and '", runs[k].path, "' have different model shapes: ",
               shape, "; compare checkpoints of one model config");
        if (wx.step != wa.step)
          std::fprintf(stderr, "compare: note: %s is step %lld, %s step %lld; rows carry run"
                       " A's step in the step column\n", A.path.c_str(), (long long)wa.step,
                       runs[k].path.c_str(), (long long)wx.step);
        PairResult& p = pairs[k];
        p.steps = {{wa.step, wx.step}};
        p.slices = weight_slices(wa.config, true);
        p.rows[wa.step] = weight_distances(wa.config, wa.master, wx.master);
      }
      for (const Run& r : runs)
        for (const std::string& o : {out_csv})
          if (std::error_code ec; fs::exists(o, ec) && fs::equivalent(o, r.path, ec))
            fail("output ", o, " is an input file; give another -o path");
    }

    // ---- files
    size_t n_rows = 0, n_loss_rows = 0;
    write_outputs(runs, pairs, file_mode, out_csv, loss_csv, n_rows, n_loss_rows);

    // ---- console summary
    print_summary(runs, pairs, file_mode, tol, top_k);
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
