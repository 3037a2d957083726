// Named matrix views into the flat parameter array (llm.c order, model/gpt2.h): every
// tensor (per layer for the stacked ones) and the per-head attention slices the stability
// tools study. One definition, used by the spectral-norm hooks, `compare`, the
// reference-run hook and `report`, so every file names the same slice the same way.
//
//   tensor     layer  head  matrix (rows x cols)                    from
//   wte        -1     -1    (vocab_size x C)   padding rows excluded  wte
//   wpe        -1     -1    (max_seq_len x C)                         wpe
//   ln1w ...   l      -1    (1 x C) etc.       every stacked tensor   its layer l
//   qkvw       l      -1    (3C x C)                                  qkvw[l]
//   wq, wk, wv l      h     (hs x C)   rows [h*hs, (h+1)*hs) of the q / k / v third of qkvw[l]
//   wo         l      h     (C x hs)   columns [h*hs, (h+1)*hs) of attprojw[l] (the columns
//                                      that read head h's output)
//   lnfw, lnfb -1     -1    (1 x C)
// Element (r, c) of a slice is flat[offset + r * row_stride + c].
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt2.h"

namespace st {

struct WeightSlice {
  std::string tensor;  // see the table above
  int layer = -1;      // -1: not a per-layer tensor
  int head = -1;       // -1: not a per-head slice
  int64_t offset = 0, rows = 0, cols = 0, row_stride = 0;
  int64_t numel() const { return rows * cols; }
  bool is_2d_weight() const { return rows > 1; }  // matrices (not biases / layernorm vectors)
  // Copies the slice's elements out of `flat`, row by row.
  template <class T>
  std::vector<double> gather(const T* flat) const {
    std::vector<double> out(static_cast<size_t>(numel()));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        out[static_cast<size_t>(r * cols + c)] = static_cast<double>(flat[offset + r * row_stride + c]);
    return out;
  }
};

// Every tensor (one slice per layer for stacked tensors), in llm.c order; with_heads adds,
// right after each layer's qkvw / attprojw, the per-head wq, wk, wv / wo slices.
std::vector<WeightSlice> weight_slices(const GPT2Config& c, bool with_heads = true);
// The same slice of a parameter-sized flat array (gradients) is at the same place.
// Label for tables: "qkvw L3", "wq L3 H8", "wte".
std::string slice_label(const WeightSlice& s);

}  // namespace st
