// run_training: one invocation of `train`. This file sets a run up, in this order, so that
// everything that can be refused (config, data, model) is refused before any file is
// written: ranks and communicator (dist.*), backend, data and tokenizer, model (with
// model.init_from), then the run directory (lock, --overwrite, --resume checks) and its
// logs. It also holds the error handling across ranks and the fault injection of the
// failure tests. The step loop is in train/step_loop.cpp, checkpoints and resume in
// train/run_checkpoints.cpp; train/run.h declares the Run object they share.
#include "train/trainer.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "backends/backends.h"
#include "backends/cpu_threads.h"
#include "io/weights.h"
#include "train/run.h"

namespace fs = std::filesystem;

namespace st {
namespace {

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

}  // namespace

namespace detail {

// STABLETRAIN_FAULT=RANK:STEP:WHERE:MODE (tests of failure handling, docs/distributed.md):
// rank RANK, at step STEP, WHERE = step (start of the step), ckpt (after writing its
// checkpoint shard, before the main file), ckpt_written (after the main file, before its
// metrics record) or resume (STEP = the checkpoint's step: after the logs were cut back to
// it, before the checkpoint record is re-derived); MODE = exit (dies at once, no MPI
// cleanup), kill (SIGKILL to itself), hang (sleeps forever), wait_signal (waits up to 120 s
// for SIGINT/SIGTERM, then goes on: a stop at a known step) or error (throws, like a failed
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
  if (parts[3] == "wait_signal") {
    for (int i = 0; i < 1200 && !stop_signal::pending(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return;
  }
  fail("injected failure at step ", step, " (", where, "; STABLETRAIN_FAULT)");
}

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
  // CPU threads per rank: the node's cores shared by its ranks unless set (auto chooses
  // among at most that many).
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const bool share_cores = cfg_.run.threads == 0 || cfg_.run.threads == kAutoInt;
  if (world_ > 1 && !cuda && share_cores && !(omp && *omp) && local_size) {
    const int ranks_here = std::max(1, std::atoi(local_size));
    const int cores = cpu_cores_available();
    const int per_rank = std::max(1, cores / ranks_here);
    if (cfg_.run.threads == 0) cfg_.run.threads = per_rank;
    max_threads_ = per_rank;
    threads_note_ = "run.threads " + std::string(cfg_.run.threads == kAutoInt ? "auto" : "0") +
                    " under mpirun: " + (cfg_.run.threads == kAutoInt ? "at most " : "") +
                    std::to_string(per_rank) + " threads per rank (" + std::to_string(cores) +
                    " cores, " + std::to_string(ranks_here) + " ranks on this node)";
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

// Read-only and before the lock is taken (the lock file records its holder's PID): a
// finished run's directory stays byte for byte as it was. The newest checkpoint's step is
// read from its name (list_checkpoints); a damaged file is no reason to train, so it is not
// read.
std::string Run::nothing_to_do() {
  std::string line;
  int64_t at = -1;
  on_lead([&] {
    const std::string dir = cfg_.run.out_dir;
    std::error_code ec;
    if (dir.empty() || !fs::is_directory(dir, ec)) return;
    const auto all = list_checkpoints(dir);
    if (all.empty()) return;
    const std::string& ckpt = all.back().second;
    at = all.back().first;
    if (at >= cfg_.train.max_steps)
      line = "nothing to do: run finished at step " + std::to_string(at) + " (" + ckpt + ")";
    else if (opt_.stop_after >= 0 && at >= opt_.stop_after)
      line = "nothing to do: run at step " + std::to_string(at) + " (" + ckpt +
             "), --stop-after " + std::to_string(opt_.stop_after);
  });
  line = share_string(line);
  if (!line.empty()) step_ = std::stoll(share_string(std::to_string(at)));
  return line;
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

std::string Run::memory_line() const {
  return memory_.line() + "; available " +
         (available_.bytes < 0 ? std::string("unknown") : format_bytes(available_.bytes)) +
         " (" + (available_.bytes < 0 ? "neither cgroup nor /proc/meminfo readable" : available_.source) +
         ")";
}

void Run::build() {
  check_reference_run(cfg_);
  const DataSpec ds = data_spec(cfg_);
  auto load = [&] {
    data_ = load_token_data(ds, [this](const std::string& line) {
      data_notes_.push_back(line);
      if (opt_.console && lead()) {  // as it happens (preparing shards takes a while)
        std::printf("data: %s\n", line.c_str());
        std::fflush(stdout);
      }
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
  OptimShard shard;
  if (zero_) {
    shard_ = Partition(num_parameters(mc), world_, kSumSquaresChunk);
    shard = {shard_.begin(rank_), shard_.end(rank_)};
  }
  // The memory estimate, from the model's own allocation list, before anything is
  // allocated; a CPU run that cannot fit is refused here, before the run directory is touched.
  if (be_->device() == Device::CPU) {
    memory_ = estimate_memory(cfg_, mc, *be_, zero_ ? shard.end - shard.begin : -1, 0);
    available_ = available_memory();
    const std::string why = memory_refusal(memory_, available_, cfg_);
    if (!why.empty()) fail(why);
    // On the console at once (the model's allocation and initialisation take seconds for
    // GPT-2 small); train.log gets the line when it opens (Run::go).
    if (opt_.console && lead()) {
      std::printf("%s\n", memory_line().c_str());
      std::fflush(stdout);
    }
  }
  model_ = std::make_unique<GPT2>(mc, *be_, compute_format(cfg_), ac, loss_scaler_config(cfg_),
                                  shard);
  model_->set_grad_accum_mode(grad_accum_mode(cfg_));
  model_->set_recompute(recompute_mode(cfg_));
  if (master_is_sharded() && lead()) model_->set_master_source([this] { return master_cache_; });
  model_->init_weights(cfg_.run.seed);
  if (!init.params.empty()) model_->set_master_fp32(init.params);
  const int B = cfg_.train.batch_size, T = cfg_.train.seq_len;
  train_loader_ =
      std::make_unique<DataLoader>(data_.train, B, T, cfg_.run.seed, true, rank_, world_);
  val_loader_ = std::make_unique<DataLoader>(data_.val, B, T, cfg_.run.seed, false);
  rng_.reseed(cfg_.run.seed ^ 0x5eed5eed5eedull);
}

}  // namespace detail

TrainResult run_training(const Config& cfg, const TrainOptions& opt) {
  detail::Run r(cfg, opt);
  try {
    return r.go();
  } catch (const WriteError& e) {  // a full disk: say how to go on from what is on disk
    const Error with_advice(std::string(e.what()) + r.after_write_error());
    if (r.distributed()) r.abort_all(with_advice);
    r.finalize_quietly();
    throw with_advice;
  } catch (const std::exception& e) {
    if (r.distributed()) r.abort_all(e);  // does not return
    r.finalize_quietly();
    throw;
  }
}

}  // namespace st
