// A Backend decorator that times every call (after synchronize) per kernel family, for
// benchmarks' per-kernel breakdowns. It forwards everything to the wrapped backend.
#pragma once
#include <chrono>
#include <map>
#include <string>

#include "core/backend.h"

namespace st {

class TimingBackend : public Backend {
 public:
  explicit TimingBackend(Backend& inner) : in_(inner) {}
  struct Entry {
    double seconds = 0;
    long calls = 0;
  };
  const std::map<std::string, Entry>& totals() const { return totals_; }
  void reset() { totals_.clear(); }

  Device device() const override { return in_.device(); }
  std::string name() const override { return in_.name(); }
  DType storage_dtype(DType f) const override { return in_.storage_dtype(f); }
  Tensor alloc(const Shape& s, DType d) override { return in_.alloc(s, d); }
  void synchronize() override { in_.synchronize(); }
  MemoryStats memory() const override { return in_.memory(); }
  void reset_peak_memory() override { in_.reset_peak_memory(); }
  void zero(const Tensor& t) override { time("zero", [&] { in_.zero(t); }); }
  void copy(const Tensor& d, const Tensor& s) override { time("copy", [&] { in_.copy(d, s); }); }
  void round_copy(const Tensor& d, const Tensor& s, DType f) override {
    time("copy", [&] { in_.round_copy(d, s, f); });
  }
  void encoder_forward(const Tensor& o, const Tensor& t, const Tensor& a, const Tensor& b,
                       DType f) override {
    time("encoder", [&] { in_.encoder_forward(o, t, a, b, f); });
  }
  void encoder_backward(const Tensor& a, const Tensor& b, const Tensor& d, const Tensor& t,
                        DType f) override {
    time("encoder", [&] { in_.encoder_backward(a, b, d, t, f); });
  }
  void layernorm_forward(const Tensor& o, const Tensor& m, const Tensor& r, const Tensor& i,
                         const Tensor& w, const Tensor& b, DType f) override {
    time("layernorm", [&] { in_.layernorm_forward(o, m, r, i, w, b, f); });
  }
  void layernorm_backward(const Tensor& di, const Tensor& dw, const Tensor& db,
                          const Tensor& d, const Tensor& i, const Tensor& w, const Tensor& m,
                          const Tensor& r, DType f) override {
    time("layernorm", [&] { in_.layernorm_backward(di, dw, db, d, i, w, m, r, f); });
  }
  void layernorm_backward_dbias(const Tensor& di, const Tensor& dw, const Tensor& db,
                                const Tensor& dn, const Tensor& d, const Tensor& i,
                                const Tensor& w, const Tensor& m, const Tensor& r,
                                DType f) override {
    time("layernorm", [&] { in_.layernorm_backward_dbias(di, dw, db, dn, d, i, w, m, r, f); });
  }
  void matmul_forward(const Tensor& o, const Tensor& i, const Tensor& w, const Tensor& b,
                      DType f) override {
    time("matmul", [&] { in_.matmul_forward(o, i, w, b, f); });
  }
  void matmul_backward(const Tensor& di, const Tensor& dw, const Tensor& db, const Tensor& d,
                       const Tensor& i, const Tensor& w, DType f) override {
    time("matmul", [&] { in_.matmul_backward(di, dw, db, d, i, w, f); });
  }
  void gelu_forward(const Tensor& o, const Tensor& i, DType f) override {
    time("gelu", [&] { in_.gelu_forward(o, i, f); });
  }
  void gelu_backward(const Tensor& di, const Tensor& i, const Tensor& d, DType f) override {
    time("gelu", [&] { in_.gelu_backward(di, i, d, f); });
  }
  void bias_backward(const Tensor& db, const Tensor& d, DType f) override {
    time("matmul", [&] { in_.bias_backward(db, d, f); });
  }
  void gelu_backward_dbias(const Tensor& di, const Tensor& db, const Tensor& i, const Tensor& d,
                           DType f) override {
    time("gelu", [&] { in_.gelu_backward_dbias(di, db, i, d, f); });
  }
  void residual_forward(const Tensor& o, const Tensor& a, const Tensor& b, DType f) override {
    time("residual", [&] { in_.residual_forward(o, a, b, f); });
  }
  void residual_layernorm_forward(const Tensor& res, const Tensor& o, const Tensor& m,
                                  const Tensor& r, const Tensor& a, const Tensor& b,
                                  const Tensor& w, const Tensor& bi, DType f) override {
    time("residual+layernorm", [&] { in_.residual_layernorm_forward(res, o, m, r, a, b, w, bi, f); });
  }
  void crossentropy_forward_backward(const Tensor& l, const Tensor& dl, const Tensor& lg,
                                     const Tensor& t, int V, float s, DType f) override {
    time("crossentropy", [&] { in_.crossentropy_forward_backward(l, dl, lg, t, V, s, f); });
  }
  double sum_squares(const Tensor& t) override {
    double r = 0;
    time("grad_norm", [&] { r = in_.sum_squares(t); });
    return r;
  }
  bool all_finite(const Tensor& t) override {
    bool r = true;
    time("grad_norm", [&] { r = in_.all_finite(t); });
    return r;
  }
  void adamw_update(const Tensor& ma, const Tensor& p, const Tensor& g, const Tensor& m,
                    const Tensor& v, const AdamWArgs& a, DType f) override {
    time("adamw", [&] { in_.adamw_update(ma, p, g, m, v, a, f); });
  }
  std::unique_ptr<Attention> make_attention(const AttentionConfig& cfg) override;

  template <class F>
  void time(const char* what, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    in_.synchronize();
    auto& e = totals_[what];
    e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++e.calls;
  }

 private:
  Backend& in_;
  std::map<std::string, Entry> totals_;
};

}  // namespace st
