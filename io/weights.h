// Model weight files: llm.c's model format and safetensors with Hugging Face GPT-2 names.
//
// llm.c (little-endian): header of 256 int32 = {20240326, version, maxT, V, L, NH, C, Vp, 0...},
// then every parameter in llm.c order (model/gpt2.h), weights (out, in), wte padded to Vp
// rows; version 3 stores FP32, version 5 BF16 (written with round-to-nearest-even).
//
// safetensors: u64 header length, a JSON header {name: {dtype, shape, data_offsets}, ...,
// "__metadata__": {...}} padded with spaces to 8 bytes, then the raw little-endian tensors.
// Names and layouts are those of transformers' GPT2LMHeadModel.save_pretrained:
//   transformer.wte.weight (V, C)          unpadded vocabulary; lm_head is tied, not stored
//   transformer.wpe.weight (maxT, C)
//   transformer.h.N.ln_1.{weight,bias} (C)   transformer.h.N.ln_2.{weight,bias} (C)
//   transformer.h.N.attn.c_attn.weight (C, 3C)  .bias (3C)    Conv1D: (in, out), i.e. the
//   transformer.h.N.attn.c_proj.weight (C, C)   .bias (C)     transpose of our (out, in)
//   transformer.h.N.mlp.c_fc.weight (C, 4C)     .bias (4C)
//   transformer.h.N.mlp.c_proj.weight (4C, C)   .bias (C)
//   transformer.ln_f.{weight,bias} (C)
// The metadata holds "format": "pt" (transformers requires it) and the model shape, n_head
// included (safetensors has no place for it otherwise). Reading also accepts names without
// the "transformer." prefix (the Hub's gpt2 files) and ignores lm_head.weight and the
// attn.bias / attn.masked_bias buffers of old exports.
#pragma once
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/gpt2.h"

namespace st {

enum class WeightFormat { Unknown, Llmc, Safetensors, Checkpoint };

struct ModelWeights {
  GPT2Config config;          // shape; padded_vocab_size set
  std::vector<float> params;  // num_parameters(config) values in llm.c order
};

// By the first bytes of the file (Unknown when unreadable or unrecognised).
WeightFormat detect_weight_format(const std::string& path);

ModelWeights load_llmc(const std::string& path);
void save_llmc(const std::string& path, const ModelWeights& w, bool bf16);

// dtype: "F32" or "BF16".
void save_safetensors(const std::string& path, const ModelWeights& w, const std::string& dtype = "F32");
// n_head: used when the file's metadata does not say (0: then the metadata must).
ModelWeights load_safetensors(const std::string& path, int n_head = 0);
// A transformers config.json for GPT2LMHeadModel with this shape.
std::string hf_config_json(const GPT2Config& c);

// The FP32 master weights of a checkpoint's state (FP64-mode checkpoints converted), with
// its model shape; errors name `path`.
ModelWeights weights_from_checkpoint(const CheckpointState& s, const std::string& path);

// Weights from an llm.c file, a safetensors file or a stabletrain checkpoint (its FP32
// master weights). Errors name the file.
ModelWeights load_weights(const std::string& path, int n_head = 0);

}  // namespace st
