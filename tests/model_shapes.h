// Small model shapes for the tests: a GPT2Config from its five numbers (test_model,
// test_startup, test_hooks, test_gpu_model, test_compare, test_fuzz). A checkpoint state's
// shape records from a GPT2Config: io/checkpoint.h's set_model_config.
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

}  // namespace st::test
