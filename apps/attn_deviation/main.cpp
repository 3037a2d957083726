// attn_deviation: attention numerics experiments on the CPU head lab (attention/head_cpu.h).
//   attn_deviation run   [--KEY VALUE ...] [--csv F] [--plan]   one configuration, any axis
//   attn_deviation sweep --plan-file P.yaml [--group G] [--csv F] [--plan]
//   attn_deviation bias  [flags] [--csv F] [--plan]             Qiu & Yao tied-maximum bias
//   attn_deviation apply --qkv IN.bin --B --T --NH --hs --backend K --out OUT.bin [flags]
//                        a production backend's forward on given inputs (apply.cpp)
// docs/numerics.md describes the lab, its rounding conventions and the committed results.
// Files: run.cpp (run), sweep.cpp (plans and ratio tables), bias.cpp (bias report),
// apply.cpp (apply), common.cpp (CSV, JSON sidecar, summaries).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "attention/experiments.h"
#include "core/error.h"
#include "apps/attn_deviation/apply.h"
#include "apps/attn_deviation/bias.h"
#include "apps/attn_deviation/common.h"

using namespace st;
using namespace st::attn_tool;

namespace {

// A format override flag: "" or auto (the rule's) or a format; errors name the flag.
std::optional<DType> format_flag(const std::string& flag, const std::string& v) {
  try {
    return v.empty() ? std::nullopt : parse_point_format(v);
  } catch (const Error& e) {
    fail("attn_deviation bias ", flag, ": ", e.what());
  }
}

// CPU seconds of the bias experiment (cost model of the 2-core development machine).
double bias_estimate(const BiasConfig& bc) {
  const double calls = (bc.rows + bc.rows_per_call - 1) / bc.rows_per_call;
  const double backends = 2.0 + bc.betas.size() + (bc.baseline ? 1 : 0);  // + golden
  double per = static_cast<double>(bc.rows_per_call) * bc.keys * bc.d * 0.85e-9;
  if (bc.deltas) per *= 1 + 2.0 * bc.douts.size();  // dp_p and fp32_recompute redo the forward
  return calls * bc.kinds.size() * bc.accums.size() * backends * per;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmdline = command_line(argc, argv);
  CLI::App app{"attention numerics experiments (CPU emulation of every rounding point)"};
  app.require_subcommand(1);

  // ---- run
  auto* run = app.add_subcommand("run", "one configuration against an FP64 golden");
  std::map<std::string, std::string> values;
  for (const auto& k : deviation_spec_keys()) {
    std::string names = std::string("--") + k.name;
    std::string dashed = k.name;
    for (char& c : dashed) c = c == '_' ? '-' : c;
    if (dashed != k.name) names += ",--" + dashed;
    run->add_option(names, values[k.name], k.help);
  }
  int run_threads = 0;
  std::string run_csv;
  bool run_plan = false;
  run->add_option("--threads", run_threads, "OpenMP threads over heads (0: default)");
  run->add_option("--csv", run_csv, "write one row per head here (and FILE.json beside it)");
  run->add_flag("--plan", run_plan, "print the estimated time, run nothing");

  // ---- sweep
  auto* sweep = app.add_subcommand("sweep", "the runs of a YAML plan, with ratio tables");
  std::string plan_file, sweep_csv, group;
  int sweep_threads = 0;
  bool sweep_plan = false;
  sweep->add_option("--plan-file", plan_file, "plan (e.g. bench/plans/deviation_sweep.yaml)")
      ->required();
  sweep->add_option("--group", group, "run only this group of the plan");
  sweep->add_option("--csv", sweep_csv,
                    "per-head rows of every run here; ratios in FILE_ratios.csv; FILE.json");
  sweep->add_option("--threads", sweep_threads, "OpenMP threads over heads (0: default)");
  sweep->add_flag("--plan", sweep_plan, "list the runs and the estimated time, run nothing");

  // ---- bias
  auto* bias = app.add_subcommand("bias", "Qiu & Yao tied-maximum bias of O and delta");
  BiasConfig bc;
  std::string bias_csv, v_dist = bc.v.str(), compute = "bf16";
  std::string scores, probs, lsum, lsum_mac, out;
  std::vector<std::string> kinds, douts, accums;
  bool no_deltas = false, no_baseline = false, bias_plan = false;
  bias->add_option("--rows", bc.rows, "rows per row kind");
  bias->add_option("--rows-per-call,--rows_per_call", bc.rows_per_call,
                   "query rows per head call (they share V; the SE is over calls)");
  bias->add_option("--keys,--T", bc.keys, "keys per row");
  bias->add_option("--d", bc.d, "head dim");
  bias->add_option("--block-k,--block_k", bc.block_k, "flash key tile");
  bias->add_option("--ties", bc.ties, "tied maxima per tied row");
  bias->add_option("--top", bc.top, "score of the maximum");
  bias->add_option("--top-spread,--top_spread", bc.top_spread,
                   "each row's maximum is top + U(-spread/2, spread/2) (0: every row at top)");
  bias->add_option("--gap-lo,--gap_lo", bc.gap_lo, "other keys at least this far below");
  bias->add_option("--gap-hi,--gap_hi", bc.gap_hi, "other keys at most this far below");
  bias->add_option("--v", v_dist, "V distribution: normal:MEAN:STD | uniform:LO:HI | outliers:MEAN:STD:FRAC:SCALE");
  bias->add_option("--compute", compute, "compute format: bf16 | fp16");
  bias->add_option("--scores", scores, "override: format of S");
  bias->add_option("--probs", probs, "override: format of P~");
  bias->add_option("--lsum", lsum, "override: format of the row sum l (fp32: the remedy for 3+ ties)");
  bias->add_option("--lsum-mac,--lsum_mac", lsum_mac, "override: partial sums of l");
  bias->add_option("--out", out, "override: format of the stored O");
  bias->add_option("--betas", bc.betas, "stabilized flash betas")->delimiter(',');
  std::string tie_shift = "beta";
  bias->add_option("--tie-shift,--tie_shift", tie_shift,
                   "stabilized flash's shifted maximum: beta | exact_sum (the remedy for 3+ ties)");
  std::string o_tilde_scope = "all";
  bias->add_option("--o-tilde-bits,--o_tilde_bits", bc.o_tilde_bits,
                   "flash and stabilized flash: O~ with this many fraction bits (0: in the "
                   "accumulator; 1..6 with bf16_accum)");
  bias->add_option("--o-tilde-gain,--o_tilde_gain", bc.o_tilde_gain,
                   "flash and stabilized flash: O~'s rounding error times this gain (>= 1; "
                   "0: off), instead of --o-tilde-bits");
  bias->add_option("--o-tilde-scope,--o_tilde_scope", o_tilde_scope,
                   "where --o-tilde-bits acts: all | tied | untied_matched (a call's rows are "
                   "one kind, so untied_matched narrows nothing here)");
  bias->add_option("--kinds", kinds, "row kinds: tied_tile,tied_any,single,diffuse")->delimiter(',');
  bias->add_option("--accums", accums, "accumulators: bf16_accum,fp32_accum")->delimiter(',');
  bias->add_option("--douts", douts, "dO kinds: ones,normal")->delimiter(',');
  bias->add_flag("--no-deltas", no_deltas, "O only");
  bias->add_flag("--no-baseline", no_baseline, "without baseline attention");
  bias->add_option("--seed", bc.seed, "seed");
  bias->add_option("--threads", bc.threads, "OpenMP threads (0: default)");
  bias->add_option("--csv", bias_csv, "write the series here (and FILE.json beside it)");
  bias->add_flag("--plan", bias_plan, "print the estimated time, run nothing");

  // ---- apply
  auto* apply = app.add_subcommand(
      "apply", "a production backend's forward (the trainer's path) on a raw bf16 qkv file");
  ApplyArgs aa;
  apply->add_option("--qkv", aa.qkv, "input: raw bf16, shape (B, T, 3 NH hs), GPT-2's packed qkv")
      ->required();
  apply->add_option("--B", aa.B, "batch")->required();
  apply->add_option("--T", aa.T, "sequence length")->required();
  apply->add_option("--NH", aa.NH, "heads")->required();
  apply->add_option("--hs", aa.hs, "head size")->required();
  apply->add_option("--backend", aa.backend, "baseline | flash | stabilized_flash | cudnn")
      ->required();
  apply->add_option("--device", aa.device, "cpu | cuda");
  apply->add_option("--compute", aa.compute,
                    "compute format: bf16 (default) | fp32 | fp64 (CPU; fp64 baseline = the "
                    "lab's golden); O is written in it");
  apply->add_option("--accum", aa.accum, "override attention.accum: auto | fp32 | bf16");
  apply->add_option("--beta", aa.beta, "stabilized_flash's beta")
      ->each([&](const std::string&) { aa.beta_given = true; });
  apply->add_option("--block-q,--block_q", aa.block_q, "flash query tile (default 64)")
      ->each([&](const std::string&) { aa.block_q_given = true; });
  apply->add_option("--block-k,--block_k", aa.block_k, "flash key tile (default 64)")
      ->each([&](const std::string&) { aa.block_k_given = true; });
  apply->add_option("--cuda-kernel,--cuda_kernel", aa.cuda_kernel, "mma_sync | sm90 (GPU flash)");
  apply->add_flag("--causal", aa.causal, "causal mask (default: non-causal)");
  apply->add_option("--chunk", aa.chunk, "batch rows per forward call (0: all)");
  apply->add_option("--threads", aa.threads, "CPU backend threads (0: default)");
  apply->add_option("--out", aa.out, "output O (B, T, NH hs), raw in the compute format")
      ->required();
  apply->add_option("--lse", aa.lse, "output lse (B, NH, T), raw float32 (float64 for fp64)");

  // Command-line errors are one line (CLI11's own message and a pointer to --help).
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n') c = ' ';
    std::fprintf(stderr, "attn_deviation: %s (--help lists the flags)\n", msg.c_str());
    return e.get_exit_code();
  }
  try {
    if (*apply) return apply_cmd(aa);
    if (*run) {
      std::vector<std::pair<std::string, std::string>> settings;
      for (const auto& k : deviation_spec_keys()) {
        if (!run->count(std::string("--") + k.name)) continue;
        settings.emplace_back(k.name, values[k.name]);
      }
      const bool tile = run->count("--tile") > 0;
      if (tile && (run->count("--block_q") || run->count("--block_k")))
        fail("attn_deviation run: --tile sets both tiles; give it or --block-q/--block-k, not both");
      return run_cmd(settings, run_threads, run_csv, run_plan, cmdline);
    }
    if (*sweep) return sweep_cmd(plan_file, sweep_threads, sweep_csv, sweep_plan, group, cmdline);
    bc.v = parse_input_dist(v_dist, "attn_deviation bias --v");
    const auto cf = format_flag("--compute", compute);
    if (!cf) fail("attn_deviation bias --compute: 'auto' is not a compute format (bf16 or fp16)");
    bc.compute = *cf;
    bc.scores = format_flag("--scores", scores);
    bc.probs = format_flag("--probs", probs);
    bc.lsum = format_flag("--lsum", lsum);
    bc.lsum_mac = format_flag("--lsum-mac", lsum_mac);
    bc.out = format_flag("--out", out);
    if (!kinds.empty()) {
      bc.kinds.clear();
      for (const auto& k : kinds) bc.kinds.push_back(parse_bias_rows(k));
    }
    if (!douts.empty()) {
      bc.douts.clear();
      for (const auto& k : douts) bc.douts.push_back(parse_dout_kind(k));
    }
    if (!accums.empty()) {
      bc.accums.clear();
      for (const auto& a : accums) {
        if (a == "bf16_accum") bc.accums.push_back(BiasAccum::Bf16);
        else if (a == "fp32_accum") bc.accums.push_back(BiasAccum::Fp32);
        else fail("attn_deviation bias --accums: '", a, "' (expected bf16_accum or fp32_accum)");
      }
    }
    bc.tie_shift = parse_tie_shift(tie_shift);
    try {
      bc.o_tilde_scope = parse_o_tilde_scope(o_tilde_scope);
    } catch (const Error& e) {
      fail("attn_deviation bias --o-tilde-scope: ", e.what());
    }
    if (bc.o_tilde_scope != OTildeScope::All && !bc.o_tilde_bits && !bc.o_tilde_gain)
      fail("attn_deviation bias --o-tilde-scope ", o_tilde_scope,
           " needs --o-tilde-bits (e.g. 2) or --o-tilde-gain");
    bc.deltas = !no_deltas;
    bc.baseline = !no_baseline;
    std::fprintf(stderr, "attn_deviation bias: estimated %s of CPU time\n",
                 duration(bias_estimate(bc)).c_str());
    if (bias_plan) return 0;
    const BiasReport rep = run_bias_experiment(bc);
    print_bias(bc, rep, cmdline);
    if (!bias_csv.empty()) write_bias_csv(bias_csv, bc, rep, cmdline);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_deviation: %s\n", e.what());
    return 1;
  }
  return 0;
}
