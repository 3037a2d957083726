#include "analysis/slices.h"

namespace st {

std::vector<WeightSlice> weight_slices(const GPT2Config& c, bool with_heads) {
  const auto shapes = param_shapes(c);
  const int L = c.n_layer, NH = c.n_head;
  const int64_t C = c.n_embd, hs = C / NH;
  std::vector<WeightSlice> out;
  int64_t off = 0;
  for (int id = 0; id < kNumParams; ++id) {
    const Shape& s = shapes[id];
    const int64_t n = shape_numel(s);
    const bool stacked = id != kWte && id != kWpe && id != kLnfw && id != kLnfb;
    if (!stacked) {
      WeightSlice w;
      w.tensor = param_name(id);
      w.offset = off;
      w.rows = s.size() == 2 ? s[0] : 1;
      w.cols = s.size() == 2 ? s[1] : s[0];
      if (id == kWte) w.rows = c.vocab_size;  // padding rows are not weights
      w.row_stride = w.cols;
      out.push_back(w);
    } else {
      const int64_t per = n / L;
      for (int l = 0; l < L; ++l) {
        WeightSlice w;
        w.tensor = param_name(id);
        w.layer = l;
        w.offset = off + l * per;
        w.rows = s.size() == 3 ? s[1] : 1;
        w.cols = s.size() == 3 ? s[2] : s[1];
        w.row_stride = w.cols;
        out.push_back(w);
        if (!with_heads) continue;
        if (id == kQkvw) {
          const char* names[3] = {"wq", "wk", "wv"};
          for (int which = 0; which < 3; ++which)
            for (int h = 0; h < NH; ++h) {
              WeightSlice p = w;
              p.tensor = names[which];
              p.head = h;
              p.offset = w.offset + (which * C + h * hs) * C;
              p.rows = hs;
              p.cols = C;
              p.row_stride = C;
              out.push_back(p);
            }
        } else if (id == kAttprojw) {
          for (int h = 0; h < NH; ++h) {
            WeightSlice p = w;
            p.tensor = "wo";
            p.head = h;
            p.offset = w.offset + h * hs;
            p.rows = C;
            p.cols = hs;
            p.row_stride = C;
            out.push_back(p);
          }
        }
      }
    }
    off += n;
  }
  return out;
}

std::string slice_label(const WeightSlice& s) {
  std::string r = s.tensor;
  if (s.layer >= 0) r += " L" + std::to_string(s.layer);
  if (s.head >= 0) r += " H" + std::to_string(s.head);
  return r;
}

}  // namespace st
