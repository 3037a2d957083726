// Text -> tokens, the rules shared by `prepare_data` (writes llm.c shards) and the trainer
// (tokenizes a text file in memory, or prepares missing shards):
//   - documents: each input file is a document; with doc_separator set, each file is cut
//     after every occurrence of it (the separator stays at the end of its document, so the
//     concatenated documents are the file);
//   - GPT-2: every document is preceded by <|endoftext|> (50256), as in llm.c's data, so EOT
//     separates documents and starts each split; byte-level: bytes, no separator token
//     (its 256-token vocabulary has none);
//   - split: without val_inputs, the input files are treated as one byte stream and its last
//     floor(bytes x val_fraction) bytes (moved forward to a UTF-8 character boundary) are the
//     validation split, the same bytes the byte-level text loader holds out; a document that
//     straddles the cut is split in two, the validation part starting with its own EOT;
//   - bytes that are not valid UTF-8 are tokenized losslessly (tokenizer.h) and counted;
//   - each input file is read whole; tokens stream into shards as they fill.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace st {

struct PrepareOptions {
  std::vector<std::string> inputs;      // text files
  std::vector<std::string> val_inputs;  // validation text files; empty: split the inputs
  std::string tokenizer = "gpt2";       // gpt2 | byte
  std::string tokenizer_dir;            // holds encoder.json and vocab.bpe (gpt2)
  double val_fraction = 0.1;            // [0, 1); 0: no validation split
  std::string doc_separator;            // empty: one document per file
  // Output shard paths; '*' becomes the 6-digit shard number (shards.h shard_name).
  std::string train_pattern, val_pattern;
  int64_t shard_tokens = 100000000;     // tokens per shard (llm.c uses 1e8)
  bool overwrite = false;               // replace existing files matching the patterns
  // Input bytes processed: called with done = 0 once tokenizing starts, then per slice.
  std::function<void(int64_t done, int64_t total)> progress;
  std::string input_what = "--input", val_what = "--val-input";  // option names, for errors
};

struct PrepareSummary {
  std::string tokenizer;
  int vocab_size = 0;
  int64_t input_files = 0, input_bytes = 0, documents = 0, invalid_utf8_bytes = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t train_bytes = 0, val_bytes = 0;  // text bytes that went into each split
  std::vector<std::string> train_shards, val_shards;
  double seconds = 0;
  std::string text() const;  // the multi-line summary prepare_data prints
};

// Tokenizes the inputs into shards. Errors name the file and the option.
PrepareSummary prepare_shards(const PrepareOptions& o);
// The same rules, in memory (no files).
PrepareSummary tokenize_texts(const PrepareOptions& o, std::vector<uint16_t>& train,
                              std::vector<uint16_t>& val);

}  // namespace st
