// The pieces cuda/attention_cudnn.cu (the Attention class), cuda/cudnn_graph.cu (the two
// operation graphs) and cuda/cudnn_plan.cu (engine choice, plans, their cache) share: the
// RAII descriptor, cuDNN's error reporting, the graph builder, the shapes, the plan and the
// backend's cuDNN state. Internal to those three files; only with cuDNN (ST_WITH_CUDNN).
#pragma once
#if defined(ST_WITH_CUDNN)
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "cuda/cudnn_graph_ir.h"

namespace st::cudnn_impl {

// "9.19.0" from cuDNN's major * 10000 + minor * 100 + patch.
std::string version_string(size_t v);

// A failed cuDNN call: its text, cuDNN's status and cuDNN's own last message (which names
// the attribute or the engine that refused), in one line.
[[noreturn]] void cudnn_fail(cudnnStatus_t s, const char* what, const std::string& where);
#define ST_CUDNN_DO(call, where)                    \
  do {                                              \
    const cudnnStatus_t st_s_ = (call);             \
    if (st_s_ != CUDNN_STATUS_SUCCESS) ::st::cudnn_impl::cudnn_fail(st_s_, #call, where); \
  } while (0)

// One backend descriptor, destroyed with this object (RAII; move-only).
class Desc {
 public:
  Desc() = default;
  Desc(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
    ST_CUDNN_DO(cudnnBackendCreateDescriptor(type, &d_), what_);
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(o.d_), what_(std::move(o.what_)) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      if (d_) cudnnBackendDestroyDescriptor(d_);
      d_ = o.d_;
      what_ = std::move(o.what_);
      o.d_ = nullptr;
    }
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  // Takes ownership of a descriptor created (and finalized) with the raw API.
  static Desc adopt(cudnnBackendDescriptor_t d, std::string what) {
    Desc r;
    r.d_ = d;
    r.what_ = std::move(what);
    return r;
  }
  cudnnBackendDescriptor_t get() const { return d_; }

  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
            const void* values) {
    const cudnnStatus_t s = cudnnBackendSetAttribute(d_, name, type, count, values);
    if (s != CUDNN_STATUS_SUCCESS)
      cudnn_fail(s, ("set attribute " + std::to_string(static_cast<int>(name))).c_str(), what_);
    return *this;
  }
  Desc& i64(cudnnBackendAttributeName_t n, int64_t v) { return set(n, CUDNN_TYPE_INT64, 1, &v); }
  Desc& i64s(cudnnBackendAttributeName_t n, const std::vector<int64_t>& v) {
    return set(n, CUDNN_TYPE_INT64, static_cast<int64_t>(v.size()), v.data());
  }
  Desc& boolean(cudnnBackendAttributeName_t n, bool v) {
    return set(n, CUDNN_TYPE_BOOLEAN, 1, &v);
  }
  Desc& dtype(cudnnBackendAttributeName_t n, cudnnDataType_t v) {
    return set(n, CUDNN_TYPE_DATA_TYPE, 1, &v);
  }
  Desc& desc(cudnnBackendAttributeName_t n, const Desc& v) {
    cudnnBackendDescriptor_t p = v.get();
    return set(n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
  }
  Desc& finalize() {
    ST_CUDNN_DO(cudnnBackendFinalize(d_), what_);
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string what_;
};

cudnnDataType_t cudnn_type(DType t);

// The tensors of the two graphs, by unique id (the variant pack names them by it).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum,
  kFirstVirtual = 100,
};

// Builds one operation graph: tensors and operations in the order cudnn-frontend emits them
// (cuda/cudnn_graph.cu).
class GraphBuilder {
 public:
  GraphBuilder(cudnnHandle_t h, std::string what) : handle_(h), what_(std::move(what)) {}

  // A non-virtual tensor (a variant-pack entry), or a by-value scalar.
  const Desc& io(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides,
                 cudnnDataType_t t, bool by_value = false) {
    return tensor(uid, std::move(dims), std::move(strides), t, false, by_value);
  }
  // A virtual intermediate.
  const Desc& virt(std::vector<int64_t> dims, std::vector<int64_t> strides,
                   cudnnDataType_t t = CUDNN_DATA_FLOAT) {
    return tensor(next_virtual_++, std::move(dims), std::move(strides), t, true, false);
  }

  void matmul(const Desc& a, const Desc& b, const Desc& c, const char* name);
  // y = mode(x[, b][, t]); axis for GEN_INDEX; prec: the op's math precision.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc* t,
                 const Desc& y, const char* name, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1);
  // y = reduce(x) over the axes where y has size 1.
  void reduce(cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y, const char* name);
  // y = x seen through y's dims and strides (a transpose here).
  void reshape(const Desc& x, const Desc& y, const char* name);

  // The finalized operation graph; the builder keeps every descriptor it made alive.
  Desc graph();
  size_t op_count() const { return ops_.size(); }
  // The graph as plain data (cuda/cudnn_graph_ir.h), recorded as it was built.
  const cudnn_ir::Graph& ir() const { return ir_; }

 private:
  const Desc& tensor(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides,
                     cudnnDataType_t t, bool is_virtual, bool by_value);
  void keep(Desc d) { misc_.push_back(std::move(d)); }
  int64_t uid(const Desc* d) const;
  void record(cudnn_ir::Op op, const char* mode, int64_t axis, const Desc* x, const Desc* b,
              const Desc* t, const Desc& y, const char* name);
  static const char* pointwise_name(cudnnPointwiseMode_t m);

  cudnnHandle_t handle_;
  std::string what_;
  int64_t next_virtual_ = kFirstVirtual;
  std::vector<std::unique_ptr<Desc>> tensors_;  // stable addresses: ops refer to them
  std::vector<Desc> misc_;
  std::vector<Desc> ops_;
  std::map<const Desc*, int64_t> uid_of_;
  cudnn_ir::Graph ir_;
};

// Shapes in cuDNN's (batch, head, row, column) order; strides in elements.
struct Shape4 {
  int64_t B, H, T, D;
  int64_t C() const { return H * D; }
  // q, k, v (and dq, dk, dv) inside the packed (B, T, 3C) buffer.
  std::vector<int64_t> qkv_dims() const { return {B, H, T, D}; }
  std::vector<int64_t> qkv_strides() const { return {3 * C() * T, D, 3 * C(), 1}; }
  // The same, transposed by strides: (B, H, D, T).
  std::vector<int64_t> t_dims() const { return {B, H, D, T}; }
  std::vector<int64_t> t_strides() const { return {3 * C() * T, D, 1, 3 * C()}; }
  // out, dout (B, T, C).
  std::vector<int64_t> o_strides() const { return {T * C(), D, C(), 1}; }
  // scores (B, H, T, T) and their transposes; row vectors (B, H, T, 1).
  std::vector<int64_t> s_dims() const { return {B, H, T, T}; }
  std::vector<int64_t> s_strides() const { return {H * T * T, T * T, T, 1}; }
  std::vector<int64_t> st_strides() const { return {H * T * T, T * T, 1, T}; }
  std::vector<int64_t> r_dims() const { return {B, H, T, 1}; }
  std::vector<int64_t> r_strides() const { return {H * T, T, 1, 1}; }
};

// The graphs of cuda/cudnn_graph.cu for one shape (h: null builds them without a GPU).
std::unique_ptr<GraphBuilder> forward_graph(cudnnHandle_t h, const Shape4& s, DType fmt,
                                            bool causal, const std::string& what);
std::unique_ptr<GraphBuilder> backward_graph(cudnnHandle_t h, const Shape4& s, DType fmt,
                                             bool causal, const std::string& what);

// A finalized execution plan and everything it was built from.
struct Plan {
  std::unique_ptr<GraphBuilder> builder;
  Desc graph, config, plan;
  int64_t workspace = 0;  // bytes cuDNN's plan needs
  int64_t engine = -1;    // the engine's global index
  bool nondeterministic = false;
  int configs_tried = 0;
};

// Heuristics (mode A), then the first engine configuration whose plan finalizes
// (cuda/cudnn_plan.cu).
Plan make_plan(cudnnHandle_t handle, std::unique_ptr<GraphBuilder> b, const std::string& what);
// One line: engine, workspace, determinism per cuDNN's notes, ops, which configuration.
std::string plan_text(const Plan& p);

// (B, T, NH, HS, format, causal)
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int, bool>;

// The backend's cuDNN state, made on first use (the handle on the backend's stream).
CudaBackend::CudnnState& state_of(CudaBackend& be);

}  // namespace st::cudnn_impl

namespace st {

// The backend's cuDNN handle (on the backend's stream) and plan cache.
struct CudaBackend::CudnnState {
  cudnnHandle_t handle = nullptr;
  std::map<cudnn_impl::PlanKey, std::unique_ptr<cudnn_impl::Plan>> fwd, bwd;
  // One workspace for every layer: they run one after another on the backend's stream. (The
  // deterministic backward's can be large: cudnn-frontend sizes it near B NH T^2 2 bytes.)
  Tensor workspace;
  ~CudnnState() {
    workspace = Tensor();
    fwd.clear();  // plans before the handle they were made with
    bwd.clear();
    if (handle) cudnnDestroy(handle);
  }
};

}  // namespace st

#endif  // ST_WITH_CUDNN
