// export_weights: model weights between formats (io/weights.h).
//   export_weights --input RUN_DIR|CKPT|LLMC|SAFETENSORS --output PATH
//                  --format safetensors|llmc|llmc-bf16 [--dtype F32|BF16] [--n-head N]
// Input: a run directory (its newest checkpoint), a stabletrain checkpoint (FP32 master
// weights), an llm.c model file or a safetensors file. Output:
//   safetensors  PATH is a folder: PATH/model.safetensors (Hugging Face GPT-2 names) and
//                PATH/config.json, so GPT2LMHeadModel.from_pretrained(PATH) opens it;
//   llmc         llm.c model file, version 3 (FP32); llmc-bf16: version 5 (BF16, RNE).
// A model with more than 65,536 tokens converts with a warning: train cannot use it (its
// token files hold uint16 ids).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/shards.h"
#include "io/weights.h"
#include "train/run_io.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"export_weights: convert GPT-2 weights (checkpoint, llm.c, safetensors)"};
  std::string input, output, format, dtype = "F32";
  int n_head = 0;
  app.add_option("--input", input, "run directory, checkpoint, llm.c model or safetensors file")
      ->required();
  app.add_option("--output", output, "output folder (safetensors) or file (llmc)")->required();
  app.add_option("--format", format, "safetensors | llmc | llmc-bf16")
      ->required()
      ->check(CLI::IsMember({"safetensors", "llmc", "llmc-bf16"}));
  app.add_option("--dtype", dtype, "safetensors element type")->capture_default_str()
      ->check(CLI::IsMember({"F32", "BF16"}));
  app.add_option("--n-head", n_head, "heads, for a safetensors input that does not record it");
  CLI11_PARSE(app, argc, argv);
  namespace fs = std::filesystem;
  try {
    if (fs::is_directory(input)) {
      const std::string ck = st::latest_checkpoint(input);
      if (ck.empty()) st::fail("--input: no checkpoint (ckpt_*.bin) in '", input, "'");
      input = ck;
    }
    const st::ModelWeights w = st::load_weights(input, n_head);
    const auto& c = w.config;
    // The formats hold larger vocabularies than train's token files (uint16 ids).
    if (c.vocab_size > st::kMaxTokenVocab)
      std::fprintf(stderr,
                   "export_weights: warning: %s has vocab_size %d, above the %d token ids train "
                   "stores (uint16): the result converts, but train cannot train, resume or "
                   "initialise from it\n",
                   input.c_str(), c.vocab_size, st::kMaxTokenVocab);
    if (format == "safetensors") {
      fs::create_directories(output);
      const std::string file = (fs::path(output) / "model.safetensors").string();
      st::save_safetensors(file, w, dtype);
      st::write_file_atomic((fs::path(output) / "config.json").string(), st::hf_config_json(c));
      output = file;
    } else {
      st::save_llmc(output, w, format == "llmc-bf16");
    }
    std::printf("%s -> %s (%s): GPT-2 L=%d H=%d C=%d maxT=%d V=%d (padded %d), %zu values\n",
                input.c_str(), output.c_str(), format.c_str(), c.n_layer, c.n_head, c.n_embd,
                c.max_seq_len, c.vocab_size, c.vp(), w.params.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "export_weights: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
