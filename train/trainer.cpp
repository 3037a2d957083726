// The step loop. Order of one step (fixed, so runs are reproducible):
//   zero grads; for each micro-batch: next batch from the loader, forward, backward;
//   lr from the schedule; clip + AdamW (or skip on FP16 overflow); metrics line;
//   evaluation every train.eval_every; checkpoint every train.ckpt_every.
// Checkpoints hold everything that affects later steps (weights, moments, loss scale, step,
// RNG, loader position), so a resumed run continues bit for bit.
//
// Data parallelism (dist.*, docs/distributed.md): W ranks each run grad_accum_steps
// micro-batches (rank r takes micro-batches r, r + W, ... of the step, data/loader.h), then
//   losses: every micro-batch's mean loss into its slot, shared, added in slot order;
//   gradients: summed over ranks in rank order (dist/comm.h) -- all-reduce, or with ZeRO-1
//     (dist.zero 1) a reduce-scatter leaving each rank the sum over its shard of the flat
//     parameters (aligned to kSumSquaresChunk);
//   gradient norm: ZeRO-1 adds every shard's 64K-chunk partial sums in chunk order;
//   update: all of AdamW on every rank, or with ZeRO-1 each rank's shard (its master, m and
//     v exist only there), then an all-gather of the parameters (compute format).
// With grad_accum_mode separate and one micro-batch per rank this is, bit for bit, one
// process with grad_accum_steps = W (tests/test_distributed.cpp). Rank 0 writes the logs,
// metrics, hooks and the main checkpoint file; with ZeRO-1 every rank writes its optimizer
// shard beside it first. Any error ends every rank (Run::abort_all).
#include "train/trainer.h"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <thread>

#include "backends/backends.h"
#include "core/backend.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "model/gpt2.h"
#include "io/weights.h"
#include "optim/schedule.h"
#include "io/checkpoint.h"
#include "train/hooks.h"
#include "train/run_io.h"

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
  try {
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml);
    if (docs.size() > 1) fail("holds ", docs.size(), " YAML documents, expected one");
    if (docs.empty()) return out;
    for (const auto& sec : docs[0]) {
      const std::string s = sec.first.as<std::string>();
      if (sec.second.IsMap()) {
        for (const auto& kv : sec.second)
          out[s + "." + kv.first.as<std::string>()] = kv.second.as<std::string>();
      } else {
        out[s] = sec.second.as<std::string>();
      }
    }
  } catch (const YAML::Exception& e) {
    fail("a config that is not a mapping of scalars: ", e.msg);
  }
  return out;
}

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

void load_tensor_bytes(Backend& be, const Tensor& t, const std::vector<uint8_t>& bytes,
                       const char* what, const std::string& path) {
  if (bytes.size() != t.nbytes())
    fail(path, ": ", what, " holds ", bytes.size(), " bytes, the model needs ", t.nbytes(),
         " (checkpoint of a different model?)");
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(host.raw(), bytes.data(), bytes.size());
  be.copy(t, host);
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

// An error already reported by rank 0 (stderr, train.log): the other ranks end quietly.
struct ReportedError : Error {
  using Error::Error;
};

// STABLETRAIN_FAULT=RANK:STEP:WHERE:MODE (tests of failure handling, docs/distributed.md):
// rank RANK, at step STEP, WHERE = step (start of the step), ckpt (after writing its
// checkpoint shard, before the main file), ckpt_written (after the main file, before its
// metrics record) or resume (STEP = the checkpoint's step: after the logs were cut back to
// it, before the checkpoint record is re-derived); MODE = exit (dies at once, no MPI
// cleanup), kill (SIGKILL to itself), hang (sleeps forever) or error (throws, like a failed
// write).
void inject_fault(int rank, int64_t step, const char* where) {
  static const std::string spec = [] {
    const char* v = std::getenv("STABLETRAIN_FAULT");
    return std::string(v ? v : "");
  }();
  if (spec.empty()) return;
  std::vector<std::string> parts(1);
  for (char ch : spec) {
    if (ch == ':')
      parts.emplace_back();
    else
      parts.back().push_back(ch);
  }
  auto num = [&](const std::string& v) {
    int64_t x = 0;
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || p != v.data() + v.size())
      fail("STABLETRAIN_FAULT='", spec, "': '", v, "' is not an integer");
    return x;
  };
  if (parts.size() != 4) fail("STABLETRAIN_FAULT='", spec, "': expected RANK:STEP:WHERE:MODE");
  if (num(parts[0]) != rank || num(parts[1]) != step || parts[2] != where) return;
  std::fprintf(stderr, "train: rank %d: injected fault at step %lld (%s): %s\n", rank,
               static_cast<long long>(step), where, parts[3].c_str());
  std::fflush(stderr);
  if (parts[3] == "exit") std::_Exit(17);
  if (parts[3] == "kill") std::raise(SIGKILL);  // crash-consistency tests: no cleanup at all
  if (parts[3] == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  fail("injected failure at step ", step, " (", where, "; STABLETRAIN_FAULT)");
}

// Peak (VmHWM) or current (VmRSS) resident set of this process, 0 if unknown.
size_t rss_bytes(const char* field = "VmHWM:") {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field))) * 1024;
  return 0;
}

bool uses_cuda(const Config& cfg) {
  return cfg.device == "cuda" || (cfg.device == "auto" && cuda_available());
}

// train.log through a LogFile: every line is one checked write(2). spdlog hands a sink's
// exception to the logger's error handler (Run records it; the step loop stops on it), so a
// full disk never cuts the log silently.
class CheckedFileSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit CheckedFileSink(const std::string& path) : file_(path) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t out;
    formatter_->format(msg, out);
    file_ << std::string_view(out.data(), out.size());
    file_.flush();
  }
  void flush_() override { file_.flush(); }

 private:
  LogFile file_;
};

class Run {
 public:
  Run(const Config& cfg, const TrainOptions& opt) : cfg_(cfg), opt_(opt) {}
  TrainResult go();
  // Error handling of run_training: a single process rethrows; a rank of a data-parallel
  // job reports and ends every rank.
  bool distributed() const { return comm_ && comm_->world() > 1; }
  [[noreturn]] void abort_all(const std::exception& e);
  void finalize_quietly() {
    if (comm_) comm_->finalize();
  }

 private:
  bool lead() const { return rank_ == 0; }
  void setup_dist();
  void prepare_dir();
  void open_logs();
  void build();
  // Runs f on rank 0; an error there ends every rank with rank 0's message.
  void on_lead(const std::function<void()>& f);
  // Every rank knows the same error: rank 0 reports it, then every rank stops.
  [[noreturn]] void collective_fail(const std::string& msg);
  std::string share_string(std::string s);  // rank 0's value on every rank
  void restore(const std::string& path);
  std::string save(int64_t step, double elapsed_s);
  // The state before step `step`'s update, with the loader where it stood before the step.
  void save_spike_snapshot(int64_t step, double elapsed_s, const DataLoader::State& ds);
  // Writes the checkpoint `name` (and, with ZeRO-1, every rank's shard beside it); collective.
  // Returns the master weights' SHA-256 on every rank.
  std::string write_checkpoint(const std::string& name, int64_t step, double elapsed_s,
                               const DataLoader::State& ds);
  CheckpointState checkpoint_state(int64_t step, double elapsed_s) const;  // without master
  // The whole master weights as raw bytes (gathered across ranks under ZeRO-1 with a
  // separate master; collective then); every rank gets them.
  std::vector<uint8_t> whole_master_bytes();
  void load_whole_master(const std::vector<uint8_t>& bytes, const std::string& path);
  void refresh_master_cache();  // ZeRO-1, bf16/fp16: rank 0's hooks read master_fp32()
  bool master_is_sharded() const { return model_->sharded() && model_->separate_master(); }
  double grad_sum_squares_global();
  void remove_checkpoint(int64_t step, const std::string& main_path);
  void remove_orphans();
  double evaluate();
  std::string sample();
  void write_metrics(const nlohmann::ordered_json& j);

  Config cfg_;
  TrainOptions opt_;
  std::string dir_, resume_from_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<Communicator> comm_;
  int rank_ = 0, world_ = 1;
  bool zero_ = false;  // ZeRO-1 over world_ > 1 ranks
  Partition shard_;    // ZeRO-1: each rank's part of the flat parameters
  std::string threads_note_;
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
  LogFile metrics_;
  std::unique_ptr<RunDirLock> lock_;  // rank 0: held from prepare_dir to the end
  std::string log_error_;             // the first failed write to train.log
  std::string last_ckpt_ = "(none)";
  int64_t last_ckpt_step_ = -1;
  std::vector<float> master_cache_;
};

void Run::setup_dist() {
  const DistSection& d = cfg_.dist;
  const LaunchInfo li = launch_info();
  const bool cuda = uses_cuda(cfg_);
  std::string backend = d.backend;
  if (backend == "auto") backend = li.world > 1 ? (cuda ? "nccl" : "mpi") : "none";
  if (backend == "none") {
    if (li.world > 1)
      fail(cfg_.source, ": dist.backend is none, but ", li.launcher, " started this process as ",
           "rank ", li.rank, " of ", li.world, ": every rank would train alone into the same run ",
           "directory (set dist.backend: mpi or auto)");
    comm_ = make_single_comm();
  } else if (backend == "mpi") {
    comm_ = make_mpi_comm(d.timeout_s);
  } else {
    NcclOptions o;
    o.bootstrap = d.nccl_bootstrap;
    o.rendezvous = d.rendezvous;
    o.timeout_s = d.timeout_s;
    comm_ = make_nccl_comm(o);
  }
  rank_ = comm_->rank();
  world_ = comm_->world();
  if (world_ > 1 && cuda != comm_->device_buffers())
    fail(cfg_.source, ": dist.backend ", comm_->name(), " moves ",
         comm_->device_buffers() ? "GPU" : "host", " buffers but device is ",
         cuda ? "cuda" : "cpu", " (use dist.backend ", cuda ? "nccl" : "mpi",
         " or auto)");
  zero_ = d.zero == 1 && world_ > 1;
  // Every rank must train the same config (mpirun's MPMD form, or files that differ
  // between nodes, could hand them different ones).
  const std::string mine = config_to_yaml(cfg_), lead_cfg = share_string(mine);
  if (mine != lead_cfg) {
    const auto a = flatten(lead_cfg), b = flatten(mine);
    std::string key = "?", va, vb;
    for (const auto& [k, v] : b)
      if (!a.count(k) || a.at(k) != v) {
        key = k, vb = v, va = a.count(k) ? a.at(k) : "(absent)";
        break;
      }
    fail("rank ", rank_, "'s config differs from rank 0's: ", key, " is '", vb, "' here, '", va,
         "' on rank 0 (every rank must run the same config)");
  }
  // CPU threads per rank: the node's cores shared by its ranks unless set.
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (world_ > 1 && !cuda && cfg_.run.threads == 0 && !(omp && *omp) && local_size) {
    const int ranks_here = std::max(1, std::atoi(local_size));
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    cfg_.run.threads = std::max(1, cores / ranks_here);
    threads_note_ = "run.threads 0 under mpirun: " + std::to_string(cfg_.run.threads) +
                    " threads per rank (" + std::to_string(cores) + " cores, " +
                    std::to_string(ranks_here) + " ranks on this node)";
  }
}

std::string Run::share_string(std::string s) {
  if (world_ == 1) return s;
  uint64_t n = s.size();
  comm_->broadcast_host(&n, sizeof n, 0, "a message from rank 0");
  s.resize(n);
  if (n) comm_->broadcast_host(s.data(), n, 0, "a message from rank 0");
  return s;
}

void Run::on_lead(const std::function<void()>& f) {
  std::string err;
  if (lead()) {
    try {
      f();
    } catch (const std::exception& e) {
      err = e.what();
      if (world_ == 1) throw;
      std::fprintf(stderr, "train: error: %s\n", err.c_str());
      std::fflush(stderr);
      if (log_) log_->error("{}", err);
    }
  }
  err = share_string(err);
  if (!err.empty()) throw ReportedError(err);
}

void Run::collective_fail(const std::string& msg) {
  if (world_ == 1) fail(msg);
  if (lead()) {
    std::fprintf(stderr, "train: error: %s\n", msg.c_str());
    std::fflush(stderr);
    if (log_) log_->error("{}", msg);
  }
  comm_->barrier("the error report");  // rank 0 has printed before anyone aborts
  throw ReportedError(msg);
}

void Run::abort_all(const std::exception& e) {
  if (dynamic_cast<const ReportedError*>(&e)) comm_->abort("", 1);
  const std::string what = e.what();
  const std::string me = "rank " + std::to_string(rank_) + " of " + std::to_string(world_);
  const std::string msg = "train: error: " + (what.rfind(me, 0) == 0 ? what : me + ": " + what);
  if (log_) log_->error("{}", msg);
  comm_->abort(msg, 1);
  std::_Exit(1);  // not reached
}

void Run::prepare_dir() {
  dir_ = cfg_.run.out_dir;
  ST_CHECK(!dir_.empty(), "run.out_dir is empty");
  on_lead([&] {
    // Files of the run, the lock file aside (it stays behind, unlocked, after a run).
    auto has_run_files = [&] {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir_, ec))
        if (e.path().filename() != RunDirLock::kFileName) return true;
      return false;
    };
    const bool exists = fs::exists(dir_);
    if (exists && !fs::is_directory(dir_))
      fail("run.out_dir: '", dir_, "' exists and is not a directory");
    auto refuse_nonempty = [&] {
      fail("run directory '", dir_, "' already exists and is not empty (use --resume to "
           "continue it, --overwrite to delete it and start over, or --set run.out_dir=NEW)");
    };
    // Refused before the lock file is created in someone's directory; checked again below,
    // under the lock, against a process that got there first.
    if (exists && !opt_.resume && !opt_.overwrite && has_run_files()) refuse_nonempty();
    fs::create_directories(dir_);
    lock_ = std::make_unique<RunDirLock>(dir_);
    const bool nonempty = has_run_files();
    if (opt_.resume) {
      resume_from_ = nonempty ? latest_checkpoint(dir_) : "";
      if (resume_from_.empty())
        fail("--resume: no checkpoint (ckpt_*.bin) in run directory '", dir_,
             "' (run without --resume to start it)");
      return;
    }
    if (nonempty) {
      if (!opt_.overwrite) refuse_nonempty();
      for (const auto& e : fs::directory_iterator(dir_))  // all but the lock we hold
        if (e.path().filename() != RunDirLock::kFileName) fs::remove_all(e.path());
    }
  });
  resume_from_ = share_string(resume_from_);
}

void Run::open_logs() {
  std::vector<spdlog::sink_ptr> sinks;  // ranks other than 0 log nothing
  if (lead()) {
    sinks.push_back(std::make_shared<CheckedFileSink>(dir_ + "/train.log"));
    if (opt_.console) sinks.push_back(std::make_shared<spdlog::sinks::stdout_sink_mt>());
  }
  log_ = std::make_shared<spdlog::logger>("train", sinks.begin(), sinks.end());
  log_->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %v");
  log_->flush_on(spdlog::level::info);
  log_->set_error_handler([this](const std::string& msg) {
    if (log_error_.empty()) log_error_ = msg;
  });
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
  auto load = [&] {
    data_ = load_token_data(ds, [this](const std::string& line) {
      data_notes_.push_back(line);
      if (opt_.console && lead()) std::printf("%s\n", line.c_str());
    });
  };
  // Rank 0 first: it writes missing shards (data.prepare_from) that the others then read.
  on_lead(load);
  if (!lead()) load();
  if (cfg_.data.tokenizer == "gpt2" && cfg_.train.sample_tokens > 0 && lead())
    tokenizer_ = std::make_unique<Gpt2Tokenizer>(cfg_.data.tokenizer_dir);
  if (cfg_.model.vocab_size < data_.vocab_size)
    fail(cfg_.source, ": model.vocab_size = ", cfg_.model.vocab_size, " is smaller than the ",
         data_.vocab_size, " tokens of data.tokenizer '", cfg_.data.tokenizer, "'");
  if (uses_cuda(cfg_) && world_ > 1)
    be_ = make_cuda_backend(comm_->local_rank());  // the communicator's GPU
  else
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
  OptimShard shard;
  if (zero_) {
    shard_ = Partition(num_parameters(mc), world_, kSumSquaresChunk);
    shard = {shard_.begin(rank_), shard_.end(rank_)};
  }
  model_ = std::make_unique<GPT2>(mc, *be_, parse_dtype(cfg_.precision.compute), ac, ls, shard);
  model_->set_grad_accum_mode(cfg_.train.grad_accum_mode == "separate" ? GradAccumMode::kSeparate
                                                                       : GradAccumMode::kFused);
  model_->set_recompute(parse_recompute(cfg_.train.recompute));
  if (master_is_sharded() && lead()) model_->set_master_source([this] { return master_cache_; });
  model_->init_weights(cfg_.run.seed);
  if (!init.params.empty()) model_->set_master_fp32(init.params);
  const int B = cfg_.train.batch_size, T = cfg_.train.seq_len;
  train_loader_ =
      std::make_unique<DataLoader>(data_.train, B, T, cfg_.run.seed, true, rank_, world_);
  val_loader_ = std::make_unique<DataLoader>(data_.val, B, T, cfg_.run.seed, false);
  rng_.reseed(cfg_.run.seed ^ 0x5eed5eed5eedull);
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

double Run::grad_sum_squares_global() {
  if (!zero_) return model_->grad_sum_squares();
  // The per-chunk partial sums of every rank's shard, added in chunk order: the bits of
  // grad_sum_squares() over the whole (reduced) gradient on one process.
  const int64_t C = kSumSquaresChunk;
  std::vector<int64_t> off(world_ + 1);
  for (int r = 0; r <= world_; ++r) off[r] = (shard_.offsets()[r] + C - 1) / C;
  const Partition chunks(off);
  std::vector<double> part(chunks.size(), 0.0);
  const std::vector<double> mine = model_->grad_sum_squares_chunks(shard_.begin(rank_),
                                                                   shard_.end(rank_));
  std::copy(mine.begin(), mine.end(), part.begin() + chunks.begin(rank_));
  comm_->all_gather_host(part.data(), chunks, "gradient norm partial sums");
  double total = 0;
  for (double p : part) total += p;
  return total;
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

void Run::restore(const std::string& path) {
  const CheckpointState s = load_checkpoint(path);
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
    m << nlohmann::ordered_json{{"step", step_},
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
  s.master = whole_master_bytes();  // collective under ZeRO-1 with a separate master
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
  write_metrics({{"step", step},
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

double Run::evaluate() {
  const int B = cfg_.train.batch_size, T = cfg_.train.seq_len;
  std::vector<int32_t> x(B * T), y(B * T);
  val_loader_->reset();
  const int64_t n = std::min<int64_t>(cfg_.train.eval_batches,
                                      val_loader_->windows_per_epoch() / B);
  ST_CHECK(n > 0, "the validation split holds fewer than ", B, " windows of ", T + 1,
           " tokens (raise data.val_fraction or lower train.seq_len)");
  // Batch i on rank i % world; the per-batch losses are shared (one rank fills each slot,
  // the others add zeros: exact) and added in batch order as one process does.
  std::vector<double> losses(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    val_loader_->next(x.data(), y.data());
    if (i % world_ != rank_) continue;
    model_->forward(x.data(), y.data(), B, T);
    losses[i] = model_->mean_loss();
  }
  if (world_ > 1) comm_->all_reduce_host(losses.data(), n, "validation losses");
  double sum = 0;
  for (double l : losses) sum += l;
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
  if (!lead()) return;
  metrics_ << j.dump() << "\n";
  metrics_.flush();  // one checked write(2) per line (run_io.h)
}

TrainResult Run::go() {
  struct SignalGuard {  // SIGINT/SIGTERM stop the run after a step (run_io.h)
    SignalGuard() { stop_signal::install(); }
    ~SignalGuard() { stop_signal::uninstall(); }
  } signals;
  setup_dist();
  build();  // everything that can be refused (config, data, model) before any file is written
  prepare_dir();
  open_logs();
  hooks_ = std::make_unique<StabilityHooks>(cfg_, *model_, dir_, log_);
  if (!resume_from_.empty()) restore(resume_from_);
  if (lead()) {
    write_file_atomic(dir_ + "/config.yaml", config_to_yaml(cfg_));
    metrics_ = LogFile(dir_ + "/metrics.jsonl");
  }
  const auto& mc = model_->config();
  log_->info("stabletrain: {} on {} | GPT-2 L={} H={} C={} T={} V={} ({:.2f}M params) | {}",
             cfg_.run.name, be_->name(), mc.n_layer, mc.n_head, mc.n_embd, mc.max_seq_len,
             mc.vocab_size, model_->num_params() / 1e6, cfg_.precision.compute);
  log_->info("data: {}", data_.description);
  for (const std::string& l : data_notes_) log_->info("data: {}", l);
  const int B = cfg_.train.batch_size, T = cfg_.train.seq_len, A = cfg_.train.grad_accum_steps;
  if (world_ > 1) {
    log_->info("data parallel: {} ranks ({}), {} micro-batches of {} x {} per rank and step, "
               "global batch {} tokens{}",
               world_, comm_->name(), A, B, T, static_cast<int64_t>(B) * T * A * world_,
               zero_ ? ", ZeRO-1 (optimizer state sharded)" : "");
    if (!threads_note_.empty()) log_->info("{}", threads_note_);
  }
  if (!resume_from_.empty()) log_->info("resumed from {} at step {}", resume_from_, step_);

  TrainResult res;
  res.rank = rank_;
  res.world = world_;
  res.first_step = step_;
  const int AW = A * world_;  // micro-batches per step over all ranks
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
  const Tensor grads = model_->grads_flat(), params = model_->params_flat();
  const DType fmt = model_->compute();
  std::vector<int32_t> x(B * T), y(B * T);
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return elapsed_prev_ +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  double tok_time = 0;
  int64_t tok_count = 0;
  if (resume_from_.empty() && hooks_->enabled() && cfg_.hooks.spectral && master_is_sharded())
    refresh_master_cache();
  if (resume_from_.empty() && lead()) hooks_->at_start();
  // Between steps: a failed train.log write ends the run (rank 0; abort_all ends the others);
  // a stop signal on any rank stops every rank after the same step.
  auto poll_stop = [&] {
    if (lead() && !log_error_.empty())
      fail(dir_, "/train.log: ", log_error_, "; the run stops (free space, then --resume)");
    int sig = stop_signal::pending();
    if (world_ > 1) {
      std::vector<double> v(world_, 0.0);
      v[rank_] = sig;
      comm_->all_reduce_host(v.data(), world_, "the stop-signal check");
      sig = 0;
      for (double x : v)
        if (x > 0) {
          sig = static_cast<int>(x);
          break;
        }
    }
    return sig;
  };
  int stop_sig = poll_stop();
  while (step_ < stop && !stop_sig) {
    const int64_t s = step_ + 1;
    inject_fault(rank_, s, "step");
    const auto t0 = std::chrono::steady_clock::now();
    const DataLoader::State data_at_start = train_loader_->state();
    if (lead()) hooks_->begin_step(s);
    model_->zero_grad();
    // Micro-batch a of rank r is micro-batch a * world + r of the step (data/loader.h); its
    // loss goes to that slot, and the slots are added in order, as one process adds them.
    std::vector<double> slot(AW, 0.0);
    for (int a = 0; a < A; ++a) {
      train_loader_->next(x.data(), y.data());
      model_->forward(x.data(), y.data(), B, T);
      slot[a * world_ + rank_] = model_->mean_loss();
      if (a == A - 1 && lead()) hooks_->before_last_backward(s);
      model_->backward(AW);
    }
    const auto tc0 = std::chrono::steady_clock::now();  // communication time of the step
    if (world_ > 1) comm_->all_reduce_host(slot.data(), AW, "the losses of step " + std::to_string(s));
    double loss = 0;
    for (int k = 0; k < AW; ++k) {
      if (!std::isfinite(slot[k]))
        collective_fail("step " + std::to_string(s) + ": the training loss is " +
                        std::to_string(slot[k]) + "; stopping (last good checkpoint: " +
                        last_ckpt_ + "). Lower train.lr, raise train.warmup_steps or use a wider "
                        "precision.compute");
      loss += slot[k] / AW;
    }
    // Gradients: summed over ranks in rank order (dist/comm.h); ZeRO-1 keeps only this
    // rank's shard of the sum.
    const bool hook_step = hooks_->is_hook_step(s);
    if (world_ > 1) {
      if (comm_->device_buffers()) be_->synchronize();
      const std::string what = "the gradients of step " + std::to_string(s);
      if (zero_) {
        comm_->reduce_scatter(grads.raw(), shard_, grads.dtype(), fmt, what);
        if (hook_step && cfg_.hooks.grad_norms)  // the hooks read the whole gradient
          comm_->all_gather(grads.raw(), shard_, grads.dtype(), what);
      } else {
        comm_->all_reduce(grads.raw(), grads.numel(), grads.dtype(), fmt, what);
      }
    }
    double comm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc0).count();
    if (lead()) hooks_->after_backward(s);
    const float lr = sched.at(static_cast<int>(step_));
    std::optional<double> ss;
    const auto tc1 = std::chrono::steady_clock::now();
    if (zero_ || cfg_.hooks.spike_z > 0) ss = grad_sum_squares_global();
    if (zero_) comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - tc1).count();
    SpikeDecision spike;
    if (cfg_.hooks.spike_z > 0) {
      if (lead())
        spike = hooks_->check_spike(s, loss, std::sqrt(*ss) / model_->loss_scaler().scale());
      if (world_ > 1) {
        uint8_t d[3] = {spike.spike, spike.snapshot, spike.skip};
        comm_->broadcast_host(d, sizeof d, 0, "the spike decision of step " + std::to_string(s));
        spike.spike = d[0], spike.snapshot = d[1], spike.skip = d[2];
      }
      if (spike.snapshot) save_spike_snapshot(s, elapsed(), data_at_start);
    }
    StepStats st;
    if (spike.skip) {
      st.grad_norm = std::sqrt(*ss) / model_->loss_scaler().scale();
      st.loss_scale = model_->loss_scaler().scale();
    } else {
      st = model_->step(lr, oc, ss);
      if (zero_ && !st.skipped) {  // every rank updated its shard: share them
        const auto tc2 = std::chrono::steady_clock::now();
        if (comm_->device_buffers()) be_->synchronize();
        comm_->all_gather(params.raw(), shard_, params.dtype(),
                          "the parameters of step " + std::to_string(s));
        comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - tc2).count();
      }
    }
    if (st.skipped && !model_->loss_scaler().enabled())
      collective_fail("step " + std::to_string(s) +
                      ": non-finite gradients; stopping (last good checkpoint: " + last_ckpt_ + ")");
    if (st.skipped && lead()) hooks_->event(s, "overflow", {{"loss_scale", st.loss_scale}});
    ++step_;
    if (hook_step && cfg_.hooks.spectral && master_is_sharded()) refresh_master_cache();
    if (lead()) hooks_->after_update(step_);
    res.step_rss_bytes = std::max(res.step_rss_bytes, rss_bytes("VmRSS:"));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = static_cast<double>(B) * T * AW / dt;
    tok_time += dt;
    res.comm_seconds += comm_s;
    tok_count += static_cast<int64_t>(B) * T * AW;
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
    stop_sig = poll_stop();
  }
  if (stop_sig) {
    const char* name = stop_sig == SIGINT ? "SIGINT" : stop_sig == SIGTERM ? "SIGTERM" : "a signal";
    if (step_ > 0 && last_ckpt_step_ != step_) res.weights_sha256 = save(step_, elapsed());
    if (step_ > 0)
      log_->warn("stopped by {} after step {}: checkpoint {} written; continue with: train "
                 "--config {}/config.yaml --resume", name, step_, last_ckpt_, dir_);
    else
      log_->warn("stopped by {} before the first step; nothing to resume (start again with "
                 "--overwrite)", name);
    res.stop_signal = stop_sig;
  }
  res.last_step = step_;
  res.tokens_per_s = tok_time > 0 ? tok_count / tok_time : 0;
  if (res.weights_sha256.empty()) {
    const auto w = whole_master_bytes();
    res.weights_sha256 = sha256_hex(w.data(), w.size());
  }
  if (step_ == max_steps && cfg_.train.sample_tokens > 0 && lead()) {
    res.sample = sample();
    log_->info("sample:\n{}", res.sample);
  }
  if (hooks_->enabled() || hooks_->seconds() > 0) {
    const double total = elapsed() - elapsed_prev_;
    log_->info("hooks: {:.2f} s of this invocation's {:.1f} s ({:.1f}%)", hooks_->seconds(), total,
               total > 0 ? 100.0 * hooks_->seconds() / total : 0.0);
  }
  res.hook_seconds = hooks_->seconds();
  if (world_ > 1)
    log_->info("communication (rank 0): {:.2f} s of {:.2f} s in training steps ({:.1f}%): losses, "
               "gradients{}", res.comm_seconds, tok_time,
               tok_time > 0 ? 100.0 * res.comm_seconds / tok_time : 0.0,
               zero_ ? ", norm partial sums, parameters" : "");
  res.optimizer_bytes = model_->optimizer_bytes();
  res.peak_rss_bytes = rss_bytes();
  // Every rank's memory into rank 0's log: the optimizer state it allocated, the largest
  // resident set right after an update (training steps), and the peak (with evaluation and
  // the transient checkpoint buffers).
  std::vector<double> mem(3 * world_, 0.0);
  mem[3 * rank_] = static_cast<double>(res.optimizer_bytes);
  mem[3 * rank_ + 1] = static_cast<double>(res.step_rss_bytes);
  mem[3 * rank_ + 2] = static_cast<double>(res.peak_rss_bytes);
  if (world_ > 1) comm_->all_reduce_host(mem.data(), 3 * world_, "the memory report");
  for (int r = 0; r < world_; ++r)
    log_->info("memory: rank {}: optimizer state {} bytes ({:.1f} MiB), RSS after an update "
               "{:.1f} MiB, peak RSS {:.1f} MiB", r, static_cast<int64_t>(mem[3 * r]),
               mem[3 * r] / 1048576.0, mem[3 * r + 1] / 1048576.0, mem[3 * r + 2] / 1048576.0);
  log_->info("done: {} steps, {:.0f} tokens/s, val_loss {:.4f}, run directory {}", step_,
             res.tokens_per_s, res.val_loss, dir_);
  if (lead()) {
    log_->flush();
    if (!log_error_.empty()) fail(dir_, "/train.log: ", log_error_);
    metrics_.sync();  // on disk before the exit status says the run is done
  }
  spdlog::drop("train");
  comm_->finalize();
  return res;
}

}  // namespace

std::string latest_checkpoint(const std::string& dir) {
  const auto all = list_checkpoints(dir);
  return all.empty() ? "" : all.back().second;
}

std::string rank_checkpoint_name(int64_t step, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt_%08lld.rank%d.bin", static_cast<long long>(step), rank);
  return buf;
}

TrainResult run_training(const Config& cfg, const TrainOptions& opt) {
  Run r(cfg, opt);
  try {
    return r.go();
  } catch (const std::exception& e) {
    if (r.distributed()) r.abort_all(e);  // does not return
    r.finalize_quietly();
    throw;
  }
}

}  // namespace st
