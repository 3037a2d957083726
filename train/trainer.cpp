// The step loop. Order of one step (fixed, so runs are reproducible):
//   zero grads; for each micro-batch: next batch from the loader, forward, backward;
//   lr from the schedule; clip + AdamW (or skip on FP16 overflow); metrics line;
//   evaluation every train.eval_every; checkpoint every train.ckpt_every.
// Checkpoints hold everything that affects later steps (weights, moments, loss scale, step,
// RNG, loader position), so a resumed run continues bit for bit.
#include "train/trainer.h"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "core/backend.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/gpt2.h"
#include "model/io.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/hooks.h"

namespace fs = std::filesystem;

namespace st {

std::string checkpoint_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt_%08lld.bin", static_cast<long long>(step));
  return buf;
}

namespace {

const std::regex kCkptRe("ckpt_([0-9]{8})\\.bin");

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, kCkptRe)) v.emplace_back(std::stoll(m[1]), e.path().string());
  }
  std::sort(v.begin(), v.end());
  return v;
}

// "section.key" -> value for every scalar in a YAML document (config comparison on resume).
std::map<std::string, std::string> flatten(const std::string& yaml) {
  std::map<std::string, std::string> out;
  const YAML::Node root = YAML::Load(yaml);
  for (const auto& sec : root) {
    const std::string s = sec.first.as<std::string>();
    if (sec.second.IsMap()) {
      for (const auto& kv : sec.second)
        out[s + "." + kv.first.as<std::string>()] = kv.second.as<std::string>();
    } else {
      out[s] = sec.second.as<std::string>();
    }
  }
  return out;
}

// Keys whose change makes a resumed run a different run (model, data order, arithmetic).
bool must_match_on_resume(const std::string& key) {
  return key.rfind("model.", 0) == 0 || key.rfind("data.", 0) == 0 ||
         key == "precision.compute" || key == "run.seed" || key == "train.batch_size" ||
         key == "train.seq_len" || key == "train.grad_accum_steps" || key.rfind("attention.", 0) == 0;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      out.push_back(cur);
      cur.clear();
    } else if (ch != ' ') {
      cur.push_back(ch);
    }
  }
  if (!cur.empty() || !out.empty()) out.push_back(cur);
  return out;
}

int parse_index(const std::string& s, int limit, const std::string& where, const char* what) {
  size_t used = 0;
  int v = -1;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || v < 0 || v >= limit)
    fail(where, ": '", s, "' is not a ", what, " index in [0, ", limit, ")");
  return v;
}

}  // namespace

std::vector<AttentionConfig> attention_configs(const Config& c) {
  const AttentionSection& a = c.attention;
  AttentionConfig base;
  base.kind = parse_attention_kind(a.backend);
  base.rule = parse_rounding_rule(a.rule);
  auto fmt = [](const std::string& v) -> std::optional<DType> {
    return v == "auto" ? std::nullopt : std::optional<DType>(parse_dtype(v));
  };
  base.qkv = fmt(a.qkv);
  base.scores = fmt(a.scores);
  base.probs = fmt(a.probs);
  base.accum = fmt(a.accum);
  base.out = fmt(a.out);
  base.mac = fmt(a.mac);
  base.grads = fmt(a.grads);
  base.delta = parse_delta_mode(a.delta);
  base.block_q = a.block_q;
  base.block_k = a.block_k;
  base.beta = a.beta;
  base.tie_tol = a.tie_tol;
  base.max_shift = a.max_shift;
  std::vector<AttentionConfig> layers(c.model.n_layer, base);
  const std::string lb = c.source + ": attention.layer_backends";
  for (const std::string& item : split(a.layer_backends, ',')) {
    const auto kv = split(item, ':');
    if (kv.size() != 2) fail(lb, ": '", item, "' is not LAYER:BACKEND (e.g. 2:flash)");
    const int l = parse_index(kv[0], c.model.n_layer, lb, "layer");
    try {
      layers[l].kind = parse_attention_kind(kv[1]);
    } catch (const Error& e) {
      fail(lb, ": ", e.what());
    }
  }
  const std::string fh = c.source + ": attention.fp32_out_heads";
  for (const std::string& item : split(a.fp32_out_heads, ',')) {
    const auto lh = split(item, '.');
    if (lh.size() != 2) fail(fh, ": '", item, "' is not LAYER.HEAD (e.g. 2.8)");
    const int l = parse_index(lh[0], c.model.n_layer, fh, "layer");
    layers[l].fp32_out_heads.push_back(parse_index(lh[1], c.model.n_head, fh, "head"));
  }
  return layers;
}

namespace {

std::vector<uint8_t> tensor_bytes(Backend& be, const Tensor& t) {
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  be.copy(host, t);
  const uint8_t* p = static_cast<const uint8_t*>(host.raw());
  return std::vector<uint8_t>(p, p + host.nbytes());
}

void load_tensor_bytes(Backend& be, const Tensor& t, const std::vector<uint8_t>& bytes,
                       const char* what, const std::string& path) {
  if (bytes.size() != t.nbytes())
    fail(path, ": ", what, " holds ", bytes.size(), " bytes, the model needs ", t.nbytes(),
         " (checkpoint of a different model?)");
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(host.raw(), bytes.data(), bytes.size());
  be.copy(t, host);
}

template <class T>
std::vector<uint8_t> pod_bytes(const T& v) {
  std::vector<uint8_t> b(sizeof v);
  std::memcpy(b.data(), &v, sizeof v);
  return b;
}
template <class T>
T pod_from(const std::vector<uint8_t>& b, const char* what, const std::string& path) {
  if (b.size() != sizeof(T)) fail(path, ": ", what, " has ", b.size(), " bytes, expected ", sizeof(T));
  T v;
  std::memcpy(&v, b.data(), sizeof v);
  return v;
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const long t = std::lround(s);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

// model.init_from: the weights, checked against the config's model shape.
ModelWeights load_init_weights(const Config& cfg) {
  const std::string& path = cfg.model.init_from;
  ModelWeights w;
  try {
    w = load_weights(path, cfg.model.n_head);
  } catch (const std::exception& e) {
    fail(cfg.source, ": model.init_from: ", e.what());
  }
  const GPT2Config& f = w.config;
  const ModelSection& m = cfg.model;
  std::string diff;
  auto cmp = [&](const char* key, int file, int config) {
    if (file != config)
      diff += std::string(diff.empty() ? "" : ", ") + key + " " + std::to_string(file) +
              " (config " + std::to_string(config) + ")";
  };
  cmp("n_layer", f.n_layer, m.n_layer);
  cmp("n_head", f.n_head, m.n_head);
  cmp("n_embd", f.n_embd, m.n_embd);
  cmp("max_seq_len", f.max_seq_len, m.max_seq_len);
  cmp("vocab_size", f.vocab_size, m.vocab_size);
  if (!diff.empty())
    fail(cfg.source, ": model.init_from '", path, "' holds a different model shape: ", diff,
         " (set the model: keys to the file's values)");
  return w;
}

class Run {
 public:
  Run(const Config& cfg, const TrainOptions& opt) : cfg_(cfg), opt_(opt) {}
  TrainResult go();

 private:
  void prepare_dir();
  void open_logs();
  void build();
  void restore(const std::string& path);
  std::string save(int64_t step, double elapsed_s);
  // The state before step `step`'s update, with the loader where it stood before the step.
  void save_spike_snapshot(int64_t step, double elapsed_s, const DataLoader::State& ds);
  CheckpointState checkpoint_state(int64_t step, double elapsed_s) const;
  double evaluate();
  std::string sample();
  void write_metrics(const nlohmann::ordered_json& j);

  Config cfg_;
  TrainOptions opt_;
  std::string dir_, resume_from_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<Backend> be_;
  std::unique_ptr<GPT2> model_;
  std::unique_ptr<StabilityHooks> hooks_;
  TokenData data_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;
  std::unique_ptr<Gpt2Tokenizer> tokenizer_;  // gpt2 data: decodes the sample
  std::vector<std::string> data_notes_;        // data preparation lines, logged once open
  Rng rng_;
  int64_t step_ = 0;
  double elapsed_prev_ = 0;  // seconds from earlier invocations (resume)
  std::ofstream metrics_;
  std::string last_ckpt_ = "(none)";
};

void Run::prepare_dir() {
  dir_ = cfg_.run.out_dir;
  ST_CHECK(!dir_.empty(), "run.out_dir is empty");
  const bool exists = fs::exists(dir_);
  const bool nonempty = exists && !fs::is_empty(dir_);
  if (exists && !fs::is_directory(dir_))
    fail("run.out_dir: '", dir_, "' exists and is not a directory");
  if (opt_.resume) {
    resume_from_ = nonempty ? latest_checkpoint(dir_) : "";
    if (resume_from_.empty())
      fail("--resume: no checkpoint (ckpt_*.bin) in run directory '", dir_,
           "' (run without --resume to start it)");
    return;
  }
  if (nonempty) {
    if (!opt_.overwrite)
      fail("run directory '", dir_, "' already exists and is not empty (use --resume to "
           "continue it, --overwrite to delete it and start over, or --set run.out_dir=NEW)");
    fs::remove_all(dir_);
  }
  fs::create_directories(dir_);
}

void Run::open_logs() {
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(dir_ + "/train.log", false);
  std::vector<spdlog::sink_ptr> sinks{file};
  if (opt_.console) sinks.push_back(std::make_shared<spdlog::sinks::stdout_sink_mt>());
  log_ = std::make_shared<spdlog::logger>("train", sinks.begin(), sinks.end());
  log_->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %v");
  log_->flush_on(spdlog::level::info);
}

void Run::build() {
  check_reference_run(cfg_);
  DataSpec ds;
  ds.train_path = cfg_.data.train_path;
  ds.val_path = cfg_.data.val_path;
  ds.format = cfg_.data.format;
  ds.tokenizer = cfg_.data.tokenizer;
  ds.tokenizer_dir = cfg_.data.tokenizer_dir;
  ds.prepare_from = cfg_.data.prepare_from;
  ds.val_fraction = cfg_.data.val_fraction;
  data_ = load_token_data(ds, [this](const std::string& line) {
    data_notes_.push_back(line);
    if (opt_.console) std::printf("%s\n", line.c_str());
  });
  if (cfg_.data.tokenizer == "gpt2" && cfg_.train.sample_tokens > 0)
    tokenizer_ = std::make_unique<Gpt2Tokenizer>(cfg_.data.tokenizer_dir);
  if (cfg_.model.vocab_size < data_.vocab_size)
    fail(cfg_.source, ": model.vocab_size = ", cfg_.model.vocab_size, " is smaller than the ",
         data_.vocab_size, " tokens of data.tokenizer '", cfg_.data.tokenizer, "'");
  be_ = make_backend(cfg_.device, cfg_.run.threads);
  GPT2Config mc = model_config(cfg_);
  ModelWeights init;
  if (!cfg_.model.init_from.empty()) {
    init = load_init_weights(cfg_);
    mc.padded_vocab_size = init.config.padded_vocab_size;  // llm.c files may pad differently
  }
  const std::vector<AttentionConfig> ac = attention_configs(cfg_);
  LossScalerConfig ls;
  ls.init_scale = static_cast<float>(cfg_.precision.loss_scale_init);
  ls.growth_interval = cfg_.precision.loss_scale_growth_interval;
  model_ = std::make_unique<GPT2>(mc, *be_, parse_dtype(cfg_.precision.compute), ac, ls);
  model_->init_weights(cfg_.run.seed);
  if (!init.params.empty()) model_->set_master_fp32(init.params);
  const int B = cfg_.train.batch_size, T = cfg_.train.seq_len;
  train_loader_ = std::make_unique<DataLoader>(data_.train, B, T, cfg_.run.seed, true);
  val_loader_ = std::make_unique<DataLoader>(data_.val, B, T, cfg_.run.seed, false);
  rng_.reseed(cfg_.run.seed ^ 0x5eed5eed5eedull);
}

void Run::restore(const std::string& path) {
  const CheckpointState s = load_checkpoint(path);
  // Refuse a checkpoint of another run; report other config changes.
  const auto old_cfg = flatten(s.config_yaml), new_cfg = flatten(config_to_yaml(cfg_));
  for (const auto& [k, v] : new_cfg) {
    auto it = old_cfg.find(k);
    const std::string ov = it == old_cfg.end() ? "(absent)" : it->second;
    if (ov == v) continue;
    if (must_match_on_resume(k))
      fail("--resume: ", k, " is '", v, "' but the checkpoint ", path, " was written with '",
           ov, "' (resume with the run's own config.yaml)");
    log_->warn("resume: {} changed from '{}' to '{}'", k, ov, v);
  }
  load_tensor_bytes(*be_, model_->master_flat(), s.master, "master weights", path);
  load_tensor_bytes(*be_, model_->m_flat(), s.m, "Adam m", path);
  load_tensor_bytes(*be_, model_->v_flat(), s.v, "Adam v", path);
  model_->sync_params_from_master();
  model_->set_adam_step(static_cast<int>(s.adam_step));
  model_->loss_scaler().set_state(s.loss_scale, s.loss_scale_good_steps);
  hooks_->resume(s.step, s.hooks_state);
  rng_.set_state(pod_from<Rng::State>(s.rng_state, "rng_state", path));
  train_loader_->set_state(pod_from<DataLoader::State>(s.data_state, "data_state", path));
  step_ = s.step;
  elapsed_prev_ = s.elapsed_s;
  last_ckpt_ = path;
  // Keep the metrics of the steps the checkpoint covers; later lines are being redone.
  const std::string mpath = dir_ + "/metrics.jsonl";
  std::vector<std::string> keep;
  std::ifstream in(mpath);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::ordered_json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("step", int64_t{0}) <= step_) keep.push_back(line);
  }
  in.close();
  std::ofstream out(mpath, std::ios::trunc);
  for (const auto& l : keep) out << l << "\n";
}

CheckpointState Run::checkpoint_state(int64_t step, double elapsed_s) const {
  CheckpointState s;
  s.config_yaml = config_to_yaml(cfg_);
  s.step = step;
  s.adam_step = model_->adam_step();
  const GPT2Config& mc = model_->config();
  s.n_layer = mc.n_layer;
  s.n_head = mc.n_head;
  s.n_embd = mc.n_embd;
  s.max_seq_len = mc.max_seq_len;
  s.vocab_size = mc.vocab_size;
  s.padded_vocab_size = mc.vp();
  s.compute = cfg_.precision.compute;
  s.master_elem_bytes = static_cast<int32_t>(dtype_size(model_->master_flat().dtype()));
  s.master = tensor_bytes(*be_, model_->master_flat());
  s.m = tensor_bytes(*be_, model_->m_flat());
  s.v = tensor_bytes(*be_, model_->v_flat());
  s.loss_scale = model_->loss_scaler().scale();
  s.loss_scale_good_steps = model_->loss_scaler().good_steps();
  s.rng_state = pod_bytes(rng_.state());
  s.data_state = pod_bytes(train_loader_->state());
  s.elapsed_s = elapsed_s;
  s.hooks_state = hooks_->state();
  return s;
}

void Run::save_spike_snapshot(int64_t step, double elapsed_s, const DataLoader::State& ds) {
  CheckpointState s = checkpoint_state(step - 1, elapsed_s);
  s.data_state = pod_bytes(ds);
  char name[64];
  std::snprintf(name, sizeof name, "spike_ckpt_%08lld.bin", static_cast<long long>(step));
  const std::string sha = save_checkpoint(dir_ + "/" + name, s);
  log_->warn("step {}: spike snapshot {} (the state before this step's update; copy it to "
             "{} in a new run directory to resume from it)", step, name, checkpoint_name(step - 1));
  hooks_->event(step, "snapshot", {{"file", name}, {"weights_sha256", sha}});
}

std::string Run::save(int64_t step, double elapsed_s) {
  const CheckpointState s = checkpoint_state(step, elapsed_s);
  const std::string path = dir_ + "/" + checkpoint_name(step);
  const std::string sha = save_checkpoint(path, s);
  last_ckpt_ = path;
  log_->info("checkpoint {} (step {}), weights sha256 {}", path, step, sha);
  write_metrics({{"step", step}, {"checkpoint", checkpoint_name(step)}, {"weights_sha256", sha}});
  if (cfg_.train.keep_checkpoints > 0) {
    auto all = list_checkpoints(dir_);
    while (static_cast<int>(all.size()) > cfg_.train.keep_checkpoints) {
      fs::remove(all.front().second);
      all.erase(all.begin());
    }
  }
  hooks_->at_checkpoint(step);
  return sha;
}

double Run::evaluate() {
  const int B = cfg_.train.batch_size, T = cfg_.train.seq_len;
  std::vector<int32_t> x(B * T), y(B * T);
  val_loader_->reset();
  const int64_t n = std::min<int64_t>(cfg_.train.eval_batches,
                                      val_loader_->windows_per_epoch() / B);
  ST_CHECK(n > 0, "the validation split holds fewer than ", B, " windows of ", T + 1,
           " tokens (raise data.val_fraction or lower train.seq_len)");
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    val_loader_->next(x.data(), y.data());
    model_->forward(x.data(), y.data(), B, T);
    sum += model_->mean_loss();
  }
  return sum / static_cast<double>(n);
}

std::string Run::sample() {
  const int Vp = model_->config().vp();
  // Only ids the tokenizer can decode (model.vocab_size may be larger than GPT-2's 50257).
  const int V = tokenizer_ ? std::min(model_->config().vocab_size, tokenizer_->vocab_size())
                           : model_->config().vocab_size;
  const int maxT = std::min(model_->config().max_seq_len, cfg_.train.seq_len);
  // GPT-2 samples start from <|endoftext|> (a document start), byte-level ones from '\n'.
  std::vector<int32_t> toks{tokenizer_ ? tokenizer_->eot() : int32_t{'\n'}};
  for (int i = 0; i < cfg_.train.sample_tokens; ++i) {
    const int start = std::max(0, static_cast<int>(toks.size()) - maxT);
    const int t = static_cast<int>(toks.size()) - start;
    model_->forward(toks.data() + start, nullptr, 1, t);
    Tensor host = Tensor::empty({Vp}, DType::F64);
    be_->copy(host, model_->logits().view({t, Vp})[t - 1]);
    const double* lg = host.data<double>();
    double mx = lg[0];
    for (int j = 1; j < V; ++j) mx = std::max(mx, lg[j]);
    std::vector<double> p(V);
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += p[j] = std::exp(lg[j] - mx);
    double u = rng_.uniform() * sum;
    int pick = V - 1;
    for (int j = 0; j < V; ++j)
      if ((u -= p[j]) < 0) {
        pick = j;
        break;
      }
    toks.push_back(pick);
  }
  if (tokenizer_) return tokenizer_->decode(toks.data() + 1, toks.size() - 1);
  return decode_bytes(toks);
}

void Run::write_metrics(const nlohmann::ordered_json& j) {
  metrics_ << j.dump() << "\n";
  metrics_.flush();
}

TrainResult Run::go() {
  build();  // everything that can be refused (config, data, model) before any file is written
  prepare_dir();
  open_logs();
  hooks_ = std::make_unique<StabilityHooks>(cfg_, *model_, dir_, log_);
  if (!resume_from_.empty()) restore(resume_from_);
  {
    std::ofstream c(dir_ + "/config.yaml");
    c << config_to_yaml(cfg_);
  }
  metrics_.open(dir_ + "/metrics.jsonl", std::ios::app);
  const auto& mc = model_->config();
  log_->info("stabletrain: {} on {} | GPT-2 L={} H={} C={} T={} V={} ({:.2f}M params) | {}",
             cfg_.run.name, be_->name(), mc.n_layer, mc.n_head, mc.n_embd, mc.max_seq_len,
             mc.vocab_size, model_->num_params() / 1e6, cfg_.precision.compute);
  log_->info("data: {}", data_.description);
  for (const std::string& l : data_notes_) log_->info("data: {}", l);
  if (!resume_from_.empty()) log_->info("resumed from {} at step {}", resume_from_, step_);

  TrainResult res;
  res.first_step = step_;
  const int B = cfg_.train.batch_size, T = cfg_.train.seq_len, A = cfg_.train.grad_accum_steps;
  const int64_t max_steps = cfg_.train.max_steps;
  const int64_t stop = opt_.stop_after >= 0 ? std::min(max_steps, opt_.stop_after) : max_steps;
  LrSchedule sched;
  sched.lr = static_cast<float>(cfg_.train.lr);
  sched.min_lr = static_cast<float>(cfg_.train.min_lr);
  sched.warmup_steps = cfg_.train.warmup_steps;
  sched.max_steps = static_cast<int>(max_steps);
  OptimConfig oc;
  oc.beta1 = static_cast<float>(cfg_.train.beta1);
  oc.beta2 = static_cast<float>(cfg_.train.beta2);
  oc.eps = static_cast<float>(cfg_.train.eps);
  oc.weight_decay = static_cast<float>(cfg_.train.weight_decay);
  oc.grad_clip = static_cast<float>(cfg_.train.grad_clip);
  std::vector<int32_t> x(B * T), y(B * T);
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return elapsed_prev_ +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  double tok_time = 0;
  int64_t tok_count = 0;
  if (resume_from_.empty()) hooks_->at_start();
  while (step_ < stop) {
    const auto t0 = std::chrono::steady_clock::now();
    const DataLoader::State data_at_start = train_loader_->state();
    hooks_->begin_step(step_ + 1);
    model_->zero_grad();
    double loss = 0;
    for (int a = 0; a < A; ++a) {
      train_loader_->next(x.data(), y.data());
      model_->forward(x.data(), y.data(), B, T);
      loss += model_->mean_loss() / A;
      if (!std::isfinite(model_->mean_loss()))
        fail("step ", step_ + 1, ": the training loss is ", model_->mean_loss(),
             "; stopping (last good checkpoint: ", last_ckpt_,
             "). Lower train.lr, raise train.warmup_steps or use a wider precision.compute");
      if (a == A - 1) hooks_->before_last_backward(step_ + 1);
      model_->backward(A);
    }
    hooks_->after_backward(step_ + 1);
    const float lr = sched.at(static_cast<int>(step_));
    std::optional<double> ss;
    SpikeDecision spike;
    if (cfg_.hooks.spike_z > 0) {
      ss = model_->grad_sum_squares();
      spike = hooks_->check_spike(step_ + 1, loss, std::sqrt(*ss) / model_->loss_scaler().scale());
      if (spike.snapshot) save_spike_snapshot(step_ + 1, elapsed(), data_at_start);
    }
    StepStats st;
    if (spike.skip) {
      st.grad_norm = std::sqrt(*ss) / model_->loss_scaler().scale();
      st.loss_scale = model_->loss_scaler().scale();
    } else {
      st = model_->step(lr, oc, ss);
    }
    if (st.skipped && !model_->loss_scaler().enabled())
      fail("step ", step_ + 1, ": non-finite gradients; stopping (last good checkpoint: ",
           last_ckpt_, ")");
    if (st.skipped) hooks_->event(step_ + 1, "overflow", {{"loss_scale", st.loss_scale}});
    ++step_;
    hooks_->after_update(step_);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = static_cast<double>(B) * T * A / dt;
    tok_time += dt;
    tok_count += static_cast<int64_t>(B) * T * A;
    res.losses.push_back(static_cast<float>(loss));
    nlohmann::ordered_json j = {{"step", step_},       {"loss", loss},        {"lr", lr},
                        {"grad_norm", st.grad_norm}, {"tokens_per_s", tps}, {"elapsed", elapsed()}};
    if (model_->loss_scaler().enabled()) {
      j["loss_scale"] = st.loss_scale;
      j["skipped"] = st.skipped;
    }
    if (spike.spike) j["spike"] = true;
    if (spike.skip) j["spike_skipped"] = true;
    write_metrics(j);
    if (step_ % cfg_.train.log_every == 0 || step_ == stop) {
      const double eta = (stop - step_) * (tok_time / static_cast<double>(step_ - res.first_step));
      log_->info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad {:.3f} | {:.0f} tok/s | ETA {}{}",
                 step_, max_steps, loss, lr, st.grad_norm, tps, fmt_duration(eta),
                 st.skipped ? " | skipped (fp16 overflow)" : "");
    }
    const bool last = step_ == stop;
    if ((cfg_.train.eval_every > 0 && step_ % cfg_.train.eval_every == 0) || last) {
      res.val_loss = evaluate();
      log_->info("step {:>6} | val_loss {:.4f}", step_, res.val_loss);
      write_metrics({{"step", step_}, {"val_loss", res.val_loss}, {"elapsed", elapsed()}});
    }
    if ((cfg_.train.ckpt_every > 0 && step_ % cfg_.train.ckpt_every == 0) || last) {
      res.weights_sha256 = save(step_, elapsed());
    }
  }
  res.last_step = step_;
  res.tokens_per_s = tok_time > 0 ? tok_count / tok_time : 0;
  if (res.weights_sha256.empty()) {
    const auto w = tensor_bytes(*be_, model_->master_flat());
    res.weights_sha256 = sha256_hex(w.data(), w.size());
  }
  if (step_ == max_steps && cfg_.train.sample_tokens > 0) {
    res.sample = sample();
    log_->info("sample:\n{}", res.sample);
  }
  if (hooks_->enabled() || hooks_->seconds() > 0) {
    const double total = elapsed() - elapsed_prev_;
    log_->info("hooks: {:.2f} s of this invocation's {:.1f} s ({:.1f}%)", hooks_->seconds(), total,
               total > 0 ? 100.0 * hooks_->seconds() / total : 0.0);
  }
  res.hook_seconds = hooks_->seconds();
  log_->info("done: {} steps, {:.0f} tokens/s, val_loss {:.4f}, run directory {}", step_,
             res.tokens_per_s, res.val_loss, dir_);
  spdlog::drop("train");
  return res;
}

}  // namespace

GPT2Config model_config(const Config& cfg) {
  GPT2Config mc;
  mc.n_layer = cfg.model.n_layer;
  mc.n_head = cfg.model.n_head;
  mc.n_embd = cfg.model.n_embd;
  mc.max_seq_len = cfg.model.max_seq_len;
  mc.vocab_size = cfg.model.vocab_size;
  return mc;
}

std::string latest_checkpoint(const std::string& dir) {
  const auto all = list_checkpoints(dir);
  return all.empty() ? "" : all.back().second;
}

TrainResult run_training(const Config& cfg, const TrainOptions& opt) {
  Run r(cfg, opt);
  return r.go();
}

}  // namespace st
