// attention.backend: cudnn — NVIDIA's fused flash attention (cuDNN 9) behind the Attention
// interface, so a run can put the kernel most people train with beside baseline, our flash
// and stabilized flash (issue 25). This file: the Attention class (the settings it refuses,
// its checks, running a cached plan on the call's buffers, the statistics) and, in a build
// without cuDNN, the functions of cuda/attention_cuda.h that say so.
//
// How: one operation graph for the forward and one for the backward, through cuDNN 9's
// graph API (cuda/cudnn_graph.cu: the graphs, their layouts, what they compute); plans built
// once per shape and cached in the backend's cuDNN state (cuda/cudnn_plan.cu: engine choice,
// workspace, determinism per cuDNN's numerical notes). Their shared pieces:
// cuda/cudnn_internal.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "cuda/attention_cuda.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/cudnn_graph_ir.h"

#if defined(ST_WITH_CUDNN)
#include <cudnn.h>

#include "cuda/cudnn_internal.h"
#include "cuda/flash_plan.h"
#endif

namespace st {

#if !defined(ST_WITH_CUDNN)

std::string cudnn_version_text() {
  return "none: this build has no cuDNN (CMake found no cudnn_graph.h / libcudnn 9)";
}
std::unique_ptr<Attention> make_attention_cuda_cudnn(CudaBackend&, const AttentionConfig&) {
  fail("attention.backend = cudnn: this build has no cuDNN (CMake found no cudnn_graph.h and "
       "libcudnn 9 when it was configured); install cuDNN 9 and rebuild, or use flash");
}
std::string cudnn_attention_describe(const Attention& attn) {
  fail("cudnn_attention_describe: this build has no cuDNN (attention '", attn.name(), "')");
}
bool cudnn_attention_nondeterministic(const Attention& attn) {
  fail("cudnn_attention_nondeterministic: this build has no cuDNN (attention '", attn.name(),
       "')");
}
CudnnDevicelessReport cudnn_plan_deviceless(const std::string&, int, int, int, int, DType,
                                            bool) {
  fail("cudnn_plan_deviceless: this build has no cuDNN");
}
namespace cudnn_ir {
Graph attention_graph(bool, int, int, int, int, DType, bool) {
  fail("cudnn_ir::attention_graph: this build has no cuDNN");
}
std::vector<Binding> attention_bindings(bool, int64_t, bool) {
  fail("cudnn_ir::attention_bindings: this build has no cuDNN");
}
}  // namespace cudnn_ir

#else  // ST_WITH_CUDNN

namespace {

using namespace cudnn_impl;

// The attention.* settings mean our rounding points; cuDNN has its own. Any that is set
// (to other than its default) is refused by name rather than silently ignored.
void check_config(const AttentionConfig& c) {
  const char* why =
      " is not a setting of attention.backend cudnn: cuDNN's fused attention rounds at its "
      "own points (docs/numerics.md, \"cuDNN\"); leave it unset, or use flash to control it";
  const std::pair<const char*, const std::optional<DType>*> points[] = {
      {"qkv", &c.qkv},     {"scores", &c.scores}, {"probs", &c.probs}, {"accum", &c.accum},
      {"out", &c.out},     {"mac", &c.mac},       {"grads", &c.grads}, {"lsum", &c.lsum},
      {"lsum_mac", &c.lsum_mac}};
  for (const auto& [key, v] : points)
    if (v->has_value()) fail("attention.", key, " = ", dtype_name(**v), why);
  if (c.rule != RoundingRule::Gpu) fail("attention.rule = ", rounding_rule_name(c.rule), why);
  if (c.delta != DeltaMode::O) fail("attention.delta = ", delta_mode_name(c.delta), why);
  if (c.o_tilde_bits) fail("attention.o_tilde_bits = ", c.o_tilde_bits, why);
  if (c.o_tilde_gain != 0) fail("attention.o_tilde_gain = ", c.o_tilde_gain, why);
  if (c.o_tilde_scope != OTildeScope::All)
    fail("attention.o_tilde_scope = ", o_tilde_scope_name(c.o_tilde_scope), why);
  if (c.tie_break != 0) fail("attention.tie_break = ", c.tie_break, why);
  if (!c.fp32_out_heads.empty()) fail("attention.fp32_out_heads", why);
  const AttentionConfig d;
  if (c.block_q != d.block_q || c.block_k != d.block_k)
    fail("attention.block_q / block_k = ", c.block_q, " / ", c.block_k,
         " choose our flash kernels' tiles; cuDNN chooses its own (leave them at ", d.block_q,
         ")");
  if (c.beta != d.beta || c.max_shift != d.max_shift || c.tie_shift != d.tie_shift)
    fail("attention.beta / max_shift / tie_shift belong to stabilized_flash; cuDNN's fused "
         "attention has no tie shift (leave them unset with backend cudnn)");
}

// cuDNN's tensors are declared 16-byte aligned; lse (4) goes through aligned_lse.
void check_gpu(const Tensor& t, DType dtype, const char* what, size_t align) {
  check_device_tensor(t, dtype, "cudnn attention", what, align);
}

class CudnnAttention : public Attention {
 public:
  CudnnAttention(CudaBackend& be, const AttentionConfig& cfg)
      : Attention(cfg.collect_stats), be_(be), cfg_(cfg) {
    ST_CHECK(cfg.kind == AttentionKind::Cudnn, "make_attention_cuda_cudnn: attention kind ",
             attention_kind_name(cfg.kind));
    check_config(cfg);
    int dev = 0, major = 0;
    ST_CUDA_CHECK(cudaGetDevice(&dev));
    ST_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 8)
      fail("attention.backend = cudnn: cuDNN's fused flash attention needs an SM 8.0 (Ampere) "
           "or newer GPU; this one is SM ", major, ".x (use flash or baseline)");
    state_of(be);  // the handle now, so a missing libcudnn is reported at model build
  }

  std::string name() const override { return "cudnn"; }

  void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head,
               DType fmt) override {
    const Shape4 s = dims(qkv, n_head, fmt);
    check_gpu(qkv, fmt, "qkv", 16);
    check_gpu(out, fmt, "out", 16);
    check_gpu(lse, DType::F32, "lse", 4);
    check_shape(out, {s.B, s.T, s.C()}, "cudnn attention out");
    check_shape(lse, {s.B, s.H, s.T}, "cudnn attention lse");
    ST_CHECK(!overlaps(out, qkv) && !overlaps(lse, qkv) && !overlaps(out, lse),
             "cudnn attention: out ", out.desc(), " / lse ", lse.desc(), " overlap qkv ",
             qkv.desc(), " or each other");
    Plan& p = plan(true, s, fmt);
    scale_ = flash::scale_of(static_cast<int>(s.D));  // 1/sqrt(HS) in FP32, as our kernels
    void* ws = workspace(p.workspace);
    Buffers b;
    b.es = dtype_size(fmt);
    b.qkv = static_cast<char*>(const_cast<void*>(qkv.raw()));
    b.out = static_cast<char*>(out.raw());
    b.lse = static_cast<char*>(aligned_lse(lse));
    void* stats = b.lse;
    execute(p, cudnn_ir::attention_bindings(true, s.C(), cfg_.causal), b, ws, "forward");
    if (stats != lse.raw())
      ST_CUDA_CHECK(cudaMemcpyAsync(lse.raw(), stats, lse.nbytes(), cudaMemcpyDeviceToDevice,
                                    be_.stream()));
    B_ = s.B, T_ = s.T, NH_ = n_head, fmt_ = fmt;
    have_forward_ = true;
    if (collect_stats_) collect_stats(qkv, lse, s, fmt);
  }

  void backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                const Tensor& lse, int n_head, DType fmt) override {
    const Shape4 s = dims(qkv, n_head, fmt);
    check_gpu(qkv, fmt, "qkv", 16);
    check_gpu(out, fmt, "out", 16);
    check_gpu(dout, fmt, "dout", 16);
    check_gpu(dqkv, fmt, "dqkv", 16);
    check_gpu(lse, DType::F32, "lse", 4);
    check_shape(dqkv, qkv.shape(), "cudnn attention dqkv");
    check_shape(out, {s.B, s.T, s.C()}, "cudnn attention out");
    check_shape(dout, {s.B, s.T, s.C()}, "cudnn attention dout");
    check_shape(lse, {s.B, s.H, s.T}, "cudnn attention lse");
    for (const Tensor* t : {&qkv, &out, &dout, &lse})
      ST_CHECK(!overlaps(dqkv, *t), "cudnn attention backward: dqkv ", dqkv.desc(),
               " overlaps an input ", t->desc());
    ST_CHECK(have_forward_ && B_ == s.B && T_ == s.T && NH_ == n_head && fmt_ == fmt,
             "cudnn attention backward called without a matching forward");
    if (s.T == 1)
      fail("attention.backend = cudnn: cuDNN's fused attention backward does not take a "
           "sequence of length 1 (train.seq_len >= 2)");
    Plan& p = plan(false, s, fmt);
    scale_ = flash::scale_of(static_cast<int>(s.D));
    // Our region first (D = rowsum(dO * O), FP32, B*NH*T), then cuDNN's workspace.
    const int64_t d_bytes = (s.B * s.H * s.T * 4 + 255) / 256 * 256;
    char* ws = static_cast<char*>(workspace(d_bytes + p.workspace));
    Buffers b;
    b.es = dtype_size(fmt);
    b.qkv = static_cast<char*>(const_cast<void*>(qkv.raw()));
    b.out = static_cast<char*>(const_cast<void*>(out.raw()));
    b.lse = static_cast<char*>(aligned_lse(lse));
    b.dout = static_cast<char*>(const_cast<void*>(dout.raw()));
    b.dqkv = static_cast<char*>(dqkv.raw());
    b.workspace = ws;
    if (b.lse != lse.raw())
      ST_CUDA_CHECK(cudaMemcpyAsync(b.lse, lse.raw(), lse.nbytes(), cudaMemcpyDeviceToDevice,
                                    be_.stream()));
    execute(p, cudnn_ir::attention_bindings(false, s.C(), cfg_.causal), b, ws + d_bytes,
            "backward");
  }

  std::string describe() const {
    std::string r = "cuDNN " + version_string(cudnnGetVersion()) + " (built with " +
                    version_string(CUDNN_VERSION) + ")";
    if (last_fwd_) r += "; forward: " + plan_text(*last_fwd_);
    if (last_bwd_) r += "; backward: " + plan_text(*last_bwd_);
    return r;
  }
  bool last_backward_nondeterministic() const {
    return last_bwd_ && last_bwd_->nondeterministic;
  }

 private:
  Shape4 dims(const Tensor& qkv, int n_head, DType fmt) const {
    if (fmt != DType::BF16 && fmt != DType::F16)
      fail("attention.backend = cudnn needs a bf16 or fp16 compute format (got ",
           dtype_name(fmt), "): cuDNN's fused attention takes 16-bit inputs");
    ST_CHECK(qkv.defined() && qkv.ndim() == 3 && qkv.dim(2) % 3 == 0,
             "cudnn attention: qkv must be (B, T, 3C), got ",
             qkv.defined() ? qkv.desc() : "undefined");
    const int64_t C = qkv.dim(2) / 3;
    ST_CHECK(n_head > 0 && C % n_head == 0, "cudnn attention: n_embd ", C,
             " is not divisible by n_head ", n_head);
    Shape4 s{qkv.dim(0), n_head, qkv.dim(1), C / n_head};
    if (s.D != 64 && s.D != 128)
      fail("attention.backend = cudnn: head size ", s.D,
           " (n_embd / n_head) is not supported here (64 or 128)");
    ST_CHECK(s.B > 0 && s.T > 0, "cudnn attention: empty batch ", qkv.desc());
    return s;
  }

  Plan& plan(bool fwd, const Shape4& s, DType fmt) {
    CudaBackend::CudnnState& st = state_of(be_);
    auto& cache = fwd ? st.fwd : st.bwd;
    const PlanKey key{s.B, s.T, s.H, s.D, static_cast<int>(fmt), cfg_.causal};
    auto it = cache.find(key);
    if (it == cache.end()) {
      char what[160];
      std::snprintf(what, sizeof what, "%s B=%lld T=%lld NH=%lld HS=%lld %s%s",
                    fwd ? "forward" : "backward", static_cast<long long>(s.B),
                    static_cast<long long>(s.T), static_cast<long long>(s.H),
                    static_cast<long long>(s.D), dtype_name(fmt), cfg_.causal ? " causal" : "");
      auto g = fwd ? forward_graph(st.handle, s, fmt, cfg_.causal, what)
                   : backward_graph(st.handle, s, fmt, cfg_.causal, what);
      auto p = std::make_unique<Plan>(make_plan(st.handle, std::move(g), what));
      if (!fwd && p->nondeterministic) {
        static std::once_flag warned;
        std::call_once(warned, [&] {
          std::fprintf(stderr,
                       "warning: attention.backend cudnn: the backward engine cuDNN chose for "
                       "%s is marked non-deterministic: runs with cudnn layers may not repeat "
                       "bit for bit\n", what);
        });
      }
      it = cache.emplace(key, std::move(p)).first;
    }
    (fwd ? last_fwd_ : last_bwd_) = it->second.get();
    return *it->second;
  }

  // lse is a layer's view of the model's (L, B, NH, T) buffer, 4-byte aligned; cuDNN's
  // Stats tensor is declared 16-byte aligned, so a misaligned lse goes through a copy.
  void* aligned_lse(const Tensor& lse) {
    if (reinterpret_cast<uintptr_t>(lse.raw()) % 16 == 0) return lse.raw();
    if (!lse_buf_.defined() || lse_buf_.numel() < lse.numel())
      lse_buf_ = be_.alloc({lse.numel()}, DType::F32);
    return lse_buf_.raw();
  }

  void* workspace(int64_t bytes) {
    if (bytes <= 0) return nullptr;
    Tensor& ws = state_of(be_).workspace;
    if (!ws.defined() || ws.nbytes() < static_cast<size_t>(bytes))
      ws = be_.alloc({(bytes + 3) / 4}, DType::F32);
    return ws.raw();
  }

  // Base pointers of one call's buffers (element size es for qkv, out, dout, dqkv; FP32 for
  // lse and the workspace region).
  struct Buffers {
    size_t es = 2;
    char *qkv = nullptr, *out = nullptr, *lse = nullptr, *dout = nullptr, *dqkv = nullptr,
         *workspace = nullptr;
  };

  void execute(const Plan& p, const std::vector<cudnn_ir::Binding>& binds, const Buffers& b,
               void* ws, const char* what) {
    // The -inf of the causal mask (cudnn-frontend uses FLT_LOWEST before cuDNN 9.10).
    neg_inf_ = cudnnGetVersion() >= 91000 ? -std::numeric_limits<float>::infinity()
                                          : std::numeric_limits<float>::lowest();
    std::vector<int64_t> uids;
    std::vector<void*> ptrs;
    for (const cudnn_ir::Binding& x : binds) {
      using cudnn_ir::Buffer;
      void* ptr = nullptr;
      switch (x.buffer) {
        case Buffer::Qkv: ptr = b.qkv + x.offset * b.es; break;
        case Buffer::Out: ptr = b.out + x.offset * b.es; break;
        case Buffer::Lse: ptr = b.lse + x.offset * 4; break;
        case Buffer::Dout: ptr = b.dout + x.offset * b.es; break;
        case Buffer::Dqkv: ptr = b.dqkv + x.offset * b.es; break;
        case Buffer::Workspace: ptr = b.workspace + x.offset * 4; break;
        case Buffer::Scale: ptr = &scale_; break;
        case Buffer::One: ptr = &one_; break;
        case Buffer::NegInf: ptr = &neg_inf_; break;
      }
      ST_CHECK(ptr != nullptr, "cudnn attention ", what, ": no buffer for tensor ", x.uid);
      uids.push_back(x.uid);
      ptrs.push_back(ptr);
    }
    Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, std::string(what) + " variant pack");
    vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
           static_cast<int64_t>(uids.size()), uids.data())
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
             static_cast<int64_t>(ptrs.size()), ptrs.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)
        .finalize();
    ST_CUDNN_DO(cudnnBackendExecute(state_of(be_).handle, p.plan.get(), vp.get()), what);
  }

  // Statistics from our per-row kernel (cuda/flash_aux.cu: the CPU's scores, tie test and
  // entropy) and cuDNN's own lse; P~ stays inside cuDNN's kernel, so p_tilde_one is -1 (not
  // measured) and tied_in_tile counts 64-key tiles (cuDNN's own tile width is its choice).
  void collect_stats(const Tensor& qkv, const Tensor& lse, const Shape4& s, DType fmt) {
    AttentionConfig fc;
    fc.kind = AttentionKind::Flash;
    fc.causal = cfg_.causal;
    fc.tie_tol = cfg_.tie_tol;
    const AttnNumerics n = flash::resolve_numerics(fc, fmt);
    const flash::CallDims d{static_cast<int>(s.B), static_cast<int>(s.T), static_cast<int>(s.H),
                            static_cast<int>(s.D)};
    const int64_t rows = s.B * s.H * s.T;
    if (!rowstats_.defined() || rowstats_.numel() != rows * 4)
      rowstats_ = be_.alloc({rows * 4}, DType::F32);  // 16-byte flash::RowStats per row
    flash::run_row_stats(fc, n, fmt, d, qkv.raw(), static_cast<flash::RowStats*>(rowstats_.raw()),
                         be_.stream());
    std::vector<flash::RowStats> rs(rows);
    std::vector<float> lse_h(rows);
    ST_CUDA_CHECK(cudaMemcpyAsync(rs.data(), rowstats_.raw(), rows * sizeof(flash::RowStats),
                                  cudaMemcpyDeviceToHost, be_.stream()));
    ST_CUDA_CHECK(cudaMemcpyAsync(lse_h.data(), lse.raw(), rows * sizeof(float),
                                  cudaMemcpyDeviceToHost, be_.stream()));
    ST_CUDA_CHECK(cudaStreamSynchronize(be_.stream()));
    const std::vector<int32_t> zeros(rows, 0);
    stats_ = flash::merge_row_stats(d, zeros.data(), lse_h.data(), rs.data(), n.probs);
    for (AttentionHeadStats& h : stats_) h.p_tilde_one = -1;
  }

  CudaBackend& be_;
  AttentionConfig cfg_;
  float scale_ = 0, one_ = 1.0f, neg_inf_ = 0;
  int64_t B_ = -1, T_ = -1;
  int NH_ = -1;
  DType fmt_ = DType::F32;
  bool have_forward_ = false;
  const Plan* last_fwd_ = nullptr;
  const Plan* last_bwd_ = nullptr;
  Tensor rowstats_, lse_buf_;
};

const CudnnAttention& cudnn_of(const Attention& attn) {
  auto* c = dynamic_cast<const CudnnAttention*>(&attn);
  ST_CHECK(c != nullptr, "cudnn hook: attention '", attn.name(),
           "' was not made by make_attention_cuda_cudnn");
  return *c;
}

}  // namespace

std::unique_ptr<Attention> make_attention_cuda_cudnn(CudaBackend& be, const AttentionConfig& cfg) {
  return std::make_unique<CudnnAttention>(be, cfg);
}

std::string cudnn_attention_describe(const Attention& attn) { return cudnn_of(attn).describe(); }
bool cudnn_attention_nondeterministic(const Attention& attn) {
  return cudnn_of(attn).last_backward_nondeterministic();
}

#endif  // ST_WITH_CUDNN

}  // namespace st
