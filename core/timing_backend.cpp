#include "core/timing_backend.h"

namespace st {
namespace {

class TimedAttention : public Attention {
 public:
  TimedAttention(std::unique_ptr<Attention> in, TimingBackend& tb) : in_(std::move(in)), tb_(tb) {}
  std::string name() const override { return in_->name(); }
  void forward(const Tensor& o, const Tensor& l, const Tensor& q, int nh, DType f) override {
    tb_.time("attention", [&] { in_->forward(o, l, q, nh, f); });
  }
  void backward(const Tensor& dq, const Tensor& d, const Tensor& q, const Tensor& o,
                const Tensor& l, int nh, DType f) override {
    tb_.time("attention", [&] { in_->backward(dq, d, q, o, l, nh, f); });
  }

 private:
  std::unique_ptr<Attention> in_;
  TimingBackend& tb_;
};

}  // namespace

std::unique_ptr<Attention> TimingBackend::make_attention(const AttentionConfig& cfg) {
  return std::make_unique<TimedAttention>(in_.make_attention(cfg), *this);
}

}  // namespace st
