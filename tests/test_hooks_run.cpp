// The stability hooks in real training runs of a tiny model: the files and their
// consistency, exact continuation across a resume, spectral norms against numpy's SVD of
// the checkpointed weights, spike events / snapshots / skips, the reference-run distances,
// and bad hook settings.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "analysis/slices.h"
#include "core/rng.h"
#include "test_util.h"
#include "io/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace st;
using st::test::slurp;

namespace {

const fs::path& tmp_root() { return st::test::scratch_root("st_hooks_run_test_"); }

std::string text_file() { return st::test::pseudo_text_file(tmp_root() / "text.txt"); }

// 2 layers x 2 heads, BF16, flash attention; hooks every 5 steps, checkpoints every 10.
Config config(const std::string& name, const std::vector<std::string>& sets = {}) {
  std::ostringstream y;
  y << "run: {name: " << name << ", out_dir: '" << (tmp_root() / name).string() << "', seed: 7}\n"
    << "model: {n_layer: 2, n_head: 2, n_embd: 32, max_seq_len: 32, vocab_size: 256}\n"
    << "data: {train_path: '" << text_file() << "', tokenizer: byte, val_fraction: 0.1}\n"
    << "train: {max_steps: 20, batch_size: 4, seq_len: 32, grad_accum_steps: 2, lr: 3.0e-3,"
    << " min_lr: 3.0e-4, warmup_steps: 3, ckpt_every: 10, keep_checkpoints: 0, eval_every: 10,"
    << " eval_batches: 2, log_every: 5, sample_tokens: 0}\n"
    << "precision: {compute: bf16}\n"
    << "attention: {backend: flash, block_q: 16, block_k: 16}\n"
    << "hooks: {every: 5}\n"
    << "device: cpu\n";
  return parse_config(y.str(), name + ".yaml", sets);
}

TrainOptions quiet() {
  TrainOptions o;
  o.console = false;
  return o;
}

using Row = std::map<std::string, std::string>;
std::vector<Row> read_csv(const fs::path& p) {
  std::ifstream f(p);
  std::string line;
  std::vector<std::string> cols;
  std::vector<Row> rows;
  auto split = [](const std::string& s) {
    std::vector<std::string> v;
    std::string cur;
    for (char c : s) {
      if (c == ',') {
        v.push_back(cur);
        cur.clear();
      } else {
        cur.push_back(c);
      }
    }
    v.push_back(cur);
    return v;
  };
  if (!std::getline(f, line)) return rows;
  cols = split(line);
  while (std::getline(f, line)) {
    const auto v = split(line);
    EXPECT_EQ(v.size(), cols.size()) << p << ": " << line;
    Row r;
    for (size_t i = 0; i < cols.size() && i < v.size(); ++i) r[cols[i]] = v[i];
    rows.push_back(r);
  }
  return rows;
}

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::vector<nlohmann::json> v;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);) v.push_back(nlohmann::json::parse(line));
  return v;
}


const char* const kHookFiles[] = {"spectral.csv", "grad_norms.csv", "attn_stats.csv",
                                  "delta_drift.csv"};

TEST(HooksRun, FilesAreCompleteAndConsistent) {
  const Config c = config("files");
  const TrainResult res = run_training(c, quiet());
  const fs::path d = c.run.out_dir;
  const GPT2Config mc = model_config(c);
  const auto slices = weight_slices(mc, true);
  size_t matrices = 0;
  for (const auto& s : slices) matrices += s.rows > 1 && s.cols > 1;
  const std::vector<int> hook_steps{5, 10, 15, 20};

  // spectral.csv: every matrix at step 0 (initial weights) and at every hook step, converged.
  const auto spec = read_csv(d / "spectral.csv");
  ASSERT_EQ(spec.size(), matrices * (hook_steps.size() + 1));
  std::map<std::string, int> per_step;
  for (const auto& r : spec) {
    ++per_step[r.at("step")];
    EXPECT_EQ(r.at("converged"), "1") << r.at("matrix");
    EXPECT_GT(std::stod(r.at("sigma")), 0);
  }
  EXPECT_EQ(per_step.count("0"), 1u);
  // layer / head: an integer in every row, -1 for "not per layer / head", so pandas reads
  // the columns as int64 (an empty field made them float).
  const std::regex index_re("-1|0|[1-9][0-9]*");
  for (const char* f : {"spectral.csv", "grad_norms.csv", "attn_stats.csv", "delta_drift.csv"}) {
    size_t minus_one = 0, rows = 0;
    for (const auto& r : read_csv(d / f))
      for (const char* c : {"layer", "head"}) {
        EXPECT_TRUE(std::regex_match(r.at(c), index_re)) << f << " " << c << " '" << r.at(c) << "'";
        minus_one += r.at(c) == "-1";
        ++rows;
      }
    EXPECT_GT(rows, 0u) << f;
    if (std::string(f) == "spectral.csv" || std::string(f) == "grad_norms.csv") {
      EXPECT_GT(minus_one, 0u) << f << ": no whole-model or per-layer row";
    }
  }

  // grad_norms.csv: the whole-tensor rows combine to the grad_norm of metrics.jsonl.
  std::map<int, double> metric_gnorm;
  for (const auto& j : read_jsonl(d / "metrics.jsonl"))
    if (j.contains("grad_norm")) metric_gnorm[j["step"].get<int>()] = j["grad_norm"].get<double>();
  std::map<int, double> ss;
  for (const auto& r : read_csv(d / "grad_norms.csv"))
    if (r.at("head") == "-1") ss[std::stoi(r.at("step"))] += std::pow(std::stod(r.at("norm")), 2);
  ASSERT_EQ(ss.size(), hook_steps.size());
  for (const auto& [step, s2] : ss)
    EXPECT_NEAR(std::sqrt(s2), metric_gnorm.at(step), 1e-9 * metric_gnorm.at(step)) << step;

  // attn_stats.csv: 6 statistics per layer and head per hook step, sane ranges.
  const auto st = read_csv(d / "attn_stats.csv");
  EXPECT_EQ(st.size(), hook_steps.size() * 2 * 2 * 6);
  // A normalised P of 1 is the row's unique maximum, whose P~ is exp(0) = 1 in the tile that
  // set the running max: p_tilde_one >= p_one for each (step, layer, head).
  std::map<std::string, std::map<std::string, double>> ones;
  for (const auto& r : st) {
    const double v = std::stod(r.at("value"));
    if (r.at("stat") == "p_one" || r.at("stat") == "p_tilde_one")
      ones[r.at("step") + "." + r.at("layer") + "." + r.at("head")][r.at("stat")] = v;
    if (r.at("stat") == "tied_row_frac" || r.at("stat") == "tied_in_tile_frac") {
      EXPECT_GE(v, 0);
      EXPECT_LE(v, 1);
    }
    if (r.at("stat") == "entropy") {
      EXPECT_GT(v, 0);
      EXPECT_LE(v, std::log(32.0) + 1e-9);  // at most log(keys)
    }
  }
  EXPECT_EQ(ones.size(), hook_steps.size() * 2 * 2);
  for (const auto& [key, o] : ones) {
    ASSERT_EQ(o.size(), 2u) << key;
    EXPECT_GE(o.at("p_tilde_one"), o.at("p_one")) << key;
  }

  // delta_drift.csv: one row per layer and head per hook step; the running sum is the sum
  // of the drifts; a BF16 flash run has a nonzero error; cosines in [-1, 1].
  const auto dd = read_csv(d / "delta_drift.csv");
  ASSERT_EQ(dd.size(), hook_steps.size() * 2 * 2);
  std::map<std::string, double> cum;
  for (const auto& r : dd) {
    const std::string key = r.at("layer") + "." + r.at("head");
    cum[key] += std::stod(r.at("delta_drift"));
    EXPECT_EQ(std::stod(r.at("delta_drift_cum")), cum[key]) << r.at("step") << " " << key;
    EXPECT_GT(std::stod(r.at("delta_abs_err")), 0);
    EXPECT_GT(std::stod(r.at("dwq_err_norm")), 0);
    if (r.at("step") == "5") {
      EXPECT_TRUE(r.at("dwq_cos_prev").empty());
    } else {
      const double cs = std::stod(r.at("dwq_cos_prev"));
      EXPECT_LE(std::abs(cs), 1 + 1e-12);
    }
  }
  EXPECT_FALSE(res.weights_sha256.empty());
  EXPECT_NE(slurp(d / "train.log").find("hooks: "), std::string::npos);
}

TEST(HooksRun, HooksDoNotChangeTraining) {
  const TrainResult with = run_training(config("with"), quiet());
  const TrainResult without = run_training(config("without", {"hooks.every=0"}), quiet());
  EXPECT_EQ(with.weights_sha256, without.weights_sha256);
  EXPECT_EQ(with.losses, without.losses);
  for (const char* f : kHookFiles) EXPECT_FALSE(fs::exists(tmp_root() / "without" / f)) << f;
}

// 10 steps, stop, resume for 10 more: every hook file equals the one of a straight run
// byte for byte (power-iteration vectors, running sums and the spike window are in the
// checkpoint).
TEST(HooksRun, ResumeContinuesEveryFileExactly) {
  const std::vector<std::string> spiky = {"train.lr=3e-2", "hooks.spike_z=2", "hooks.spike_window=4",
                                          "hooks.spike_warmup=3"};
  const Config straight = config("straight", spiky);
  run_training(straight, quiet());
  const Config part = config("resumed", spiky);
  TrainOptions o = quiet();
  o.stop_after = 10;
  run_training(part, o);
  o.stop_after = -1;
  o.resume = true;
  run_training(part, o);
  std::vector<std::string> files(std::begin(kHookFiles), std::end(kHookFiles));
  files.push_back("events.jsonl");
  for (const std::string& f : files) {
    const std::string a = slurp(fs::path(straight.run.out_dir) / f);
    EXPECT_FALSE(a.empty()) << f;
    EXPECT_EQ(a, slurp(fs::path(part.run.out_dir) / f)) << f;
  }
}

TEST(HooksRun, SpectralNormsMatchNumpySvdOfTheCheckpoints) {
  const Config c = config("svd");
  run_training(c, quiet());
  for (int step : {10, 20}) {
    const std::string cmd = "/usr/bin/python3 " ST_SCRIPTS_DIR "/check_spectral_numpy.py '" +
                            c.run.out_dir + "' " + std::to_string(step) + " 1e-4 > '" +
                            (tmp_root() / "svd.txt").string() + "' 2>&1";
    EXPECT_EQ(st::test::sh(cmd), 0) << slurp(tmp_root() / "svd.txt");
    const std::string out = slurp(tmp_root() / "svd.txt");
    std::printf("%s", out.c_str());
    EXPECT_NE(out.find("checked "), std::string::npos) << out;
  }
}

// A high learning rate and a short window make the grad norm jump (measured: z ~ 4 at
// step 9 without skips): events name the metric and the action; snapshots hold the state
// before the spike step's update and load; skipped updates do not advance Adam.
TEST(HooksRun, SpikesAreLoggedSnapshottedAndSkipped) {
  const Config c = config("spikes", {"train.lr=3e-2", "hooks.spike_z=2", "hooks.spike_window=4",
                                     "hooks.spike_warmup=3", "hooks.spike_snapshot=true",
                                     "hooks.spike_skip=true"});
  run_training(c, quiet());
  const fs::path d = c.run.out_dir;
  std::set<int> spike_steps, snap_steps;
  for (const auto& e : read_jsonl(d / "events.jsonl")) {
    const int step = e["step"].get<int>();
    if (e["event"] == "spike") {
      spike_steps.insert(step);
      EXPECT_EQ(e["action"], "snapshot+skip");
      EXPECT_GT(e["z"].get<double>(), 2.0);
      EXPECT_NEAR(e["z"].get<double>(),
                  (e["value"].get<double>() - e["mean"].get<double>()) / e["std"].get<double>(),
                  1e-9);
      EXPECT_GE(step, 4);  // spike_warmup: 3 values before the first z
    } else if (e["event"] == "snapshot") {
      snap_steps.insert(step);
      const fs::path f = d / e["file"].get<std::string>();
      const CheckpointState s = load_checkpoint(f.string());
      EXPECT_EQ(s.step, step - 1);
      EXPECT_EQ(sha256_hex(s.master.data(), s.master.size()), e["weights_sha256"]);
    }
  }
  ASSERT_FALSE(spike_steps.empty()) << "no spike at z > 1: the test needs one";
  EXPECT_EQ(spike_steps, snap_steps);
  int skipped = 0;
  for (const auto& j : read_jsonl(d / "metrics.jsonl"))
    if (j.value("spike_skipped", false)) {
      ++skipped;
      EXPECT_TRUE(spike_steps.count(j["step"].get<int>()));
    }
  EXPECT_EQ(skipped, static_cast<int>(spike_steps.size()));
  const CheckpointState last = load_checkpoint((d / checkpoint_name(20)).string());
  EXPECT_EQ(last.adam_step, 20 - skipped);
}

// hooks.reference_run: distances to the reference's same-step checkpoints; a run identical
// to its reference is at distance exactly 0; a flash run vs a baseline reference is not.
TEST(HooksRun, ReferenceRunDistances) {
  const Config ref = config("ref", {"attention.backend=baseline"});
  run_training(ref, quiet());
  const Config same = config("same", {"attention.backend=baseline", "hooks.reference_run=" + ref.run.out_dir});
  run_training(same, quiet());
  const Config flash = config("vsflash", {"hooks.reference_run=" + ref.run.out_dir});
  run_training(flash, quiet());
  const auto zero = read_csv(fs::path(same.run.out_dir) / "wasserstein.csv");
  const auto diff = read_csv(fs::path(flash.run.out_dir) / "wasserstein.csv");
  const size_t rows = weight_slices(model_config(ref), true).size() * 2;  // steps 10 and 20
  ASSERT_EQ(zero.size(), rows);
  ASSERT_EQ(diff.size(), rows);
  double max_w1 = 0;
  for (const auto& r : zero) {
    EXPECT_EQ(std::stod(r.at("w1")), 0.0) << r.at("tensor");
    EXPECT_EQ(std::stod(r.at("max_abs_diff")), 0.0) << r.at("tensor");
  }
  for (const auto& r : diff) {
    max_w1 = std::max(max_w1, std::stod(r.at("w1")));
    for (const char* c : {"layer", "head"})
      EXPECT_TRUE(std::regex_match(r.at(c), std::regex("-1|0|[1-9][0-9]*"))) << c << " '" << r.at(c) << "'";
  }
  EXPECT_GT(max_w1, 0);
}

TEST(HooksRun, BadReferenceRunIsRefusedBeforeAnythingIsWritten) {
  const Config missing = config("badref1", {"hooks.reference_run=/nonexistent/run"});
  try {
    run_training(missing, quiet());
    ADD_FAILURE() << "a missing reference run was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("hooks.reference_run"), std::string::npos) << m;
    EXPECT_NE(m.find("/nonexistent/run"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(missing.run.out_dir));
  const Config small = config("smallref", {"model.n_layer=1", "train.max_steps=2"});
  run_training(small, quiet());
  const Config other = config("badref2", {"hooks.reference_run=" + small.run.out_dir});
  try {
    run_training(other, quiet());
    ADD_FAILURE() << "a reference run of another shape was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.n_layer is 1, this run's 2"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(other.run.out_dir));
}

}  // namespace
