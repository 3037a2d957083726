// Small model shapes for the tests: a GPT2Config from its five numbers, and a checkpoint
// state's model fields from a GPT2Config (test_model, test_startup, test_hooks,
// test_gpu_model, test_compare, test_fuzz).
#pragma once
#include "io/checkpoint.h"
#include "model/gpt2.h"

namespace st::test {

// A GPT-2 shape; padded_vocab_size 0 (vocab_size rounded up to a multiple of 128).
inline GPT2Config gpt2_shape(int n_layer, int n_head, int n_embd, int max_seq_len, int vocab_size) {
  GPT2Config c;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.max_seq_len = max_seq_len;
  c.vocab_size = vocab_size;
  return c;
}

// The model shape in a checkpoint state, padded vocabulary included, as train writes it
// (Run::checkpoint_state in train/run_checkpoints.cpp, which works from the live model).
inline void set_model_shape(CheckpointState& s, const GPT2Config& mc) {
  s.n_layer = mc.n_layer;
  s.n_head = mc.n_head;
  s.n_embd = mc.n_embd;
  s.max_seq_len = mc.max_seq_len;
  s.vocab_size = mc.vocab_size;
  s.padded_vocab_size = mc.vp();
}

}  // namespace st::test
