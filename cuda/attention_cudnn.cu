// attention.backend: cudnn — NVIDIA's fused flash attention (cuDNN 9) behind the Attention
// interface, so a run can put the kernel most people train with beside baseline, our flash
// and stabilized flash (issue 25).
//
// How. cuDNN 9's graph API (cudnn_graph.h, the "backend" API that ships with cuDNN; no
// cudnn-frontend): one operation graph for the forward and one for the backward, in the
// form cuDNN's fused flash-attention engines recognise on cuDNN 9.x before the single SDPA
// operation could carry a causal mask (9.21): matmuls, pointwise ops, reductions and, in
// the backward, reshapes (transposes). The graphs are exactly those cudnn-frontend emits for
// the same request (training, causal top-left, softmax stats kept, no dropout, no bias;
// docs/numerics.md, "cuDNN", lists them), written here against the C API:
//   forward   S = Q K^T; S *= scale; S = row >= col ? S : -inf; M = rowmax S; E = exp(S - M);
//             Z = rowsum E; Stats = M + log Z (the lse, FP32); P = E / Z in the compute
//             format; O = P V
//   backward  D = rowsum(dO * O) (FP32, in our workspace); P = exp(mask(S * scale - Stats));
//             dV = P^T dO (P in the compute format); dS = P (dO V^T - D) scale; dK = dS^T Q
//             (dS in the compute format); dQ = dS K
// Every virtual intermediate is FP32 and every op computes in FP32; which of those values
// cuDNN really keeps, in which order it sums, and where it rounds inside its kernels is
// NVIDIA's (not documented at that level): the lab has no equality claim on it.
//
// Deterministic backward: cudnn-frontend asks for it by the graph's shape: dQ written by the
// last matmul directly (no FP32 dQ accumulator that atomics add into). That is the graph
// built here. Whether the engine cuDNN then picks says it is deterministic is read from the
// engine's numerical notes (CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) and reported by
// cudnn_attention_describe; a configuration that would need a non-deterministic engine is
// taken (it is the only one there is) and says so on stderr once. On Blackwell (SM 10.x)
// cudnn-frontend pins a specific engine for determinism; this file does not (the target
// machines are Hopper), so there the notes decide what is reported.
//
// Layouts: q, k, v are read in place from the packed (B, T, 3C) qkv (strides (3CT, HS, 3C,
// 1) in (B, NH, T, HS)); out (B, T, C); lse (B, NH, T) FP32 is cuDNN's Stats (B, NH, T, 1);
// dq, dk, dv are written in place into dqkv. K (and V in the backward) enter the graphs
// transposed by strides, as cuDNN expects.
//
// Plans (descriptors, engine choice, workspace size) are built once per (B, T, NH, HS,
// format) and cached in the backend's cuDNN state, shared by every cudnn layer; the first
// build of a shape compiles cuDNN's kernels (runtime-compiled engines) and can take seconds.
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

std::string version_string(size_t v) {
  // cuDNN 9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

// A failed cuDNN call: its text, cuDNN's status and cuDNN's own last message (which names
// the attribute or the engine that refused), in one line.
[[noreturn]] void cudnn_fail(cudnnStatus_t s, const char* what, const std::string& where) {
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  for (char* c = last; *c; ++c)
    if (*c == '\n') *c = ' ';
  fail("cuDNN attention (", where, "): ", what, " failed: ", cudnnGetErrorString(s),
       last[0] ? std::string(" (") + last + ")" : std::string());
}
#define ST_CUDNN_DO(call, where)                    \
  do {                                              \
    const cudnnStatus_t st_s_ = (call);             \
    if (st_s_ != CUDNN_STATUS_SUCCESS) cudnn_fail(st_s_, #call, where); \
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

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::F32: return CUDNN_DATA_FLOAT;
    default: fail("cuDNN attention: no cuDNN type for ", dtype_name(t));
  }
}

// The tensors of the two graphs, by unique id (the variant pack names them by it).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum,
  kFirstVirtual = 100,
};

// Builds one operation graph: tensors and operations in the order cudnn-frontend emits them.
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

  void matmul(const Desc& a, const Desc& b, const Desc& c, const char* name) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR, what_ + " " + name + " matmul");
    mm.dtype(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    const double padding = 0.0;
    mm.set(CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &padding).finalize();
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what_ + " " + name);
    op.desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm)
        .finalize();
    keep(std::move(mm));
    ops_.push_back(std::move(op));
    record(cudnn_ir::Op::Matmul, "MATMUL", -1, &a, &b, nullptr, c, name);
  }
  // y = mode(x[, b][, t]); axis for GEN_INDEX; prec: the op's math precision.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc* t,
                 const Desc& y, const char* name, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what_ + " " + name + " mode");
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) pw.i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pw.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what_ + " " + name);
    const float one = 1.0f;
    op.desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
        .desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t) op.desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one)
        .finalize();
    keep(std::move(pw));
    ops_.push_back(std::move(op));
    record(cudnn_ir::Op::Pointwise, pointwise_name(mode), axis, &x, b, t, y, name);
  }
  // y = reduce(x) over the axes where y has size 1.
  void reduce(cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y, const char* name) {
    Desc rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what_ + " " + name + " mode");
    rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
        .dtype(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT)
        .finalize();
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what_ + " " + name);
    op.desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd)
        .desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .finalize();
    keep(std::move(rd));
    ops_.push_back(std::move(op));
    record(cudnn_ir::Op::Reduction, mode == CUDNN_REDUCE_TENSOR_MAX ? "MAX" : "ADD", -1, &x,
           nullptr, nullptr, y, name);
  }
  // y = x seen through y's dims and strides (a transpose here).
  void reshape(const Desc& x, const Desc& y, const char* name) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what_ + " " + name);
    op.desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x)
        .desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y)
        .finalize();
    ops_.push_back(std::move(op));
    record(cudnn_ir::Op::Reshape, "RESHAPE", -1, &x, nullptr, nullptr, y, name);
  }

  // The finalized operation graph; the builder keeps every descriptor it made alive.
  Desc graph() {
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const Desc& d : ops_) ops.push_back(d.get());
    Desc g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what_ + " operation graph");
    if (handle_) g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
          static_cast<int64_t>(ops.size()), ops.data())
        .finalize();
    return g;
  }
  size_t op_count() const { return ops_.size(); }
  // The graph as plain data (cuda/cudnn_graph_ir.h), recorded as it was built.
  const cudnn_ir::Graph& ir() const { return ir_; }

 private:
  const Desc& tensor(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides,
                     cudnnDataType_t t, bool is_virtual, bool by_value) {
    auto d = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                                    what_ + " tensor " + std::to_string(uid));
    d->dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, t)
        .i64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
        .i64s(CUDNN_ATTR_TENSOR_STRIDES, strides)
        .i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
        .i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
    if (is_virtual) d->boolean(CUDNN_ATTR_TENSOR_IS_VIRTUAL, true);
    if (by_value) d->boolean(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
    d->finalize();
    cudnn_ir::Tensor t_ir;
    t_ir.uid = uid;
    t_ir.dims = std::move(dims);
    t_ir.strides = std::move(strides);
    t_ir.type = t == CUDNN_DATA_BFLOAT16 ? "bf16"
                : t == CUDNN_DATA_HALF   ? "fp16"
                : t == CUDNN_DATA_FLOAT  ? "fp32"
                : t == CUDNN_DATA_INT32  ? "int32"
                : t == CUDNN_DATA_BOOLEAN ? "bool"
                                          : "other";
    t_ir.is_virtual = is_virtual;
    t_ir.by_value = by_value;
    ir_.tensors.push_back(std::move(t_ir));
    uid_of_[d.get()] = uid;
    tensors_.push_back(std::move(d));
    return *tensors_.back();
  }
  void keep(Desc d) { misc_.push_back(std::move(d)); }
  int64_t uid(const Desc* d) const {
    if (!d) return -1;
    const auto it = uid_of_.find(d);
    ST_CHECK(it != uid_of_.end(), "cuDNN graph ", what_, ": an operand is not a tensor of it");
    return it->second;
  }
  void record(cudnn_ir::Op op, const char* mode, int64_t axis, const Desc* x, const Desc* b,
              const Desc* t, const Desc& y, const char* name) {
    cudnn_ir::Node n;
    n.op = op;
    n.mode = mode;
    n.axis = axis;
    n.x = uid(x);
    n.b = uid(b);
    n.t = uid(t);
    n.y = uid(&y);
    n.name = name;
    ir_.nodes.push_back(std::move(n));
  }
  static const char* pointwise_name(cudnnPointwiseMode_t m) {
    switch (m) {
      case CUDNN_POINTWISE_MUL: return "MUL";
      case CUDNN_POINTWISE_ADD: return "ADD";
      case CUDNN_POINTWISE_SUB: return "SUB";
      case CUDNN_POINTWISE_DIV: return "DIV";
      case CUDNN_POINTWISE_EXP: return "EXP";
      case CUDNN_POINTWISE_LOG: return "LOG";
      case CUDNN_POINTWISE_GEN_INDEX: return "GEN_INDEX";
      case CUDNN_POINTWISE_CMP_GE: return "CMP_GE";
      case CUDNN_POINTWISE_BINARY_SELECT: return "BINARY_SELECT";
      default: return "?";
    }
  }

  cudnnHandle_t handle_;
  std::string what_;
  int64_t next_virtual_ = kFirstVirtual;
  std::vector<std::unique_ptr<Desc>> tensors_;  // stable addresses: ops refer to them
  std::vector<Desc> misc_;
  std::vector<Desc> ops_;
  std::map<const Desc*, int64_t> uid_of_;
  cudnn_ir::Graph ir_;

};

// A finalized execution plan and everything it was built from.
struct Plan {
  std::unique_ptr<GraphBuilder> builder;
  Desc graph, config, plan;
  int64_t workspace = 0;  // bytes cuDNN's plan needs
  int64_t engine = -1;    // the engine's global index
  bool nondeterministic = false;
  int configs_tried = 0;
};

// The engine behind an engine configuration: its global index and whether cuDNN's numerical
// notes call it non-deterministic (-1 / false where cuDNN will not say).
struct EngineInfo {
  int64_t engine = -1;
  bool nondeterministic = false;
};
EngineInfo engine_info(cudnnBackendDescriptor_t cfg) {
  EngineInfo r;
  cudnnBackendDescriptor_t engine = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS)
    return r;
  int64_t n = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &engine) == CUDNN_STATUS_SUCCESS) {
    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                             &r.engine);
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t nn = 0;
    if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn,
                                 notes) == CUDNN_STATUS_SUCCESS)
      for (int64_t i = 0; i < nn; ++i)
        r.nondeterministic |= notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  }
  cudnnBackendDestroyDescriptor(engine);
  return r;
}

// The engine configurations cuDNN's heuristics (mode A) propose for graph g, best first,
// after cuDNN's own support checks. With devprop (a device-properties descriptor) they are
// for the device it describes rather than the current GPU (cuDNN >= 9.8).
std::vector<Desc> heuristic_configs(const Desc& g, const std::string& what,
                                    cudnnBackendDescriptor_t devprop) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what + " heuristics");
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (devprop) heur.set(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
  heur.finalize();
  int64_t count = 0;
  ST_CUDNN_DO(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
              what + " heuristics");
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what + " engine config");
    raw.push_back(cfgs.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    ST_CUDNN_DO(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
                what + " heuristics");
  cfgs.resize(static_cast<size_t>(std::max<int64_t>(0, std::min(got, count))));
  return cfgs;
}

// One attempt to finalize an execution plan of cfg (on handle's GPU, or for devprop's).
struct PlanTry {
  Desc plan;  // empty when it failed
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  std::string error;  // cuDNN's status and last message when it failed
};
PlanTry try_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t devprop, const Desc& cfg,
                 const std::string& what) {
  PlanTry t;
  cudnnBackendDescriptor_t plan_d = nullptr;
  t.status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan_d);
  cudnnBackendDescriptor_t cfg_d = cfg.get();
  if (t.status == CUDNN_STATUS_SUCCESS)
    t.status = handle ? cudnnBackendSetAttribute(plan_d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                                 CUDNN_TYPE_HANDLE, 1, &handle)
                      : cudnnBackendSetAttribute(plan_d, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
  if (t.status == CUDNN_STATUS_SUCCESS)
    t.status = cudnnBackendSetAttribute(plan_d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg_d);
  if (t.status == CUDNN_STATUS_SUCCESS) t.status = cudnnBackendFinalize(plan_d);
  if (t.status != CUDNN_STATUS_SUCCESS) {
    char msg[512] = {0};
    cudnnGetLastErrorString(msg, sizeof msg);
    for (char* c = msg; *c; ++c)
      if (*c == '\n') *c = ' ';
    t.error = std::string(cudnnGetErrorString(t.status)) + (msg[0] ? std::string(": ") + msg : "");
    if (plan_d) cudnnBackendDestroyDescriptor(plan_d);
    return t;
  }
  t.plan = Desc::adopt(plan_d, what + " plan");
  return t;
}

int64_t workspace_of(const Desc& plan, const std::string& what) {
  int64_t n = 0, ws = 0;
  ST_CUDNN_DO(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &n, &ws),
              what + " workspace size");
  return ws;
}

// Heuristics (mode A), then the first engine configuration whose plan finalizes.
Plan make_plan(cudnnHandle_t handle, std::unique_ptr<GraphBuilder> b, const std::string& what) {
  Plan p;
  p.graph = b->graph();
  p.builder = std::move(b);
  std::vector<Desc> cfgs = heuristic_configs(p.graph, what, nullptr);
  if (cfgs.empty())
    fail("cuDNN attention (", what, "): cuDNN's heuristics offer no engine for this graph "
         "(cuDNN ", version_string(cudnnGetVersion()), "); use flash");
  std::string last_error;
  for (Desc& cfg : cfgs) {
    ++p.configs_tried;
    PlanTry t = try_plan(handle, nullptr, cfg, what);
    if (!t.plan.get()) {
      last_error = t.error;
      continue;
    }
    p.config = std::move(cfg);
    p.plan = std::move(t.plan);
    break;
  }
  if (!p.plan.get())
    fail("cuDNN attention (", what, "): none of the ", cfgs.size(), " engine configurations "
         "cuDNN ", version_string(cudnnGetVersion()), " proposed could be finalized (last: ",
         last_error, "); use flash");
  p.workspace = workspace_of(p.plan, what);
  const EngineInfo e = engine_info(p.config.get());
  p.engine = e.engine;
  p.nondeterministic = e.nondeterministic;
  return p;
}

// ---- the two graphs -------------------------------------------------------------------
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
const std::vector<int64_t> kOne4 = {1, 1, 1, 1};

// scores -> scores with -inf above the diagonal (row >= col kept): the top-left causal mask.
const Desc& causal_mask(GraphBuilder& g, const Shape4& s, const Desc& scores) {
  const Desc& row = g.virt(s.s_dims(), s.s_strides(), CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, row, "row index",
              CUDNN_DATA_FLOAT, 2);
  const Desc& col = g.virt(s.s_dims(), s.s_strides(), CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, col, "column index",
              CUDNN_DATA_FLOAT, 3);
  const Desc& keep = g.virt(s.s_dims(), s.s_strides(), CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep, "row >= col",
              CUDNN_DATA_BOOLEAN);
  const Desc& neg_inf = g.io(kNegInf, kOne4, kOne4, CUDNN_DATA_FLOAT, true);
  const Desc& masked = g.virt(s.s_dims(), s.s_strides());
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, &neg_inf, &keep, masked, "causal select");
  return masked;
}

std::unique_ptr<GraphBuilder> forward_graph(cudnnHandle_t h, const Shape4& s, DType fmt,
                                            bool causal, const std::string& what) {
  auto g = std::make_unique<GraphBuilder>(h, what);
  const cudnnDataType_t io = cudnn_type(fmt);
  const Desc& q = g->io(kQ, s.qkv_dims(), s.qkv_strides(), io);
  const Desc& kt = g->io(kK, s.t_dims(), s.t_strides(), io);
  const Desc& v = g->io(kV, s.qkv_dims(), s.qkv_strides(), io);
  const Desc& scale = g->io(kScale, kOne4, kOne4, CUDNN_DATA_FLOAT, true);
  const Desc& S = g->virt(s.s_dims(), s.s_strides());
  g->matmul(q, kt, S, "Q K^T");
  const Desc* scores = &g->virt(s.s_dims(), s.s_strides());
  g->pointwise(CUDNN_POINTWISE_MUL, S, &scale, nullptr, *scores, "scale");
  if (causal) scores = &causal_mask(*g, s, *scores);
  const Desc& m = g->virt(s.r_dims(), s.r_strides());
  g->reduce(CUDNN_REDUCE_TENSOR_MAX, *scores, m, "row max");
  const Desc& sm = g->virt(s.s_dims(), s.s_strides());
  g->pointwise(CUDNN_POINTWISE_SUB, *scores, &m, nullptr, sm, "S - M");
  const Desc& e = g->virt(s.s_dims(), s.s_strides());
  g->pointwise(CUDNN_POINTWISE_EXP, sm, nullptr, nullptr, e, "exp");
  const Desc& z = g->virt(s.r_dims(), s.r_strides());
  g->reduce(CUDNN_REDUCE_TENSOR_ADD, e, z, "row sum");
  const Desc& logz = g->virt(s.r_dims(), s.r_strides());
  g->pointwise(CUDNN_POINTWISE_LOG, z, nullptr, nullptr, logz, "log Z");
  const Desc& stats = g->io(kStats, s.r_dims(), s.r_strides(), CUDNN_DATA_FLOAT);
  g->pointwise(CUDNN_POINTWISE_ADD, m, &logz, nullptr, stats, "M + log Z");
  const Desc& p = g->virt(s.s_dims(), s.s_strides(), io);  // P in the I/O format
  g->pointwise(CUDNN_POINTWISE_DIV, e, &z, nullptr, p, "P = E / Z");
  const Desc& o = g->io(kO, s.qkv_dims(), s.o_strides(), io);
  g->matmul(p, v, o, "P V");
  return g;
}

std::unique_ptr<GraphBuilder> backward_graph(cudnnHandle_t h, const Shape4& s, DType fmt,
                                             bool causal, const std::string& what) {
  auto g = std::make_unique<GraphBuilder>(h, what);
  const cudnnDataType_t io = cudnn_type(fmt);
  const Desc& q = g->io(kQ, s.qkv_dims(), s.qkv_strides(), io);
  const Desc& kt = g->io(kK, s.t_dims(), s.t_strides(), io);
  const Desc& vt = g->io(kV, s.t_dims(), s.t_strides(), io);
  const Desc& o = g->io(kO, s.qkv_dims(), s.o_strides(), io);
  const Desc& dO = g->io(kDO, s.qkv_dims(), s.o_strides(), io);
  const Desc& stats = g->io(kStats, s.r_dims(), s.r_strides(), CUDNN_DATA_FLOAT);
  const Desc& scale = g->io(kScale, kOne4, kOne4, CUDNN_DATA_FLOAT, true);
  const Desc& one = g->io(kOne, kOne4, kOne4, CUDNN_DATA_FLOAT, true);
  // D = rowsum(dO * O), kept in FP32 in our workspace (cudnn-frontend's softmax_sum).
  const Desc& dOo = g->virt(s.qkv_dims(), {s.H * s.T * s.D, s.T * s.D, s.H * s.D, 1});
  g->pointwise(CUDNN_POINTWISE_MUL, dO, &o, nullptr, dOo, "dO * O");
  const Desc& dsum = g->virt(s.r_dims(), s.r_strides());
  g->reduce(CUDNN_REDUCE_TENSOR_ADD, dOo, dsum, "rowsum(dO * O)");
  const Desc& D = g->io(kSoftmaxSum, s.r_dims(), s.r_strides(), CUDNN_DATA_FLOAT);
  g->pointwise(CUDNN_POINTWISE_MUL, dsum, &one, nullptr, D, "D * 1");
  // P = exp(mask(S * scale - Stats)), then dV = P^T dO.
  const Desc& S = g->virt(s.s_dims(), s.s_strides());
  g->matmul(q, kt, S, "Q K^T");
  const Desc& ss = g->virt(s.s_dims(), s.s_strides());
  g->pointwise(CUDNN_POINTWISE_MUL, S, &scale, nullptr, ss, "scale");
  const Desc* sl = &g->virt(s.s_dims(), s.s_strides());
  g->pointwise(CUDNN_POINTWISE_SUB, ss, &stats, nullptr, *sl, "S - Stats");
  if (causal) sl = &causal_mask(*g, s, *sl);
  const Desc& P = g->virt(s.s_dims(), s.s_strides());
  g->pointwise(CUDNN_POINTWISE_EXP, *sl, nullptr, nullptr, P, "P = exp");
  const Desc& Pt = g->virt(s.s_dims(), s.st_strides(), io);
  g->reshape(P, Pt, "P^T");
  const Desc& dv = g->io(kDV, s.qkv_dims(), s.qkv_strides(), io);
  g->matmul(Pt, dO, dv, "P^T dO");
  // dS = P (dO V^T - D) scale, then dK = dS^T Q.
  const Desc& dP = g->virt(s.s_dims(), s.s_strides());
  g->matmul(dO, vt, dP, "dO V^T");
  const Desc& dPD = g->virt(s.s_dims(), s.s_strides());
  g->pointwise(CUDNN_POINTWISE_SUB, dP, &D, nullptr, dPD, "dP - D");
  const Desc& dSu = g->virt(s.s_dims(), s.s_strides());
  g->pointwise(CUDNN_POINTWISE_MUL, dPD, &P, nullptr, dSu, "(dP - D) P");
  const Desc& dS = g->virt(s.s_dims(), s.s_strides());
  g->pointwise(CUDNN_POINTWISE_MUL, dSu, &scale, nullptr, dS, "dS = ... scale");
  const Desc& dSt = g->virt(s.s_dims(), s.st_strides(), io);
  g->reshape(dS, dSt, "dS^T");
  const Desc& dk = g->io(kDK, s.qkv_dims(), s.qkv_strides(), io);
  g->matmul(dSt, q, dk, "dS^T Q");
  // dQ = dS K, written directly (no FP32 dQ accumulator: the deterministic variant).
  const Desc& k = g->virt(s.qkv_dims(), s.qkv_strides());
  g->reshape(kt, k, "K");
  const Desc& dq = g->io(kDQ, s.qkv_dims(), s.qkv_strides(), io);
  g->matmul(dS, k, dq, "dS K");
  return g;
}

std::string plan_text(const Plan& p) {
  return "engine " + std::to_string(p.engine) + ", workspace " + std::to_string(p.workspace) +
         " B, " + (p.nondeterministic ? "NON-deterministic" : "deterministic") +
         " per cuDNN's numerical notes, " + std::to_string(p.builder->op_count()) + " ops, " +
         "engine config " + std::to_string(p.configs_tried) + " of heuristics mode A";
}

// (B, T, NH, HS, format, causal)
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int, bool>;

}  // namespace

// The backend's cuDNN handle (on the backend's stream) and plan cache.
struct CudaBackend::CudnnState {
  cudnnHandle_t handle = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> fwd, bwd;
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

namespace {

CudaBackend::CudnnState& state_of(CudaBackend& be) {
  auto& st = be.cudnn_state();
  if (!st) {
    auto s = std::make_shared<CudaBackend::CudnnState>();
    ST_CUDNN_DO(cudnnCreate(&s->handle), "handle");
    ST_CUDNN_DO(cudnnSetStream(s->handle, be.stream()), "handle");
    st = std::move(s);
  }
  return *st;
}

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

std::string cudnn_version_text() {
  return "cuDNN " + version_string(cudnnGetVersion()) + " (built with " +
         version_string(CUDNN_VERSION) + ")";
}

std::unique_ptr<Attention> make_attention_cuda_cudnn(CudaBackend& be, const AttentionConfig& cfg) {
  return std::make_unique<CudnnAttention>(be, cfg);
}

namespace cudnn_ir {

Graph attention_graph(bool forward, int B, int T, int NH, int HS, DType fmt, bool causal) {
  const Shape4 s{B, NH, T, HS};
  auto g = forward ? forward_graph(nullptr, s, fmt, causal, "forward (ir)")
                   : backward_graph(nullptr, s, fmt, causal, "backward (ir)");
  return g->ir();
}

std::vector<Binding> attention_bindings(bool forward, int64_t C, bool causal) {
  std::vector<Binding> r;
  if (forward) {
    r = {{kQ, Buffer::Qkv, 0},     {kK, Buffer::Qkv, C},        {kV, Buffer::Qkv, 2 * C},
         {kO, Buffer::Out, 0},     {kStats, Buffer::Lse, 0},    {kScale, Buffer::Scale, 0}};
  } else {
    r = {{kQ, Buffer::Qkv, 0},       {kK, Buffer::Qkv, C},         {kV, Buffer::Qkv, 2 * C},
         {kO, Buffer::Out, 0},       {kDO, Buffer::Dout, 0},       {kStats, Buffer::Lse, 0},
         {kDQ, Buffer::Dqkv, 0},     {kDK, Buffer::Dqkv, C},       {kDV, Buffer::Dqkv, 2 * C},
         {kScale, Buffer::Scale, 0}, {kOne, Buffer::One, 0},       {kSoftmaxSum, Buffer::Workspace, 0}};
  }
  if (causal) r.push_back({kNegInf, Buffer::NegInf, 0});
  return r;
}

}  // namespace cudnn_ir

CudnnDevicelessReport cudnn_plan_deviceless(const std::string& device_json, int B, int T,
                                            int NH, int HS, DType fmt, bool causal) {
  Desc dev(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties");
  dev.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
          static_cast<int64_t>(device_json.size()), device_json.data())
      .finalize();
  const Shape4 s{B, NH, T, HS};
  CudnnDevicelessReport r;
  r.version = version_string(cudnnGetVersion());
  for (const bool fwd : {true, false}) {
    const std::string what = std::string(fwd ? "forward" : "backward") + " deviceless";
    auto g = fwd ? forward_graph(nullptr, s, fmt, causal, what)
                 : backward_graph(nullptr, s, fmt, causal, what);
    const Desc graph = g->graph();
    auto& out = fwd ? r.forward : r.backward;
    for (const Desc& cfg : heuristic_configs(graph, what, dev.get())) {
      CudnnDevicelessConfig c;
      const EngineInfo e = engine_info(cfg.get());
      c.engine = e.engine;
      c.nondeterministic = e.nondeterministic;
      PlanTry t = try_plan(nullptr, dev.get(), cfg, what);
      c.finalized = t.plan.get() != nullptr;
      c.status = c.finalized ? "finalized" : t.error;
      if (c.finalized) c.workspace = workspace_of(t.plan, what);
      out.push_back(c);
    }
  }
  return r;
}

std::string cudnn_attention_describe(const Attention& attn) { return cudnn_of(attn).describe(); }
bool cudnn_attention_nondeterministic(const Attention& attn) {
  return cudnn_of(attn).last_backward_nondeterministic();
}

#endif  // ST_WITH_CUDNN

}  // namespace st
