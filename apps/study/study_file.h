// study (apps/study.cpp), internal: the study file (docs/studies.md) read, every override
// checked by the config loader itself (train/config.h: parse_config with --set overrides), and
// resolved into the list of runs with the exact `--set` arguments each gets. Not used outside
// the study executable and its test.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace st::study_tool {

// One `section.key=value` override as the study file gives it.
struct Override {
  std::string key, value;
};

struct StudyRun {
  std::string name;
  std::vector<Override> sets;  // the study's choices: `set:`, then the axis values or the run's `set:`
  std::vector<std::string> args;  // every --set train gets: sets, then the keys the study owns
  std::string dir;                // OUT/NAME (run.out_dir)
  std::string config_yaml;        // config_to_yaml of base + args: what its config.yaml must hold
  int64_t max_steps = 0;
};

struct Study {
  std::string file;     // the study file as given
  std::string base;     // the base config, as given (relative to the working directory)
  std::string out_dir;  // as given (or --out), without a trailing '/'
  std::vector<std::string> axis_keys;  // in file order
  int n_explicit = 0;                  // runs from runs:
  int checkpoints = 8;
  int ckpt_every = 0;  // train.ckpt_every of every run
  int jobs = 1;        // runs trained at once (jobs:, or study --jobs); the reference first
                       // and alone when reference_hooks
  std::string reference;       // run name
  bool reference_hooks = false;  // hooks.reference_run = OUT/REFERENCE on the other runs
  std::vector<StudyRun> runs;  // in the order they run: the reference first
  // compare and report (the keys under compare: and report:)
  bool compare = true;
  double diverge_tol = 0;  // 0: compare's default
  int top = -1;            // -1: compare's default
  bool report = true;
  int max_checkpoints = 0;  // 0: report's default
  bool read_checkpoints = true;
};

// Reads and checks STUDY.yaml; `out_override` (--out) replaces out_dir when not empty.
// Throws st::Error, one line naming the file (and line) and the key, before anything runs.
Study load_study(const std::string& path, const std::string& out_override);

// The resolved study as a study file (every run listed under runs: with its overrides):
// written to OUT/study.yaml, and `study OUT/study.yaml` runs the same runs.
std::string resolved_study_yaml(const Study& s);

// "section.key" -> value text for every scalar of a config YAML (config_to_yaml output).
std::map<std::string, std::string> flatten_config(const std::string& yaml);

}  // namespace st::study_tool
