// The forward and backward operation graphs of attention.backend cudnn (cuda/attention_cudnn.cu)
// for one shape, built with cuDNN 9's graph API (cudnn_graph.h, the "backend" API that ships
// with cuDNN; no cudnn-frontend), and the same graphs as plain data for the tests
// (cuda/cudnn_graph_ir.h).
//
// The graphs have the form cuDNN's fused flash-attention engines recognise on cuDNN 9.x
// before the single SDPA operation could carry a causal mask (9.21): matmuls, pointwise ops,
// reductions and, in the backward, reshapes (transposes). They are exactly those
// cudnn-frontend emits for the same request (training, causal top-left, softmax stats kept,
// no dropout, no bias; docs/numerics.md, "cuDNN", lists them), written here against the C API:
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
// built here (what cuDNN's engine then says of itself: cuda/cudnn_plan.cu).
//
// Layouts: q, k, v are read in place from the packed (B, T, 3C) qkv (strides (3CT, HS, 3C,
// 1) in (B, NH, T, HS)); out (B, T, C); lse (B, NH, T) FP32 is cuDNN's Stats (B, NH, T, 1);
// dq, dk, dv are written in place into dqkv. K (and V in the backward) enter the graphs
// transposed by strides, as cuDNN expects.
#if defined(ST_WITH_CUDNN)
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cudnn_graph_ir.h"
#include "cuda/cudnn_internal.h"

namespace st {
namespace cudnn_impl {

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::F32: return CUDNN_DATA_FLOAT;
    default: fail("cuDNN attention: no cuDNN type for ", dtype_name(t));
  }
}

void GraphBuilder::matmul(const Desc& a, const Desc& b, const Desc& c, const char* name) {
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

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b,
                             const Desc* t, const Desc& y, const char* name,
                             cudnnDataType_t prec, int64_t axis) {
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

void GraphBuilder::reduce(cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y,
                          const char* name) {
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

void GraphBuilder::reshape(const Desc& x, const Desc& y, const char* name) {
  Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what_ + " " + name);
  op.desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x)
      .desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y)
      .finalize();
  ops_.push_back(std::move(op));
  record(cudnn_ir::Op::Reshape, "RESHAPE", -1, &x, nullptr, nullptr, y, name);
}


Desc GraphBuilder::graph() {
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Desc& d : ops_) ops.push_back(d.get());
  Desc g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what_ + " operation graph");
  if (handle_) g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
  g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops.size()), ops.data())
      .finalize();
  return g;
}

const Desc& GraphBuilder::tensor(int64_t uid, std::vector<int64_t> dims,
                                 std::vector<int64_t> strides, cudnnDataType_t t,
                                 bool is_virtual, bool by_value) {
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

int64_t GraphBuilder::uid(const Desc* d) const {
  if (!d) return -1;
  const auto it = uid_of_.find(d);
  ST_CHECK(it != uid_of_.end(), "cuDNN graph ", what_, ": an operand is not a tensor of it");
  return it->second;
}

void GraphBuilder::record(cudnn_ir::Op op, const char* mode, int64_t axis, const Desc* x,
                          const Desc* b, const Desc* t, const Desc& y, const char* name) {
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

const char* GraphBuilder::pointwise_name(cudnnPointwiseMode_t m) {
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

namespace {

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

}  // namespace

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

}  // namespace cudnn_impl

namespace cudnn_ir {

using namespace cudnn_impl;

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
}  // namespace st

#endif  // ST_WITH_CUDNN
