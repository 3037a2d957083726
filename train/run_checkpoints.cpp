// Checkpoints of a run: writing one (with ZeRO-1, every rank's optimizer shard first and the
// main file last), the checkpoint record in metrics.jsonl, spike snapshots, rotation
// (train.keep_checkpoints), orphaned shards, and --resume: the newest complete checkpoint,
// checked against the run's config, restores weights, moments, loss scale, step, RNG, data
// position and hook state, so the resumed run continues bit for bit. The file format is
// io/checkpoint.h's.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>

#include "train/run.h"

namespace fs = std::filesystem;

namespace st {

std::string checkpoint_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt_%08lld.bin", static_cast<long long>(step));
  return buf;
}

namespace {
const std::regex kCkptRe("ckpt_([0-9]{8})\\.bin");
}  // namespace

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

namespace {

// Keys whose change makes a resumed run a different run (model, data order, arithmetic).
bool must_match_on_resume(const std::string& key) {
  return key.rfind("model.", 0) == 0 || key.rfind("data.", 0) == 0 ||
         key == "precision.compute" || key == "run.seed" || key == "train.batch_size" ||
         key == "train.seq_len" || key == "train.grad_accum_steps" ||
         key == "train.grad_accum_mode" || key.rfind("attention.", 0) == 0;
}

std::vector<uint8_t> tensor_bytes(Backend& be, const Tensor& t) {
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  be.copy(host, t);
  const uint8_t* p = static_cast<const uint8_t*>(host.raw());
  return std::vector<uint8_t>(p, p + host.nbytes());
}

// Values of a raw little-endian array of 4- or 8-byte floats that are NaN or infinite.
int64_t count_non_finite(const std::vector<uint8_t>& bytes, int32_t elem_bytes) {
  int64_t bad = 0;
  if (elem_bytes == 8) {
    for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
      double x;
      std::memcpy(&x, bytes.data() + i, 8);
      bad += !std::isfinite(x);
    }
  } else {
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      float x;
      std::memcpy(&x, bytes.data() + i, 4);
      bad += !std::isfinite(x);
    }
  }
  return bad;
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

}  // namespace

namespace detail {

// One YAML document's text, flattened by flatten_yaml (train/config.h).
std::map<std::string, std::string> flatten(const std::string& yaml) {
  try {
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml);
    if (docs.size() > 1) fail("holds ", docs.size(), " YAML documents, expected one");
    return docs.empty() ? std::map<std::string, std::string>{} : flatten_yaml(docs[0]);
  } catch (const YAML::Exception& e) {
    fail("a config that cannot be flattened (not YAML, or a key that is not text): ", e.msg);
  }
}

std::vector<uint8_t> Run::whole_master_bytes() {
  if (!master_is_sharded()) {
    const Tensor m = model_->sharded() ? model_->params_flat() : model_->master_flat();
    return tensor_bytes(*be_, m);
  }
  const Tensor shard = model_->master_flat();
  Tensor whole = be_->alloc({model_->num_params()}, shard.dtype());
  be_->copy(whole.flat(shard_.begin(rank_), shard.numel(), {shard.numel()}), shard);
  if (comm_->device_buffers()) be_->synchronize();
  comm_->all_gather(whole.raw(), shard_, shard.dtype(), "the master weights");
  return tensor_bytes(*be_, whole);
}

void Run::load_whole_master(const std::vector<uint8_t>& bytes, const std::string& path) {
  if (!model_->sharded()) {
    load_tensor_bytes(*be_, model_->master_flat(), bytes, "master weights", path);
    model_->sync_params_from_master();
    return;
  }
  const Tensor p = model_->params_flat();
  const DType md = model_->separate_master() ? model_->master_flat().dtype() : p.dtype();
  Tensor host = Tensor::empty({model_->num_params()}, md);
  if (bytes.size() != host.nbytes())
    fail(path, ": master weights hold ", bytes.size(), " bytes, the model needs ", host.nbytes(),
         " (checkpoint of a different model?)");
  std::memcpy(host.raw(), bytes.data(), bytes.size());
  if (!model_->separate_master()) {
    be_->copy(p, host);
    return;
  }
  const Tensor m = model_->master_flat();
  be_->copy(m, host.flat(model_->shard_begin(), m.numel(), {m.numel()}));
  be_->round_copy(p, host, model_->compute());  // = round(master) everywhere
}

void Run::refresh_master_cache() {
  const std::vector<uint8_t> b = whole_master_bytes();
  if (!lead()) return;
  master_cache_.resize(b.size() / sizeof(float));
  std::memcpy(master_cache_.data(), b.data(), b.size());
}

void Run::remove_checkpoint(int64_t step, const std::string& main_path) {
  fs::remove(main_path);  // first: without it the shards are never taken
  const std::regex re("ckpt_" + checkpoint_name(step).substr(5, 8) + "\\.rank[0-9]+\\.bin");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (std::regex_match(e.path().filename().string(), re)) fs::remove(e.path());
}

// Shards of a checkpoint whose main file was never written (a rank died while writing it),
// and temporary files of interrupted writes.
void Run::remove_orphans() {
  const std::regex shard_re("ckpt_([0-9]{8})\\.rank[0-9]+\\.bin");
  const std::regex tmp_re("((spike_)?ckpt_[0-9]{8}(\\.rank[0-9]+)?\\.bin|metrics\\.jsonl|config\\."
                          "yaml|events\\.jsonl|[a-z_]+\\.csv)\\.tmp\\.[0-9]+");
  std::error_code ec;
  std::vector<fs::path> gone;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, shard_re) &&
        !fs::exists(fs::path(dir_) / checkpoint_name(std::stoll(m[1]))))
      gone.push_back(e.path());
    else if (std::regex_match(name, tmp_re))
      gone.push_back(e.path());
  }
  for (const auto& p : gone) {
    log_->warn("resume: removing {} (left by an interrupted checkpoint)", p.filename().string());
    fs::remove(p);
  }
}

// The records that fix the arithmetic of the saved state, against this run: the compute
// format, the model shape, the master weights' element size, and the step against the
// file's name (list_checkpoints and "nothing to do" read the step from the name).
void Run::check_records(const CheckpointState& s, const std::string& path) const {
  const std::string fix = " (resume with the run's own config.yaml, or start a new run)";
  if (s.compute != cfg_.precision.compute)
    fail("--resume: precision.compute is '", cfg_.precision.compute, "' but the checkpoint ",
         path, " holds '", s.compute, "' training state (its compute record)", fix);
  const GPT2Config& mc = model_->config();
  const std::pair<const char*, std::pair<int64_t, int64_t>> shape[] = {
      {"n_layer", {s.n_layer, mc.n_layer}},      {"n_head", {s.n_head, mc.n_head}},
      {"n_embd", {s.n_embd, mc.n_embd}},         {"max_seq_len", {s.max_seq_len, mc.max_seq_len}},
      {"vocab_size", {s.vocab_size, mc.vocab_size}},
      {"padded_vocab_size", {s.padded_vocab_size, mc.vp()}}};
  for (const auto& [key, v] : shape)
    if (v.first != v.second)
      fail("--resume: model.", key, " is ", v.second, " but the checkpoint ", path,
           " was written with ", v.first, " (its ", key, " record)", fix);
  const int64_t eb = int64_t(dtype_size(model_->master_flat().dtype()));
  if (s.master_elem_bytes != eb)
    fail("--resume: the checkpoint ", path, " holds master weights of ", s.master_elem_bytes,
         " bytes each, precision.compute ", cfg_.precision.compute, " keeps ", eb, fix);
  std::smatch m;
  const std::string name = fs::path(path).filename().string();
  if (std::regex_match(name, m, kCkptRe) && std::stoll(m[1]) != s.step)
    fail("--resume: ", path, " holds step ", s.step, " but its name says step ", m[1].str(),
         " (renamed or edited? rename it to ", checkpoint_name(s.step),
         " if it is right, or resume from another checkpoint)");
  if (s.step > cfg_.train.max_steps)
    fail("--resume: ", path, " holds step ", s.step, ", past train.max_steps = ",
         cfg_.train.max_steps, " (raise train.max_steps to continue it)");
}

void Run::restore(const std::string& path) {
  const CheckpointState s = load_checkpoint(path);
  check_records(s, path);
  // Refuse a checkpoint of another run; report other config changes. A key the checkpoint
  // does not have (written before it existed) counts as its default.
  std::map<std::string, std::string> old_cfg;
  try {
    old_cfg = flatten(s.config_yaml);
  } catch (const Error& e) {
    fail(path, ": its config_yaml record ", e.what());
  }
  const auto new_cfg = flatten(config_to_yaml(cfg_));
  const auto defaults = flatten(config_to_yaml(Config{}));
  for (const auto& [k, v] : new_cfg) {
    auto it = old_cfg.find(k);
    if (it == old_cfg.end() && defaults.count(k) && defaults.at(k) == v) continue;
    const std::string ov = it == old_cfg.end() ? "(absent)" : it->second;
    if (ov == v) continue;
    if (must_match_on_resume(k))
      fail("--resume: ", k, " is '", v, "' but the checkpoint ", path, " was written with '",
           ov, "' (resume with the run's own config.yaml)");
    log_->warn("resume: {} changed from '{}' to '{}'", k, ov, v);
    config_changes_.push_back({k, ov, v});  // and in metrics.jsonl (write_config_changes)
  }
  // Data parallelism: the same number of ranks (it is part of the global batch) and the
  // same optimizer layout.
  if (s.dist_world != world_)
    fail("--resume: the checkpoint ", path, " was written by ", s.dist_world, " rank",
         s.dist_world == 1 ? "" : "s", ", this job has ", world_, ": resume on ", s.dist_world,
         s.dist_world == 1 ? " process (no mpirun, or mpirun -np 1)" : " ranks (mpirun -np " +
         std::to_string(s.dist_world) + ")",
         ". The global batch is batch_size x grad_accum_steps x ranks, and optimizer shards "
         "are not redistributed");
  if ((s.optim_shards > 0) != zero_)
    fail("--resume: the checkpoint ", path, " was written with dist.zero ",
         s.optim_shards > 0 ? 1 : 0, ", this run has dist.zero ", zero_ ? 1 : 0,
         " (resume with the run's own setting)");
  load_whole_master(s.master, path);
  if (!zero_) {
    load_tensor_bytes(*be_, model_->m_flat(), s.m, "Adam m", path);
    load_tensor_bytes(*be_, model_->v_flat(), s.v, "Adam v", path);
  } else {
    const std::string rpath = (fs::path(path).parent_path() /
                               rank_checkpoint_name(s.step, rank_)).string();
    if (!fs::exists(rpath))
      fail("--resume: ", path, " is a ZeRO-1 checkpoint of ", world_, " ranks but rank ", rank_,
           "'s optimizer shard ", rpath, " is missing (copied without its shards?)");
    const CheckpointState r = load_checkpoint(rpath);
    const int64_t b = shard_.begin(rank_), e = shard_.end(rank_);
    if (r.shard_rank != rank_ || r.optim_shards != world_ || r.shard_begin != b ||
        r.shard_end != e || r.step != s.step)
      fail("--resume: ", rpath, " holds step ", r.step, ", rank ", r.shard_rank, " of ",
           r.optim_shards, ", elements [", r.shard_begin, ", ", r.shard_end, "); expected step ",
           s.step, ", rank ", rank_, " of ", world_, ", elements [", b, ", ", e, ")");
    const size_t eb = size_t(s.master_elem_bytes);
    if (r.master.size() != size_t(e - b) * eb ||
        std::memcmp(r.master.data(), s.master.data() + size_t(b) * eb, r.master.size()) != 0)
      fail("--resume: ", rpath, " does not belong to ", path,
           " (its master weights differ from the main file's)");
    load_tensor_bytes(*be_, model_->m_flat(), r.m, "Adam m", rpath);
    load_tensor_bytes(*be_, model_->v_flat(), r.v, "Adam v", rpath);
  }
  model_->set_adam_step(static_cast<int>(s.adam_step));
  model_->loss_scaler().set_state(s.loss_scale, s.loss_scale_good_steps);
  rng_.set_state(Rng::State::from_bytes(s.rng_state, path));
  train_loader_->set_state(DataLoader::State::from_bytes(s.data_state, path));
  step_ = s.step;
  elapsed_prev_ = s.elapsed_s;  // format versions 1..2; later ones: from metrics.jsonl below
  last_ckpt_ = path;
  last_ckpt_step_ = s.step;
  if (!lead()) return;
  try {
    hooks_->resume(s.step, s.hooks_state);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
  remove_orphans();
  // Keep the metrics of the steps the checkpoint covers; later lines are being redone. Cut
  // atomically (run_io.h): a crash here leaves the old file or the cut one.
  const std::string mpath = dir_ + "/metrics.jsonl";
  bool has_record = false;
  double elapsed_at = -1;
  rewrite_lines_atomic(mpath, [&](const std::string& line, size_t) {
    const auto j = nlohmann::ordered_json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return false;
    const auto st = j.find("step");
    if (st == j.end() || !st->is_number_integer() || st->get<int64_t>() > step_) return false;
    if (st->get<int64_t>() == step_) {
      // An earlier resume's record of config changes: this resume writes its own.
      if (j.value("kind", "") == kConfigChangeKind) return false;
      if (j.contains("checkpoint")) has_record = true;
      const auto e = j.find("elapsed");
      if (e != j.end() && e->is_number()) elapsed_at = e->get<double>();
    }
    return true;
  });
  if (elapsed_at >= 0) elapsed_prev_ = elapsed_at;  // the run's wall time at the checkpoint
  inject_fault(rank_, step_, "resume");
  // A crash between the checkpoint's rename and its metrics record lost the record: write it
  // now, as the uninterrupted run did.
  if (!has_record && fs::path(path).filename() == checkpoint_name(step_)) {
    LogFile m(mpath);
    m << nlohmann::ordered_json{{"kind", "checkpoint"},
                                {"step", step_},
                                {"checkpoint", checkpoint_name(step_)},
                                {"weights_sha256", sha256_hex(s.master.data(), s.master.size())},
                                {"elapsed", elapsed_prev_}}
                .dump()
      << "\n";
    m.close();
    log_->warn("resume: the metrics record of {} was missing (a crash right after the "
               "checkpoint was written); added", checkpoint_name(step_));
  }
}

void Run::write_config_changes() {
  for (const auto& c : config_changes_)
    write_metrics({{"kind", kConfigChangeKind},
                   {"step", step_},
                   {"key", c.key},
                   {"from", c.from},
                   {"to", c.to}});
}

CheckpointState Run::checkpoint_state(int64_t step, double elapsed_s) const {
  CheckpointState s;
  s.config_yaml = config_to_yaml(cfg_);
  s.step = step;
  s.adam_step = model_->adam_step();
  set_model_config(s, model_->config());
  s.compute = cfg_.precision.compute;
  s.master_elem_bytes = static_cast<int32_t>(dtype_size(model_->master_flat().dtype()));
  if (!zero_) {
    s.m = tensor_bytes(*be_, model_->m_flat());
    s.v = tensor_bytes(*be_, model_->v_flat());
  }
  s.loss_scale = model_->loss_scaler().scale();
  s.loss_scale_good_steps = model_->loss_scaler().good_steps();
  s.rng_state = rng_.state().to_bytes();
  s.data_state = train_loader_->state().to_bytes();
  s.elapsed_s = elapsed_s;
  if (lead()) s.hooks_state = hooks_->state();
  s.dist_world = world_;
  s.optim_shards = zero_ ? world_ : 0;
  return s;
}

std::string Run::write_checkpoint(const std::string& name, int64_t step, double elapsed_s,
                                  const DataLoader::State& ds) {
  CheckpointState s = checkpoint_state(step, elapsed_s);
  s.data_state = ds.to_bytes();
  s.master = whole_master_bytes();  // collective under ZeRO-1 with a separate master
  // Never a checkpoint of non-finite weights: it would replace a good one in the rotation
  // and every resume from it would fail. Every rank holds the whole master: same decision.
  if (const int64_t bad = count_non_finite(s.master, s.master_elem_bytes))
    collective_fail("step " + std::to_string(step) + ": " + std::to_string(bad) +
                    " master weight" + (bad == 1 ? " is" : "s are") +
                    " not finite; no checkpoint written, stopping (last good checkpoint: " +
                    last_ckpt_ + "). Lower train.lr, raise train.warmup_steps or use a wider "
                    "precision.compute");
  if (zero_) {
    // Every rank's shard first, the main file last: --resume only takes a checkpoint whose
    // main file exists, and that exists only once every shard was written.
    CheckpointState r = s;
    r.master = tensor_bytes(*be_, model_->master_flat());
    r.m = tensor_bytes(*be_, model_->m_flat());
    r.v = tensor_bytes(*be_, model_->v_flat());
    r.hooks_state.clear();
    r.shard_rank = rank_;
    r.shard_begin = shard_.begin(rank_);
    r.shard_end = shard_.end(rank_);
    const std::string stem = name.substr(0, name.size() - 4);  // without ".bin"
    save_checkpoint(dir_ + "/" + stem + ".rank" + std::to_string(rank_) + ".bin", r);
  }
  if (master_is_sharded() && lead()) {  // the hooks' view of the master (reference run)
    master_cache_.resize(s.master.size() / sizeof(float));
    std::memcpy(master_cache_.data(), s.master.data(), s.master.size());
  }
  inject_fault(rank_, step, "ckpt");
  if (zero_) comm_->barrier("checkpoint " + name + " (every rank's shard written)");
  std::string sha;
  on_lead([&] { sha = save_checkpoint(dir_ + "/" + name, s); });
  return share_string(sha);
}

void Run::save_spike_snapshot(int64_t step, double elapsed_s, const DataLoader::State& ds) {
  char name[64];
  std::snprintf(name, sizeof name, "spike_ckpt_%08lld.bin", static_cast<long long>(step));
  const std::string sha = write_checkpoint(name, step - 1, elapsed_s, ds);
  if (!lead()) return;
  log_->warn("step {}: spike snapshot {} (the state before this step's update; copy it to "
             "{} in a new run directory to resume from it)", step, name, checkpoint_name(step - 1));
  hooks_->event(step, "snapshot", {{"file", name}, {"weights_sha256", sha}});
}

std::string Run::save(int64_t step, double elapsed_s) {
  // The hooks' rows of a checkpoint come first: once the checkpoint exists, everything up
  // to its step is on disk (a crash after it loses nothing a resume would not redo).
  if (!cfg_.hooks.reference_run.empty()) {
    if (master_is_sharded()) refresh_master_cache();  // the hooks read rank 0's cache
    if (lead()) hooks_->at_checkpoint(step);
  }
  const std::string sha =
      write_checkpoint(checkpoint_name(step), step, elapsed_s, train_loader_->state());
  const std::string path = dir_ + "/" + checkpoint_name(step);
  last_ckpt_ = path;
  last_ckpt_step_ = step;
  if (!lead()) return sha;
  inject_fault(rank_, step, "ckpt_written");
  log_->info("checkpoint {} (step {}), weights sha256 {}", path, step, sha);
  // (A crash right here loses this record; --resume writes it again: Run::restore.)
  write_metrics({{"kind", "checkpoint"},
                 {"step", step},
                 {"checkpoint", checkpoint_name(step)},
                 {"weights_sha256", sha},
                 {"elapsed", elapsed_s}});  // wall time: not in the checkpoint (format 3)
  if (cfg_.train.keep_checkpoints > 0) {
    auto all = list_checkpoints(dir_);
    while (static_cast<int>(all.size()) > cfg_.train.keep_checkpoints) {
      remove_checkpoint(all.front().first, all.front().second);
      all.erase(all.begin());
    }
  }
  return sha;
}

}  // namespace detail

std::string latest_checkpoint(const std::string& dir) {
  const auto all = list_checkpoints(dir);
  return all.empty() ? "" : all.back().second;
}

std::string rank_checkpoint_name(int64_t step, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt_%08lld.rank%d.bin", static_cast<long long>(step), rank);
  return buf;
}

}  // namespace st
