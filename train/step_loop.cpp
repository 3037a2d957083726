// The step loop (Run::go), evaluation, the text sample and metrics.jsonl.
// Order of one step (fixed, so runs are reproducible):
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
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "backends/cpu_threads.h"
#include "optim/schedule.h"
#include "train/memory_estimate.h"
#include "train/progress.h"
#include "train/run.h"

namespace st::detail {
namespace {

// Peak (VmHWM) or current (VmRSS) resident set of this process, 0 if unknown.
size_t rss_bytes(const char* field = "VmHWM:") {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field))) * 1024;
  return 0;
}

}  // namespace

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
  if (opt_.resume) {  // a finished run: say so, run nothing, touch nothing
    TrainResult idle;
    idle.nothing_to_do = nothing_to_do();
    if (!idle.nothing_to_do.empty()) {
      if (opt_.console && lead()) std::printf("%s\n", idle.nothing_to_do.c_str());
      idle.rank = rank_;
      idle.world = world_;
      idle.first_step = idle.last_step = step_;
      comm_->finalize();
      return idle;
    }
  }
  build();  // everything that can be refused (config, data, model) before any file is written
  prepare_dir();
  open_logs();
  hooks_ = std::make_unique<StabilityHooks>(cfg_, *model_, dir_, log_);
  if (!resume_from_.empty()) restore(resume_from_);
  if (lead()) {
    write_file_atomic(dir_ + "/config.yaml", config_to_yaml(cfg_));
    metrics_ = LogFile(dir_ + "/metrics.jsonl");
    write_config_changes();
  }
  const auto& mc = model_->config();
  log_->info("stabletrain: {} on {} | GPT-2 L={} H={} C={} T={} V={} ({:.2f}M params) | {}",
             cfg_.run.name, be_->name(), mc.n_layer, mc.n_head, mc.n_embd, mc.max_seq_len,
             mc.vocab_size, model_->num_params() / 1e6, cfg_.precision.compute);
  {
    // The data preparation lines and the memory estimate were printed on the console as
    // they happened (Run::build): train.log gets them once more, the console not.
    const bool on_console = opt_.console && lead();
    std::unique_ptr<spdlog::logger> file_only;  // (train.log is the first sink: open_logs)
    if (on_console) file_only = std::make_unique<spdlog::logger>("train.log", log_->sinks().front());
    spdlog::logger& early = on_console ? *file_only : *log_;
    for (const std::string& l : data_notes_) early.info("data: {}", l);
    log_->info("data: {}", data_.description);
    if (!memory_.resident.empty()) early.info("{}", memory_line());
  }
  const int B = cfg_.train.batch_size, T = cfg_.train.seq_len, A = cfg_.train.grad_accum_steps;
  if (world_ > 1) {
    log_->info("data parallel: {} ranks ({}), {} micro-batches of {} x {} per rank and step, "
               "global batch {} tokens{}",
               world_, comm_->name(), A, B, T, static_cast<int64_t>(B) * T * A * world_,
               zero_ ? ", ZeRO-1 (optimizer state sharded)" : "");
    if (!threads_note_.empty()) log_->info("{}", threads_note_);
  }
  // CPU threads: fixed, or chosen by measurement (run.threads auto; cpu_threads.h). Every
  // CPU kernel gives the same bits for any count, so switching changes no result.
  std::unique_ptr<ThreadTuner> tuner;
  if (be_->device() == Device::CPU) {
    std::string how = std::to_string(cpu_threads()) + " threads";
    if (cfg_.run.threads == kAutoInt) {
      const char* omp = std::getenv("OMP_NUM_THREADS");
      const int most = max_threads_ > 0      ? max_threads_
                       : omp && std::atoi(omp) > 0 ? std::atoi(omp)
                                                   : cpu_cores_available();
      tuner = std::make_unique<ThreadTuner>(thread_candidates(most));
      how = "auto (the fastest of";
      for (int n : tuner->candidates()) how += " " + std::to_string(n);
      how += " threads, measured over the first steps and again every 100 steps or when the "
             "step time changes by 1.5x)";
    }
    log_->info("cpu: {}; OpenMP wait policy {}; BLAS {}", how, omp_wait_policy_description(),
               blas_description());
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
  RecentEta eta(step_);
  // What the schedule still holds from step s on (its own evaluation and checkpoint, which
  // follow its log line, included), up to train.max_steps: the periodic lines' ETA.
  auto left_from = [&](int64_t s) {
    RecentEta::Left l;
    l.steps = max_steps - s;
    const int64_t first = s - 1;  // step s's own evaluation and checkpoint are still to come
    auto due = [&](int64_t every) {
      if (max_steps <= first) return int64_t{0};
      const int64_t n = every > 0 ? max_steps / every - first / every : 0;
      return n + (every > 0 && max_steps % every == 0 ? 0 : 1);  // the run's last step has both
    };
    l.evals = due(cfg_.train.eval_every);
    l.checkpoints = due(cfg_.train.ckpt_every);
    l.hook_steps = hooks_->schedule().hook_steps_after(s);  // 0 with the hooks off
    return l;
  };
  StepTiming timing(step_, [] {  // STABLETRAIN_TIMING_AFTER_S: tests print the line sooner
    const char* v = std::getenv("STABLETRAIN_TIMING_AFTER_S");
    return v && *v ? std::atof(v) : StepTiming::kMinSeconds;
  }());
  if (resume_from_.empty() && hooks_->enabled() && cfg_.hooks.spectral && master_is_sharded())
    refresh_master_cache();
  if (resume_from_.empty() && lead()) hooks_->at_start();
  // Between steps: a failed train.log write ends the run (rank 0; abort_all ends the others);
  // a stop signal on any rank stops every rank after the same step.
  auto poll_stop = [&] {
    if (lead() && !log_error_.empty())
      fail_write(dir_, "/train.log: ", log_error_, "; the run stops");
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
    if (tuner) set_cpu_threads(tuner->current());
    const bool probe_step = tuner && tuner->probing();
    const auto t0 = std::chrono::steady_clock::now();
    const DataLoader::State data_at_start = train_loader_->state();
    if (lead()) hooks_->begin_step(s);
    model_->zero_grad();
    // Micro-batch a of rank r is micro-batch a * world + r of the step (data/loader.h); its
    // loss goes to that slot, and the slots are added in order, as one process adds them.
    std::vector<double> slot(AW, 0.0);
    for (int a = 0; a < A; ++a) {
      train_loader_->next(x.data(), y.data());
      if (a == A - 1 && lead()) hooks_->before_last_backward(s);
      // One classifier pass for the loss and dlogits (GPT2::forward_backward).
      model_->forward_backward(x.data(), y.data(), B, T, AW);
      slot[a * world_ + rank_] = model_->mean_loss();
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
    if (std::string why; tuner && !hook_step && !spike.spike && tuner->record(dt, &why))
      log_->info("step {}: run.threads auto: {}", step_, why);
    tok_time += dt;
    res.comm_seconds += comm_s;
    tok_count += static_cast<int64_t>(B) * T * AW;
    res.losses.push_back(static_cast<float>(loss));
    nlohmann::ordered_json j = {{"kind", "train"},         {"step", step_},
                                {"loss", loss},            {"lr", lr},
                                {"grad_norm", st.grad_norm}, {"tokens_per_s", tps},
                                {"elapsed", elapsed()}};
    if (model_->loss_scaler().enabled()) {
      j["loss_scale"] = st.loss_scale;
      j["skipped"] = st.skipped;
    }
    if (spike.spike) j["spike"] = true;
    if (spike.skip) j["spike_skipped"] = true;
    write_metrics(j);
    eta.step(step_, elapsed() - elapsed_prev_, dt, hook_step);
    if (step_ % cfg_.train.log_every == 0 || step_ == stop) {
      log_->info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad {:.3f} | {:.0f} tok/s | ETA {}{}",
                 step_, max_steps, loss, lr, st.grad_norm, tps,
                 format_eta(eta.eta(left_from(step_))),
                 st.skipped ? " | skipped (fp16 overflow)" : "");
    }
    if (timing.add(step_, dt, hook_step || probe_step, elapsed() - elapsed_prev_))
      log_->info("{}", timing_line(timing, max_steps - step_));
    const bool last = step_ == stop;
    if ((cfg_.train.eval_every > 0 && step_ % cfg_.train.eval_every == 0) || last) {
      const auto te = std::chrono::steady_clock::now();
      res.val_loss = evaluate();
      if (!std::isfinite(res.val_loss))  // the same value on every rank
        collective_fail("step " + std::to_string(step_) + ": the validation loss is " +
                        std::to_string(res.val_loss) + "; stopping before this step's "
                        "checkpoint (last good checkpoint: " + last_ckpt_ + "). Lower train.lr, "
                        "raise train.warmup_steps or use a wider precision.compute");
      eta.evaluation(std::chrono::duration<double>(std::chrono::steady_clock::now() - te).count());
      log_->info("step {:>6} | val_loss {:.4f}", step_, res.val_loss);
      write_metrics({{"kind", "eval"}, {"step", step_}, {"val_loss", res.val_loss},
                     {"elapsed", elapsed()}});
    }
    if ((cfg_.train.ckpt_every > 0 && step_ % cfg_.train.ckpt_every == 0) || last) {
      const auto tk = std::chrono::steady_clock::now();
      res.weights_sha256 = save(step_, elapsed());
      eta.checkpoint(std::chrono::duration<double>(std::chrono::steady_clock::now() - tk).count());
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

}  // namespace st::detail
