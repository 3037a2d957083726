// The CPU backend: the executable specification. BF16/FP16 values are held in FP32
// storage and rounded at the points documented in core/backend.h and each kernel file;
// FP64 storage runs the reference mode. Every entry point checks shapes and dtypes.

#include <cstring>

#include "attention/attention_cpu.h"
#include "backends/backend_checks.h"
#include "backends/backends.h"
#include "backends/cpu_threads.h"
#include "layers/cpu_kernels.h"
#include "optim/adamw_cpu.h"

namespace st {
namespace {

// Calls f with a zero of the storage type of t (float or double).
template <class F>
void dispatch(const Tensor& t, const char* op, F&& f) {
  if (t.dtype() == DType::F32)
    f(float{});
  else if (t.dtype() == DType::F64)
    f(double{});
  else
    fail(op, ": CPU backend computes in fp32/fp64 storage, got ", t.desc());
}

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

class CpuBackend : public Backend {
 public:
  // BLAS runs single-threaded inside the tiled GEMMs (layers/matmul_cpu.cpp); OpenMP gets
  // `threads` (<= 0: its default).
  explicit CpuBackend(int threads) { set_cpu_threads(threads); }
  Device device() const override { return Device::CPU; }
  std::string name() const override { return "cpu"; }
  DType storage_dtype(DType fmt) const override {
    return fmt == DType::F64 ? DType::F64 : DType::F32;
  }
  Tensor alloc(const Shape& shape, DType storage) override {
    return Tensor::empty(shape, storage);
  }
  void zero(const Tensor& t) override {
    if (t.nbytes()) std::memset(t.raw(), 0, t.nbytes());
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    ST_CHECK(dst.numel() == src.numel(), "copy: ", src.desc(), " into ", dst.desc());
    ST_CHECK(dst.device() == Device::CPU && src.device() == Device::CPU,
             "copy: the CPU backend cannot reach ", src.desc(), " -> ", dst.desc());
    const size_t n = static_cast<size_t>(src.numel());
    const DType a = src.dtype(), b = dst.dtype();
    if (a == b) {
      if (src.nbytes()) std::memmove(dst.raw(), src.raw(), src.nbytes());  // raw() may be null when empty
    } else if (a == DType::F32 && b == DType::BF16) {
      convert_f32_to_bf16(src.data<float>(), dst.data<uint16_t>(), n);
    } else if (a == DType::BF16 && b == DType::F32) {
      convert_bf16_to_f32(src.data<uint16_t>(), dst.data<float>(), n);
    } else if (a == DType::F32 && b == DType::F16) {
      convert_f32_to_fp16(src.data<float>(), dst.data<uint16_t>(), n);
    } else if (a == DType::F16 && b == DType::F32) {
      convert_fp16_to_f32(src.data<uint16_t>(), dst.data<float>(), n);
    } else if (a == DType::F32 && b == DType::F64) {
      const float* s = src.data<float>();
      double* d = dst.data<double>();
      for (size_t i = 0; i < n; ++i) d[i] = s[i];
    } else if (a == DType::F64 && b == DType::F32) {
      const double* s = src.data<double>();
      float* d = dst.data<float>();
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
    } else {
      fail("copy: no conversion from ", dtype_name(a), " to ", dtype_name(b));
    }
  }

  void round_copy(const Tensor& dst, const Tensor& src, DType fmt) override {
    copy(dst, src);
    if (dst.dtype() == DType::F32) round_inplace(fmt, dst.data<float>(), dst.numel());
  }

  void encoder_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, DType fmt) override {
    const int64_t B = out.dim(0), T = out.dim(1), C = out.dim(2);
    check_tokens(tokens, B, T, wte.dim(0));
    ST_CHECK(T <= wpe.dim(0), "encoder: sequence length ", T, " exceeds max_seq_len ",
             wpe.dim(0));
    check_shape(wte, {wte.dim(0), C}, "encoder wte");
    dispatch(out, "encoder_forward", [&](auto z) {
      using S = decltype(z);
      cpu::encoder_forward(ptr<S>(out), tokens.data<int32_t>(), ptr<S>(wte), ptr<S>(wpe),
                           to_int(B, "B"), to_int(T, "T"), to_int(C, "C"), fmt);
    });
  }

  void encoder_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, DType fmt) override {
    const int64_t B = dout.dim(0), T = dout.dim(1), C = dout.dim(2);
    check_tokens(tokens, B, T, dwte.dim(0));
    check_shape(dwte, {dwte.dim(0), C}, "encoder dwte");
    dispatch(dout, "encoder_backward", [&](auto z) {
      using S = decltype(z);
      cpu::encoder_backward(ptr<S>(dwte), ptr<S>(dwpe), ptr<S>(dout), tokens.data<int32_t>(),
                            to_int(B, "B"), to_int(T, "T"), to_int(C, "C"), fmt);
    });
  }

  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         DType fmt) override {
    const std::pair<int64_t, int64_t> nc =
        check_layernorm_shapes(out, mean, rstd, inp, weight, bias);
    const int64_t N = nc.first, C = nc.second;
    dispatch(inp, "layernorm_forward", [&](auto z) {
      using S = decltype(z);
      cpu::layernorm_forward(ptr<S>(out), ptr<S>(mean), ptr<S>(rstd), ptr<S>(inp),
                             ptr<S>(weight), ptr<S>(bias), to_int(N, "N"), to_int(C, "C"),
                             fmt);
    });
  }

  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, DType fmt) override {
    const int64_t C = inp.dim(-1), N = inp.numel() / C;
    check_same(dinp, inp, "layernorm dinp vs inp");
    check_same(dout, inp, "layernorm dout vs inp");
    check_shape(dweight, {C}, "layernorm dweight");
    check_shape(dbias, {C}, "layernorm dbias");
    dispatch(inp, "layernorm_backward", [&](auto z) {
      using S = decltype(z);
      cpu::layernorm_backward(ptr<S>(dinp), ptr<S>(dweight), ptr<S>(dbias), ptr<S>(dout),
                              ptr<S>(inp), ptr<S>(weight), ptr<S>(mean), ptr<S>(rstd),
                              to_int(N, "N"), to_int(C, "C"), fmt);
    });
  }

  void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, DType fmt) override {
    const int64_t OC = weight.dim(0), C = weight.dim(1), N = inp.numel() / C;
    ST_CHECK(inp.dim(-1) == C, "matmul: inp ", inp.desc(), " does not match weight ",
             weight.desc());
    ST_CHECK(out.numel() == N * OC && out.dim(-1) == OC, "matmul: out ", out.desc(),
             ", expected ", N, " x ", OC);
    if (bias.defined()) check_shape(bias, {OC}, "matmul bias");
    dispatch(inp, "matmul_forward", [&](auto z) {
      using S = decltype(z);
      cpu::matmul_forward(ptr<S>(out), ptr<S>(inp), ptr<S>(weight), ptr<S>(bias),
                          to_int(N, "N"), to_int(C, "C"), to_int(OC, "OC"), fmt);
    });
  }

  void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                       DType fmt) override {
    const int64_t OC = weight.dim(0), C = weight.dim(1), N = inp.numel() / C;
    check_same(dweight, weight, "matmul dweight vs weight");
    ST_CHECK(dout.numel() == N * OC, "matmul backward: dout ", dout.desc(), ", expected ", N,
             " x ", OC);
    if (dinp.defined()) check_same(dinp, inp, "matmul dinp vs inp");
    if (dbias.defined()) check_shape(dbias, {OC}, "matmul dbias");
    // dinp and dweight are written by one pool of GEMM tiles (layers/matmul_cpu.cpp) while
    // dout, inp and weight are read: no output may share memory with another operand.
    for (const Tensor* in : {&dout, &inp, &weight})
      ST_CHECK(!overlaps(dinp, *in) && !overlaps(dweight, *in),
               "matmul backward: an output (dinp or dweight) overlaps an input");
    ST_CHECK(!overlaps(dinp, dweight), "matmul backward: dinp overlaps dweight");
    dispatch(inp, "matmul_backward", [&](auto z) {
      using S = decltype(z);
      cpu::matmul_backward(ptr<S>(dinp), ptr<S>(dweight), ptr<S>(dbias), ptr<S>(dout),
                           ptr<S>(inp), ptr<S>(weight), to_int(N, "N"), to_int(C, "C"),
                           to_int(OC, "OC"), fmt);
    });
  }

  void bias_backward(const Tensor& dbias, const Tensor& dout, DType fmt) override {
    ST_CHECK(dbias.defined() && dbias.ndim() == 1 && dbias.numel() > 0, "bias_backward: dbias ",
             dbias.desc(), " must be (OC)");
    const int64_t OC = dbias.numel();
    ST_CHECK(dout.defined() && dout.dim(-1) == OC, "bias_backward: dout ", dout.desc(),
             ", expected (N, ", OC, ")");
    ST_CHECK(dout.dtype() == dbias.dtype(), "bias_backward: dout ", dout.desc(), " vs dbias ",
             dbias.desc());
    ST_CHECK(!overlaps(dbias, dout), "bias_backward: dbias overlaps dout");
    const int64_t N = dout.numel() / OC;
    dispatch(dout, "bias_backward", [&](auto z) {
      using S = decltype(z);
      cpu::bias_backward(ptr<S>(dbias), ptr<S>(dout), to_int(N, "N"), to_int(OC, "OC"), fmt);
    });
  }

  void gelu_forward(const Tensor& out, const Tensor& inp, DType fmt) override {
    check_same(out, inp, "gelu out vs inp");
    dispatch(inp, "gelu_forward", [&](auto z) {
      using S = decltype(z);
      cpu::gelu_forward(ptr<S>(out), ptr<S>(inp), inp.numel(), fmt);
    });
  }
  void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout,
                     DType fmt) override {
    check_same(dinp, inp, "gelu dinp vs inp");
    check_same(dout, inp, "gelu dout vs inp");
    dispatch(inp, "gelu_backward", [&](auto z) {
      using S = decltype(z);
      cpu::gelu_backward(ptr<S>(dinp), ptr<S>(inp), ptr<S>(dout), inp.numel(), fmt);
    });
  }
  void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b,
                        DType fmt) override {
    check_same(out, a, "residual out vs a");
    check_same(b, a, "residual b vs a");
    dispatch(a, "residual_forward", [&](auto z) {
      using S = decltype(z);
      cpu::residual_forward(ptr<S>(out), ptr<S>(a), ptr<S>(b), a.numel(), fmt);
    });
  }

  void crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits,
                                     const Tensor& logits, const Tensor& targets, int V,
                                     float dloss, DType fmt) override {
    const int64_t Vp = logits.dim(-1), N = logits.numel() / Vp;
    ST_CHECK(V > 0 && V <= Vp, "crossentropy: V = ", V, " with ", Vp, " logit columns");
    ST_CHECK(losses.numel() == N, "crossentropy: losses ", losses.desc(), ", expected ", N);
    ST_CHECK(targets.numel() == N && targets.device() == Device::CPU,
             "crossentropy: targets ", targets.desc(), ", expected ", N, " host int32");
    const int32_t* tg = static_cast<const int32_t*>(targets.raw());
    for (int64_t i = 0; i < N; ++i)
      ST_CHECK(tg[i] >= 0 && tg[i] < V, "crossentropy: target ", tg[i], " at position ", i,
               " is outside the vocabulary [0, ", V, ")");
    if (dlogits.defined()) check_same(dlogits, logits, "crossentropy dlogits vs logits");
    dispatch(logits, "crossentropy", [&](auto z) {
      using S = decltype(z);
      cpu::crossentropy_forward_backward(ptr<S>(losses), ptr<S>(dlogits), ptr<S>(logits), tg,
                                         to_int(N, "N"), V, to_int(Vp, "Vp"), dloss, fmt);
    });
  }

  double sum_squares(const Tensor& t) override {
    double r = 0;
    dispatch(t, "sum_squares", [&](auto z) {
      using S = decltype(z);
      r = cpu::sum_squares(ptr<S>(t), t.numel());
    });
    return r;
  }
  bool all_finite(const Tensor& t) override {
    bool r = true;
    dispatch(t, "all_finite", [&](auto z) {
      using S = decltype(z);
      r = cpu::all_finite(ptr<S>(t), t.numel());
    });
    return r;
  }

  void adamw_update(const Tensor& master, const Tensor& param, const Tensor& grad,
                    const Tensor& m, const Tensor& v, const AdamWArgs& a, DType fmt) override {
    check_same(m, master, "adamw m vs master");
    check_same(v, master, "adamw v vs master");
    ST_CHECK(grad.numel() == master.numel() && param.numel() == master.numel(),
             "adamw: grad ", grad.desc(), " / param ", param.desc(), " vs master ",
             master.desc());
    ST_CHECK(grad.dtype() == master.dtype() && param.dtype() == master.dtype(),
             "adamw: CPU backend keeps master, param and grad in one storage type, got ",
             master.desc(), ", ", param.desc(), ", ", grad.desc());
    const bool alias = param.raw() == master.raw();
    dispatch(master, "adamw_update", [&](auto z) {
      using S = decltype(z);
      cpu::adamw_update(ptr<S>(master), alias ? nullptr : ptr<S>(param), ptr<S>(grad),
                        ptr<S>(m), ptr<S>(v), master.numel(), a.lr, a.beta1, a.beta2, a.eps,
                        a.weight_decay, a.step, a.grad_scale, fmt);
    });
  }

  std::unique_ptr<Attention> make_attention(const AttentionConfig& cfg) override {
    return make_attention_cpu(cfg);
  }

 private:
  static void check_tokens(const Tensor& tokens, int64_t B, int64_t T, int64_t vocab_rows) {
    check_shape(tokens, {B, T}, "tokens");
    ST_CHECK(tokens.device() == Device::CPU, "tokens must be on the host");
    check_token_ids(tokens, vocab_rows);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace st
