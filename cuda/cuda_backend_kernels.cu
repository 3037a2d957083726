// CudaBackend's kernel methods (core/backend.h): encoder, layernorm, matmul, elementwise,
// classifier, reductions and the optimizer. Each method checks shapes, dtypes (compute-format
// operands in storage fmt, statistics / master weights / Adam moments in FP32) and aliasing,
// then enqueues its CUDA kernel (kernels.h) or cuBLASLt GEMM (matmul.cu) on the backend's one
// stream. The backend's memory, copies and factories: cuda/cuda_backend.cu.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/backend_checks.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace st {
namespace {

void check_operand(const Tensor& t, DType storage, const char* what) {
  ST_CHECK(t.defined(), what, " is undefined");
  ST_CHECK(t.device() == Device::CUDA, what, " ", t.desc(), " must be on the GPU");
  ST_CHECK(t.dtype() == storage, what, " ", t.desc(), " must have storage ", dtype_name(storage));
}

bool same_memory(const Tensor& a, const Tensor& b) {
  return a.raw() == b.raw() && a.nbytes() == b.nbytes() && a.dtype() == b.dtype();
}
// Elementwise kernels read and write element i in the same thread: an output may be one of
// the inputs exactly, but must not partly overlap it.
void check_elementwise_alias(const Tensor& out, const Tensor& in, const char* what) {
  ST_CHECK(!overlaps(out, in) || same_memory(out, in), what, ": ", out.desc(), " partly overlaps ",
           in.desc());
}
void check_disjoint(const Tensor& a, const Tensor& b, const char* what) {
  ST_CHECK(!overlaps(a, b), what, ": ", a.desc(), " overlaps ", b.desc(),
           " (this kernel cannot run in place)");
}

void check_tokens(const Tensor& tokens, int64_t B, int64_t T, int64_t vocab_rows) {
  check_shape(tokens, {B, T}, "tokens");
  ST_CHECK(tokens.device() == Device::CPU && tokens.dtype() == DType::I32,
           "tokens must be int32 on the host, got ", tokens.desc());
  check_token_ids(tokens, vocab_rows);
}

}  // namespace

// ---------------------------------------------------------------- encoder

void CudaBackend::encoder_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                  const Tensor& wpe, DType fmt) {
  const DType s = storage_dtype(fmt);
  ST_CHECK(out.defined() && out.ndim() == 3, "encoder_forward: out ", out.desc(),
           " must be (B, T, C)");
  const int64_t B = out.dim(0), T = out.dim(1), C = out.dim(2);
  ST_CHECK(wte.defined() && wte.ndim() == 2 && wpe.defined() && wpe.ndim() == 2,
           "encoder_forward: wte ", wte.desc(), " and wpe ", wpe.desc(), " must be 2-D");
  check_tokens(tokens, B, T, wte.dim(0));
  check_shape(wte, {wte.dim(0), C}, "encoder wte");
  ST_CHECK(wpe.dim(1) == C, "encoder: wpe ", wpe.desc(), " does not have ", C, " columns");
  ST_CHECK(T <= wpe.dim(0), "encoder: sequence length ", T, " exceeds max_seq_len ", wpe.dim(0));
  check_operand(out, s, "encoder_forward: out");
  check_operand(wte, s, "encoder_forward: wte");
  check_operand(wpe, s, "encoder_forward: wpe");
  check_disjoint(out, wte, "encoder_forward");
  check_disjoint(out, wpe, "encoder_forward");
  if (out.numel() == 0) return;
  auto tok = upload_ints(static_cast<const int32_t*>(tokens.raw()), static_cast<size_t>(B * T));
  cudak::encoder_forward(out.raw(), static_cast<const int32_t*>(tok->data), wte.raw(), wpe.raw(),
                         to_int(B, "B"), to_int(T, "T"), to_int(C, "C"), s, stream_);
}

// The grouping is the CPU's (layers/encoder_cpu.cpp): positions stably sorted by token (on
// the device, cuda/encoder.cu), so each token's rows are summed in (b, t) order.
void CudaBackend::encoder_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                   const Tensor& tokens, DType fmt) {
  const DType s = storage_dtype(fmt);
  ST_CHECK(dout.defined() && dout.ndim() == 3, "encoder_backward: dout ", dout.desc(),
           " must be (B, T, C)");
  const int64_t B = dout.dim(0), T = dout.dim(1), C = dout.dim(2);
  ST_CHECK(dwte.defined() && dwte.ndim() == 2 && dwpe.defined() && dwpe.ndim() == 2,
           "encoder_backward: dwte ", dwte.desc(), " and dwpe ", dwpe.desc(), " must be 2-D");
  check_tokens(tokens, B, T, dwte.dim(0));
  check_shape(dwte, {dwte.dim(0), C}, "encoder dwte");
  ST_CHECK(dwpe.dim(1) == C && dwpe.dim(0) >= T, "encoder_backward: dwpe ", dwpe.desc(),
           " must have at least ", T, " rows of ", C);
  check_operand(dwte, s, "encoder_backward: dwte");
  check_operand(dwpe, s, "encoder_backward: dwpe");
  check_operand(dout, s, "encoder_backward: dout");
  check_disjoint(dwte, dout, "encoder_backward");
  check_disjoint(dwpe, dout, "encoder_backward");
  check_disjoint(dwte, dwpe, "encoder_backward");
  const int n = to_int(B * T, "B*T");
  if (n == 0 || C == 0) return;
  // The tokens go up as in the forward; the device sorts them (no host work, no sync).
  auto tok = upload_ints(static_cast<const int32_t*>(tokens.raw()), static_cast<size_t>(n));
  auto scr = scratch(cudak::encoder_backward_scratch(n) * sizeof(int32_t));
  cudak::encoder_backward(dwte.raw(), dwpe.raw(), dout.raw(), static_cast<const int32_t*>(tok->data),
                          to_int(B, "B"), to_int(T, "T"), to_int(C, "C"),
                          to_int(dwte.dim(0), "vocabulary rows"), s,
                          static_cast<int32_t*>(scr->data), stream_);
}

// ---------------------------------------------------------------- layernorm

namespace {

// The layernorm forward's operand checks; returns {N, C}.
std::pair<int, int> check_layernorm_forward(const Tensor& out, const Tensor& mean,
                                            const Tensor& rstd, const Tensor& inp,
                                            const Tensor& weight, const Tensor& bias, DType s) {
  ST_CHECK(inp.defined() && inp.ndim() >= 1 && inp.dim(-1) > 0, "layernorm_forward: inp ",
           inp.desc());
  const auto [N, C] = check_layernorm_shapes(out, mean, rstd, inp, weight, bias);
  check_operand(out, s, "layernorm_forward: out");
  check_operand(inp, s, "layernorm_forward: inp");
  check_operand(weight, s, "layernorm_forward: weight");
  check_operand(bias, s, "layernorm_forward: bias");
  check_operand(mean, DType::F32, "layernorm_forward: mean");
  check_operand(rstd, DType::F32, "layernorm_forward: rstd");
  for (const Tensor* t : {&inp, &weight, &bias, &mean, &rstd})
    check_disjoint(out, *t, "layernorm_forward");
  check_disjoint(mean, rstd, "layernorm_forward");
  for (const Tensor* t : {&inp, &weight, &bias}) {
    check_disjoint(mean, *t, "layernorm_forward");
    check_disjoint(rstd, *t, "layernorm_forward");
  }
  return {to_int(N, "N"), to_int(C, "C")};
}

// The residual add's operand checks: out = a + b, out may alias a or b element for element.
// (Fixed operand labels: no string is built on the training step's path.)
void check_residual(const Tensor& out, const Tensor& a, const Tensor& b, DType s,
                    const char* what) {
  check_same(out, a, "residual out vs a");
  check_same(b, a, "residual b vs a");
  check_operand(out, s, "residual out");
  check_operand(a, s, "residual a");
  check_operand(b, s, "residual b");
  check_elementwise_alias(out, a, what);
  check_elementwise_alias(out, b, what);
}

}  // namespace

void CudaBackend::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                    const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                    DType fmt) {
  const DType s = storage_dtype(fmt);
  const auto [N, C] = check_layernorm_forward(out, mean, rstd, inp, weight, bias, s);
  cudak::layernorm_forward(out.raw(), static_cast<float*>(mean.raw()),
                           static_cast<float*>(rstd.raw()), inp.raw(), weight.raw(), bias.raw(), N,
                           C, s, stream_);
}

// One kernel for the pair (cuda/layernorm.cu), bit-identical to residual_forward then
// layernorm_forward. res may alias a or b element for element, as in residual_forward.
void CudaBackend::residual_layernorm_forward(const Tensor& res, const Tensor& out,
                                             const Tensor& mean, const Tensor& rstd,
                                             const Tensor& a, const Tensor& b,
                                             const Tensor& weight, const Tensor& bias, DType fmt) {
  const DType s = storage_dtype(fmt);
  check_residual(res, a, b, s, "residual_layernorm_forward");
  const auto [N, C] = check_layernorm_forward(out, mean, rstd, res, weight, bias, s);
  for (const Tensor* t : {&a, &b}) {
    check_disjoint(out, *t, "residual_layernorm_forward");
    check_disjoint(mean, *t, "residual_layernorm_forward");
    check_disjoint(rstd, *t, "residual_layernorm_forward");
  }
  cudak::residual_layernorm_forward(res.raw(), out.raw(), static_cast<float*>(mean.raw()),
                                    static_cast<float*>(rstd.raw()), a.raw(), b.raw(), weight.raw(),
                                    bias.raw(), N, C, s, stream_);
}

void CudaBackend::layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                     const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, DType fmt) {
  layernorm_backward_impl(dinp, dweight, dbias, Tensor(), dout, inp, weight, mean, rstd, fmt);
}

// layernorm_backward with dnext += colsum(dinp) made in its pass (layernorm.cu): the bits of
// layernorm_backward then bias_backward(dnext, dinp).
void CudaBackend::layernorm_backward_dbias(const Tensor& dinp, const Tensor& dweight,
                                           const Tensor& dbias, const Tensor& dnext,
                                           const Tensor& dout, const Tensor& inp,
                                           const Tensor& weight, const Tensor& mean,
                                           const Tensor& rstd, DType fmt) {
  ST_CHECK(dnext.defined(), "layernorm_backward_dbias: dnext is undefined");
  layernorm_backward_impl(dinp, dweight, dbias, dnext, dout, inp, weight, mean, rstd, fmt);
}

void CudaBackend::layernorm_backward_impl(const Tensor& dinp, const Tensor& dweight,
                                          const Tensor& dbias, const Tensor& dnext,
                                          const Tensor& dout, const Tensor& inp,
                                          const Tensor& weight, const Tensor& mean,
                                          const Tensor& rstd, DType fmt) {
  const DType s = storage_dtype(fmt);
  ST_CHECK(inp.defined() && inp.ndim() >= 1 && inp.dim(-1) > 0, "layernorm_backward: inp ",
           inp.desc());
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  check_same(dinp, inp, "layernorm dinp vs inp");
  check_same(dout, inp, "layernorm dout vs inp");
  check_shape(dweight, {C}, "layernorm dweight");
  check_shape(dbias, {C}, "layernorm dbias");
  ST_CHECK(mean.numel() == N && rstd.numel() == N, "layernorm backward: mean/rstd need ", N,
           " elements, got ", mean.desc(), ", ", rstd.desc());
  check_operand(dinp, s, "layernorm_backward: dinp");
  check_operand(dweight, s, "layernorm_backward: dweight");
  check_operand(dbias, s, "layernorm_backward: dbias");
  check_operand(dout, s, "layernorm_backward: dout");
  check_operand(inp, s, "layernorm_backward: inp");
  check_operand(weight, s, "layernorm_backward: weight");
  check_operand(mean, DType::F32, "layernorm_backward: mean");
  check_operand(rstd, DType::F32, "layernorm_backward: rstd");
  for (const Tensor* out : {&dinp, &dweight, &dbias}) {
    for (const Tensor* in : {&dout, &inp, &weight, &mean, &rstd})
      check_disjoint(*out, *in, "layernorm_backward");
  }
  check_disjoint(dinp, dweight, "layernorm_backward");
  check_disjoint(dinp, dbias, "layernorm_backward");
  check_disjoint(dweight, dbias, "layernorm_backward");
  if (dnext.defined()) {
    check_shape(dnext, {C}, "layernorm dnext");
    check_operand(dnext, s, "layernorm_backward: dnext");
    for (const Tensor* t : {&dinp, &dweight, &dbias, &dout, &inp, &weight, &mean, &rstd})
      check_disjoint(dnext, *t, "layernorm_backward");
  }
  if (N == 0) return;
  const int n = to_int(N, "N"), c = to_int(C, "C");
  auto scr = scratch(cudak::layernorm_backward_scratch(n, c) * sizeof(float));
  cudak::layernorm_backward(dinp.raw(), dweight.raw(), dbias.raw(),
                            dnext.defined() ? dnext.raw() : nullptr, dout.raw(), inp.raw(),
                            weight.raw(), static_cast<const float*>(mean.raw()),
                            static_cast<const float*>(rstd.raw()), n, c, s,
                            static_cast<float*>(scr->data), stream_);
}

// ---------------------------------------------------------------- matmul

// out (N,OC) = inp (N,C) . weight (OC,C)^T + bias (OC). Leading dimensions of inp and out
// are flattened into N, so (B,T,C) activations are accepted as they are.
void CudaBackend::matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias, DType fmt) {
  const DType storage = storage_dtype(fmt);
  ST_CHECK(weight.defined() && weight.ndim() == 2 && weight.dim(0) > 0 && weight.dim(1) > 0,
           "matmul_forward: weight ", weight.desc(), " must be (OC, C)");
  const int64_t OC = weight.dim(0), C = weight.dim(1);
  ST_CHECK(inp.defined() && inp.ndim() >= 1 && inp.dim(-1) == C, "matmul_forward: inp ", inp.desc(),
           " must be (N, ", C, ") for weight ", weight.desc());
  const int64_t N = inp.numel() / C;
  ST_CHECK(out.defined() && out.ndim() >= 1 && out.dim(-1) == OC && out.numel() == N * OC,
           "matmul_forward: out ", out.desc(), " must be (", N, ", ", OC, ") for inp ", inp.desc(),
           " and weight ", weight.desc());
  check_operand(out, storage, "matmul_forward: out");
  check_operand(inp, storage, "matmul_forward: inp");
  check_operand(weight, storage, "matmul_forward: weight");
  if (bias.defined()) {
    check_shape(bias, {OC}, "matmul_forward: bias");
    check_operand(bias, storage, "matmul_forward: bias");
  }
  if (N == 0) return;
  ST_CHECK(!overlaps(out, inp) && !overlaps(out, weight) && !overlaps(out, bias),
           "matmul_forward: out ", out.desc(), " overlaps an input (cuBLASLt cannot run in place)");
  gemm_->run(out.raw(), inp.raw(), weight.raw(), bias.defined() ? bias.raw() : nullptr, N, C, OC,
             storage, stream_);
}

// dinp = round(dout . weight) (overwritten); dweight = round(dweight + round(dout^T . inp))
// (BF16/FP16: the product in a scratch buffer, then one add; matmul.cu), as the CPU; dbias =
// round(dbias + colsum(dout)) (reduce.cu).
void CudaBackend::matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                  DType fmt) {
  const DType s = storage_dtype(fmt);
  ST_CHECK(weight.defined() && weight.ndim() == 2 && weight.dim(0) > 0 && weight.dim(1) > 0,
           "matmul_backward: weight ", weight.desc(), " must be (OC, C)");
  const int64_t OC = weight.dim(0), C = weight.dim(1);
  ST_CHECK(inp.defined() && inp.ndim() >= 1 && inp.dim(-1) == C, "matmul_backward: inp ",
           inp.desc(), " must be (N, ", C, ") for weight ", weight.desc());
  const int64_t N = inp.numel() / C;
  check_same(dweight, weight, "matmul dweight vs weight");
  ST_CHECK(dout.defined() && dout.numel() == N * OC && dout.dim(-1) == OC, "matmul backward: dout ",
           dout.desc(), ", expected ", N, " x ", OC);
  if (dinp.defined()) check_same(dinp, inp, "matmul dinp vs inp");
  if (dbias.defined()) check_shape(dbias, {OC}, "matmul dbias");
  check_operand(dweight, s, "matmul_backward: dweight");
  check_operand(dout, s, "matmul_backward: dout");
  check_operand(inp, s, "matmul_backward: inp");
  check_operand(weight, s, "matmul_backward: weight");
  if (dinp.defined()) check_operand(dinp, s, "matmul_backward: dinp");
  if (dbias.defined()) check_operand(dbias, s, "matmul_backward: dbias");
  for (const Tensor* out : {&dinp, &dweight, &dbias}) {
    for (const Tensor* in : {&dout, &inp, &weight})
      ST_CHECK(!overlaps(*out, *in), "matmul_backward: ", out->desc(), " overlaps the input ",
               in->desc(), " (cuBLASLt cannot run in place)");
  }
  check_disjoint(dinp, dweight, "matmul_backward");
  check_disjoint(dinp, dbias, "matmul_backward");
  check_disjoint(dweight, dbias, "matmul_backward");
  if (N == 0) return;
  if (dinp.defined())
    gemm_->backward_dinp(dinp.raw(), dout.raw(), weight.raw(), N, C, OC, s, stream_);
  std::shared_ptr<Storage> product;
  if (s != DType::F32) product = scratch(static_cast<size_t>(OC * C) * dtype_size(s));
  gemm_->backward_dweight(dweight.raw(), product ? product->data : nullptr, dout.raw(), inp.raw(),
                          N, C, OC, s, stream_);
  if (dbias.defined()) {
    const int n = to_int(N, "N"), oc = to_int(OC, "OC");
    auto scr = scratch(cudak::colsum_scratch(n, oc) * sizeof(float));
    cudak::colsum_accumulate(dbias.raw(), dout.raw(), n, oc, s, static_cast<float*>(scr->data),
                             stream_);
  }
}

// dbias = round(dbias + colsum(dout)) (reduce.cu): matmul_backward's dbias alone.
void CudaBackend::bias_backward(const Tensor& dbias, const Tensor& dout, DType fmt) {
  const DType s = storage_dtype(fmt);
  ST_CHECK(dbias.defined() && dbias.ndim() == 1 && dbias.numel() > 0, "bias_backward: dbias ",
           dbias.desc(), " must be (OC)");
  const int64_t OC = dbias.numel();
  ST_CHECK(dout.defined() && dout.dim(-1) == OC, "bias_backward: dout ", dout.desc(),
           ", expected (N, ", OC, ")");
  check_operand(dbias, s, "bias_backward: dbias");
  check_operand(dout, s, "bias_backward: dout");
  check_disjoint(dbias, dout, "bias_backward");
  const int n = to_int(dout.numel() / OC, "N"), oc = to_int(OC, "OC");
  if (n == 0) return;
  auto scr = scratch(cudak::colsum_scratch(n, oc) * sizeof(float));
  cudak::colsum_accumulate(dbias.raw(), dout.raw(), n, oc, s, static_cast<float*>(scr->data),
                           stream_);
}

// ---------------------------------------------------------------- elementwise

void CudaBackend::gelu_forward(const Tensor& out, const Tensor& inp, DType fmt) {
  const DType s = storage_dtype(fmt);
  check_same(out, inp, "gelu out vs inp");
  check_operand(out, s, "gelu_forward: out");
  check_operand(inp, s, "gelu_forward: inp");
  check_elementwise_alias(out, inp, "gelu_forward");
  cudak::gelu_forward(out.raw(), inp.raw(), static_cast<size_t>(inp.numel()), s, stream_);
}

namespace {
// The operands of a GELU backward (what: the method's name, for the errors).
void check_gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, DType s,
                         const std::string& what) {
  check_same(dinp, inp, "gelu dinp vs inp");
  check_same(dout, inp, "gelu dout vs inp");
  check_operand(dinp, s, (what + ": dinp").c_str());
  check_operand(inp, s, (what + ": inp").c_str());
  check_operand(dout, s, (what + ": dout").c_str());
  check_elementwise_alias(dinp, inp, what.c_str());
  check_elementwise_alias(dinp, dout, what.c_str());
}
}  // namespace

void CudaBackend::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout,
                                DType fmt) {
  const DType s = storage_dtype(fmt);
  check_gelu_backward(dinp, inp, dout, s, "gelu_backward");
  cudak::gelu_backward(dinp.raw(), inp.raw(), dout.raw(), static_cast<size_t>(inp.numel()), s,
                       stream_);
}

// gelu_backward over the (N, OC) view and dbias += colsum(dinp) in one pass (elementwise.cu):
// the bits of gelu_backward then bias_backward.
void CudaBackend::gelu_backward_dbias(const Tensor& dinp, const Tensor& dbias, const Tensor& inp,
                                      const Tensor& dout, DType fmt) {
  const DType s = storage_dtype(fmt);
  check_gelu_backward(dinp, inp, dout, s, "gelu_backward_dbias");
  ST_CHECK(dbias.defined() && dbias.ndim() == 1 && dbias.numel() > 0 &&
               inp.dim(-1) == dbias.numel(),
           "gelu_backward_dbias: dbias ", dbias.desc(), " must be (OC) for inp ", inp.desc());
  check_operand(dbias, s, "gelu_backward_dbias: dbias");
  for (const Tensor* t : {&dinp, &inp, &dout})
    check_disjoint(dbias, *t, "gelu_backward_dbias");
  const int64_t OC = dbias.numel();
  const int n = to_int(inp.numel() / OC, "N"), oc = to_int(OC, "OC");
  if (n == 0) return;
  auto scr = scratch(cudak::colsum_scratch(n, oc) * sizeof(float));
  cudak::gelu_backward_dbias(dinp.raw(), dbias.raw(), inp.raw(), dout.raw(), n, oc, s,
                             static_cast<float*>(scr->data), stream_);
}

void CudaBackend::residual_forward(const Tensor& out, const Tensor& a, const Tensor& b, DType fmt) {
  const DType s = storage_dtype(fmt);
  check_residual(out, a, b, s, "residual_forward");
  cudak::residual_forward(out.raw(), a.raw(), b.raw(), static_cast<size_t>(a.numel()), s, stream_);
}

// ---------------------------------------------------------------- classifier

void CudaBackend::crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits,
                                                const Tensor& logits, const Tensor& targets, int V,
                                                float dloss, DType fmt) {
  const DType s = storage_dtype(fmt);
  ST_CHECK(logits.defined() && logits.ndim() >= 1 && logits.dim(-1) > 0, "crossentropy: logits ",
           logits.desc());
  const int64_t Vp = logits.dim(-1), N = logits.numel() / Vp;
  ST_CHECK(V > 0 && V <= Vp, "crossentropy: V = ", V, " with ", Vp, " logit columns");
  ST_CHECK(losses.defined() && losses.numel() == N, "crossentropy: losses ", losses.desc(),
           ", expected ", N);
  ST_CHECK(targets.defined() && targets.numel() == N && targets.device() == Device::CPU &&
               targets.dtype() == DType::I32,
           "crossentropy: targets ", targets.desc(), ", expected ", N, " host int32");
  const int32_t* tg = static_cast<const int32_t*>(targets.raw());
  for (int64_t i = 0; i < N; ++i)
    ST_CHECK(tg[i] >= 0 && tg[i] < V, "crossentropy: target ", tg[i], " at position ", i,
             " is outside the vocabulary [0, ", V, ")");
  check_operand(logits, s, "crossentropy: logits");
  check_operand(losses, DType::F32, "crossentropy: losses");
  check_disjoint(losses, logits, "crossentropy");
  if (dlogits.defined()) {
    check_same(dlogits, logits, "crossentropy dlogits vs logits");
    check_operand(dlogits, s, "crossentropy: dlogits");
    check_elementwise_alias(dlogits, logits, "crossentropy");
    check_disjoint(losses, dlogits, "crossentropy");
  }
  if (N == 0) return;
  auto tgt = upload_ints(tg, static_cast<size_t>(N));
  cudak::crossentropy(static_cast<float*>(losses.raw()),
                      dlogits.defined() ? dlogits.raw() : nullptr, logits.raw(),
                      static_cast<const int32_t*>(tgt->data), to_int(N, "N"), V, to_int(Vp, "Vp"),
                      dloss, s, stream_);
}

// ---------------------------------------------------------------- reductions

double CudaBackend::sum_squares(const Tensor& t) {
  ST_CHECK(t.defined(), "sum_squares: undefined tensor");
  ST_CHECK(t.device() == Device::CUDA, "sum_squares: ", t.desc(), " must be on the GPU");
  const size_t n = static_cast<size_t>(t.numel());
  if (n == 0) return 0.0;
  const size_t parts = cudak::sum_squares_scratch(n);
  auto scr = scratch((parts + 1) * sizeof(double));
  auto* part = static_cast<double*>(scr->data);
  cudak::sum_squares(part + parts, t.raw(), n, t.dtype(), part, stream_);
  double r;
  std::memcpy(&r, fetch_small(part + parts, sizeof(double)), sizeof(double));
  return r;
}

bool CudaBackend::all_finite(const Tensor& t) {
  ST_CHECK(t.defined(), "all_finite: undefined tensor");
  ST_CHECK(t.device() == Device::CUDA, "all_finite: ", t.desc(), " must be on the GPU");
  const size_t n = static_cast<size_t>(t.numel());
  if (n == 0) return true;
  auto scr = scratch(sizeof(int));
  ST_CUDA_CHECK(cudaMemsetAsync(scr->data, 0, sizeof(int), stream_));
  cudak::any_nonfinite(static_cast<int*>(scr->data), t.raw(), n, t.dtype(), stream_);
  int bad;
  std::memcpy(&bad, fetch_small(scr->data, sizeof(int)), sizeof(int));
  return bad == 0;
}

// ---------------------------------------------------------------- optimizer

void CudaBackend::adamw_update(const Tensor& master, const Tensor& param, const Tensor& grad,
                               const Tensor& m, const Tensor& v, const AdamWArgs& a, DType fmt) {
  const DType s = storage_dtype(fmt);
  check_operand(master, DType::F32, "adamw: master");
  check_same(m, master, "adamw m vs master");
  check_same(v, master, "adamw v vs master");
  check_operand(m, DType::F32, "adamw: m");
  check_operand(v, DType::F32, "adamw: v");
  ST_CHECK(grad.defined() && param.defined() && grad.numel() == master.numel() &&
               param.numel() == master.numel(),
           "adamw: grad ", grad.desc(), " / param ", param.desc(), " vs master ", master.desc());
  check_operand(grad, s, "adamw: grad");
  check_operand(param, s, "adamw: param");
  const bool alias = same_memory(param, master);
  for (const Tensor* t : {&grad, &m, &v}) {
    check_disjoint(master, *t, "adamw");
    check_disjoint(param, *t, "adamw");
  }
  check_disjoint(m, v, "adamw");
  check_disjoint(m, grad, "adamw");
  check_disjoint(v, grad, "adamw");
  if (!alias) check_disjoint(param, master, "adamw");
  const size_t n = static_cast<size_t>(master.numel());
  if (n == 0) return;
  const cudak::AdamWScalars k =
      cudak::adamw_scalars(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step, a.grad_scale);
  const bool stochastic = stochastic_rounding_ && !alias && s != DType::F32;
  cudak::adamw(static_cast<float*>(master.raw()), alias ? nullptr : param.raw(), grad.raw(),
               static_cast<float*>(m.raw()), static_cast<float*>(v.raw()), n, k, s, stochastic,
               sr_seed_, static_cast<uint64_t>(a.step), static_cast<uint64_t>(param.offset()),
               stream_);
}

}  // namespace st
