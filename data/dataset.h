// Token data for training: a contiguous array of token ids with a train/validation split.
// Until the GPT-2 BPE tokenizer lands, text is read with the byte-level tokenizer
// (token = byte value, vocabulary 256).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace st {

struct TokenData {
  std::vector<int32_t> train, val;
  int vocab_size = 0;
  std::string description;  // for logs: "tinyshakespeare.txt: 1003854 train / 111540 val tokens"
};

// Reads a text file as bytes. When val_path is empty the last val_fraction of the file is
// the validation split. Errors name the config key and the file (missing, unreadable, empty).
TokenData load_text_bytes(const std::string& train_path, const std::string& val_path,
                          double val_fraction);

std::string decode_bytes(const std::vector<int32_t>& tokens);

}  // namespace st
