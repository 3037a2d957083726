// train --config FILE.yaml [--set section.key=value ...] [--resume] [--overwrite]
// User-facing: every error is one line on stderr and a non-zero exit.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <new>

#include "train/config.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"stabletrain: train a GPT-2 model (see README.md and --help-config)"};
  std::string config_path;
  std::vector<std::string> sets;
  st::TrainOptions opt;
  bool help_config = false;
  app.add_option("--config", config_path, "YAML config file");
  app.add_option("--set", sets, "override a config key: section.key=value (repeatable)");
  app.add_flag("--resume", opt.resume, "continue from the newest checkpoint in run.out_dir");
  app.add_flag("--overwrite", opt.overwrite, "delete an existing run directory and start over");
  app.add_option("--stop-after", opt.stop_after,
                 "stop after this many steps in total (with a checkpoint); resume later");
  app.add_flag("--help-config", help_config, "document every config key and exit");
  CLI11_PARSE(app, argc, argv);
  if (help_config) {
    std::fputs(st::config_help().c_str(), stdout);
    return 0;
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "train: --config FILE.yaml is required (see --help)\n");
    return 2;
  }
  if (opt.resume && opt.overwrite) {
    std::fprintf(stderr, "train: --resume and --overwrite exclude each other\n");
    return 2;
  }
  try {
    const st::Config cfg = st::load_config(config_path, sets);
    const st::TrainResult r = st::run_training(cfg, opt);
    if (r.stop_signal) return 128 + r.stop_signal;  // as a shell reports a signal's end
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "train: error: out of memory while setting up or training the run (lower"
                         " model.* sizes or train.batch_size / seq_len, or free memory)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
