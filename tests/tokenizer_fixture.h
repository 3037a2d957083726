// The setup shared by the tokenizer and data tests (test_tokenizer, test_tokenizer_node,
// test_data): the GPT-2 vocabulary in shared/data and the tokenizer read from it, once per
// test program.
#pragma once
#include <string>

#include "data/tokenizer.h"

namespace st::test {

inline const std::string kVocabDir = ST_SHARED_DATA_DIR "/gpt2-tokenizer";

inline Gpt2Tokenizer& tok() {
  static Gpt2Tokenizer t(kVocabDir);
  return t;
}

}  // namespace st::test
