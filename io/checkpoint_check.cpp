// The value checks of a checkpoint state (io/checkpoint_check.h). A checksum only proves
// the file is what its writer wrote, so load_checkpoint then checks the values too
// ("inconsistent checkpoint: <field> = <value>, expected ..."):
//   0 <= step <= 99,999,999 (8-digit checkpoint names); 0 <= adam_step <= step;
//   compute one of fp32, bf16, fp16, fp64; fp16: 1 <= loss_scale <= 2^24 (the loss
//   scaler's bounds) and loss_scale_good_steps >= 0, other formats: loss_scale exactly 1
//   and loss_scale_good_steps 0;
//   the shape records within check_model_shape's bounds (model/gpt2.h), padded_vocab_size
//   >= vocab_size; master_elem_bytes 4 or 8, master/m/v of equal sizes, a multiple of it;
//   master of exactly num_parameters(shape) values (rank files: shard_end - shard_begin,
//   with 0 <= shard_begin <= shard_end <= num_parameters, shard_rank < optim_shards);
//   1 <= dist_world <= 2^20, optim_shards 0 or dist_world, shard_rank >= -1 and no shard
//   range without a shard_rank; rng_state and data_state empty (a file not written by the
//   trainer) or exactly as Rng::State / DataLoader::State::from_bytes accept them;
//   config_yaml empty or UTF-8 text of a YAML mapping whose model.{n_layer, n_head, n_embd,
//   max_seq_len, vocab_size}, where present, are the decimal values of the shape records
//   and whose precision.compute, where present, is the compute record.
// save_checkpoint runs check_arrays only (the structure: array sizes, shard fields).
#include "io/checkpoint_check.h"

#include <yaml-cpp/yaml.h>

#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/gpt2.h"
#include "optim/loss_scaler.h"

namespace st {

GPT2Config model_config(const CheckpointState& s) {
  GPT2Config c;
  c.n_layer = s.n_layer;
  c.n_head = s.n_head;
  c.n_embd = s.n_embd;
  c.max_seq_len = s.max_seq_len;
  c.vocab_size = s.vocab_size;
  c.padded_vocab_size = s.padded_vocab_size;
  return c;
}

void set_model_config(CheckpointState& s, const GPT2Config& c) {
  s.n_layer = c.n_layer;
  s.n_head = c.n_head;
  s.n_embd = c.n_embd;
  s.max_seq_len = c.max_seq_len;
  s.vocab_size = c.vocab_size;
  s.padded_vocab_size = c.vp();
}

namespace detail {

// Empty when the optimizer arrays are consistent, else what is wrong.
std::string check_arrays(const CheckpointState& s) {
  std::ostringstream os;
  const bool main_of_shards = s.optim_shards > 0 && s.shard_rank < 0;
  if (s.master_elem_bytes != 4 && s.master_elem_bytes != 8)
    os << "master_elem_bytes is " << s.master_elem_bytes << ", expected 4 (fp32) or 8 (fp64)";
  else if (s.dist_world < 1 || s.optim_shards < 0 || (s.optim_shards > 0 && s.optim_shards != s.dist_world))
    os << "dist_world " << s.dist_world << " with optim_shards " << s.optim_shards
       << " (expected optim_shards 0 or equal to dist_world)";
  else if (s.shard_rank >= 0 && (s.optim_shards == 0 || s.shard_rank >= s.optim_shards ||
                                 s.shard_begin < 0 || s.shard_end < s.shard_begin ||
                                 s.master.size() != size_t(s.shard_end - s.shard_begin) *
                                                        size_t(s.master_elem_bytes)))
    os << "bad shard: rank " << s.shard_rank << " of " << s.optim_shards << ", elements ["
       << s.shard_begin << ", " << s.shard_end << "), master " << s.master.size() << " bytes";
  else if (main_of_shards && (!s.m.empty() || !s.v.empty()))
    os << "a sharded checkpoint's main file holds m and v (" << s.m.size() << ", "
       << s.v.size() << " bytes; expected none: they are in the rank files)";
  else if (!main_of_shards && (s.m.size() != s.master.size() || s.v.size() != s.master.size()))
    os << "inconsistent array sizes: master " << s.master.size() << " bytes, m " << s.m.size()
       << ", v " << s.v.size() << " (expected equal)";
  else if (s.master.size() % size_t(s.master_elem_bytes) != 0)
    os << "inconsistent array sizes: master is " << s.master.size()
       << " bytes, not a multiple of master_elem_bytes " << s.master_elem_bytes;
  return os.str();
}

// The values of a structurally sound state: bounds and agreement between the records
// (the rules are listed at the top of this file). Throws st::Error starting with `what`.
void check_values(const CheckpointState& s, const std::string& what) {
  const std::string bad = what + ": inconsistent checkpoint: ";
  if (s.step < 0 || s.step > kMaxCheckpointStep)
    fail(bad, "step = ", s.step, ", expected 0..", kMaxCheckpointStep,
         " (checkpoint names have 8 digits)");
  if (s.adam_step < 0 || s.adam_step > s.step)
    fail(bad, "adam_step = ", s.adam_step, ", expected 0..step (", s.step,
         "): one Adam update at most per step");
  if (s.compute != "fp32" && s.compute != "bf16" && s.compute != "fp16" && s.compute != "fp64")
    fail(bad, "compute = '", s.compute.substr(0, 32), "' (", s.compute.size(),
         " bytes), expected fp32, bf16, fp16 or fp64");
  // The loss scaler runs in fp16 only, between its bounds (optim/loss_scaler.h); every other
  // format trains unscaled, so any other scale there would only corrupt the gradients.
  const LossScalerConfig lsc;
  if (s.compute == "fp16") {
    if (!(s.loss_scale >= lsc.min_scale && s.loss_scale <= lsc.max_scale))
      fail(bad, "loss_scale = ", s.loss_scale, ", expected ", lsc.min_scale, "..", lsc.max_scale,
           " (the fp16 loss scaler's bounds)");
    if (s.loss_scale_good_steps < 0)
      fail(bad, "loss_scale_good_steps = ", s.loss_scale_good_steps, ", expected >= 0");
  } else if (s.loss_scale != 1.0f || s.loss_scale_good_steps != 0) {
    fail(bad, "loss_scale = ", s.loss_scale, ", loss_scale_good_steps = ",
         s.loss_scale_good_steps, " with compute ", s.compute,
         ", expected 1 and 0 (only fp16 scales the loss)");
  }
  if (const int64_t n = invalid_utf8_bytes(s.config_yaml))
    fail(bad, "config_yaml holds ", n, " byte", n == 1 ? "" : "s",
         " that are not UTF-8 (the trainer writes UTF-8 YAML)");
  const GPT2Config c = model_config(s);
  if (s.padded_vocab_size < s.vocab_size || s.padded_vocab_size < 1)
    fail(bad, "padded_vocab_size = ", s.padded_vocab_size, " is below vocab_size = ",
         s.vocab_size);
  check_model_shape(c, bad + "model shape records");
  const int64_t np = num_parameters(c);  // no overflow within the shape bounds
  const size_t eb = size_t(s.master_elem_bytes);  // 4 or 8: check_arrays ran first
  if (s.dist_world > (1 << 20)) fail(bad, "dist_world = ", s.dist_world, ", expected 1..2^20");
  if (s.shard_rank < -1) fail(bad, "shard_rank = ", s.shard_rank, ", expected -1 or a rank");
  if (s.shard_rank < 0) {
    if (s.shard_begin != 0 || s.shard_end != 0)
      fail(bad, "shard elements [", s.shard_begin, ", ", s.shard_end,
           ") in a file with no shard_rank, expected none");
    if (s.master.size() / eb != uint64_t(np))
      fail(bad, "master holds ", s.master.size() / eb, " values of ", eb,
           " bytes but the shape records (n_layer ", c.n_layer, ", n_head ", c.n_head,
           ", n_embd ", c.n_embd, ", max_seq_len ", c.max_seq_len, ", padded_vocab_size ",
           c.padded_vocab_size, ") give ", np, " parameters");
  } else if (s.shard_end > np) {
    fail(bad, "shard elements [", s.shard_begin, ", ", s.shard_end, ") end past the ", np,
         " parameters of the shape records");
  }
  // Empty: a checkpoint not written by the trainer (tools, tests); --resume refuses it.
  if (!s.rng_state.empty()) Rng::State::from_bytes(s.rng_state, what + ": inconsistent checkpoint");
  if (!s.data_state.empty())
    DataLoader::State::from_bytes(s.data_state, what + ": inconsistent checkpoint");
  if (s.config_yaml.empty()) return;
  // config_yaml: where it states the model shape, it must be the shape records'.
  YAML::Node root;
  try {
    root = YAML::Load(s.config_yaml);
  } catch (const YAML::Exception& e) {
    fail(bad, "config_yaml is not valid YAML (line ", e.mark.line + 1, ": ", e.msg, ")");
  }
  if (!root.IsMap()) fail(bad, "config_yaml is not a YAML mapping");
  // The compute format the arrays were trained in: the record and the config agree.
  if (const YAML::Node prec = root["precision"]; prec && prec.IsMap() && prec["compute"]) {
    const YAML::Node c = prec["compute"];
    const std::string text = c.IsScalar() ? c.Scalar() : std::string("(not a scalar)");
    if (text != s.compute)
      fail(bad, "config_yaml says precision.compute: '", text.substr(0, 32),
           "' but the record compute is '", s.compute, "'");
  }
  const YAML::Node model = root["model"];
  if (!model) return;
  if (!model.IsMap()) fail(bad, "config_yaml's model section is not a mapping");
  const std::pair<const char*, int32_t> shape[] = {
      {"n_layer", s.n_layer}, {"n_head", s.n_head}, {"n_embd", s.n_embd},
      {"max_seq_len", s.max_seq_len}, {"vocab_size", s.vocab_size}};
  for (const auto& [key, rec] : shape) {
    const YAML::Node v = model[key];
    if (!v) continue;
    const std::string text = v.IsScalar() ? v.Scalar() : std::string("(not a scalar)");
    int64_t x = 0;
    bool ok = v.IsScalar() && !text.empty() && text.size() <= 12;
    for (char ch : text) ok = ok && ch >= '0' && ch <= '9';
    if (ok) x = std::stoll(text);  // at most 12 digits: in range
    if (!ok || x != rec)
      fail(bad, "config_yaml says model.", key, ": '", text.substr(0, 32),
           "' but the record ", key, " is ", rec);
  }
}

}  // namespace detail
}  // namespace st
