// What cuda/attention_cudnn.cu hands cuDNN, as plain data: the tensors and operations of the
// forward and backward graphs (recorded while their backend descriptors are built, so it
// is the same graph, not a copy) and the variant-pack bindings (which buffer, at which
// element offset, each non-virtual tensor lives in). Tests interpret it independently
// (tests/test_cudnn_deviceless.cpp: an FP64 interpreter of the graph against the CPU's FP64
// attention), which checks what the graph computes without a GPU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace st::cudnn_ir {

struct Tensor {
  int64_t uid = 0;
  std::vector<int64_t> dims, strides;  // cuDNN's (batch, head, row, column) order
  std::string type;                    // "bf16", "fp16", "fp32", "int32", "bool"
  bool is_virtual = false, by_value = false;
};

enum class Op { Matmul, Pointwise, Reduction, Reshape };

// y = op(x[, b][, t]). Pointwise modes: MUL, ADD, SUB, DIV, EXP, LOG, GEN_INDEX (along
// axis), CMP_GE (1 where x >= b), BINARY_SELECT (t ? x : b). Reductions: MAX, ADD over the
// axes where y has size 1. Matmul: y[.., m, n] = sum_k x[.., m, k] b[.., k, n]. Reshape: y is
// x's memory seen through y's dims and strides (here, transposes).
struct Node {
  Op op = Op::Pointwise;
  std::string mode;
  int64_t axis = -1;
  int64_t x = -1, b = -1, t = -1, y = -1;  // tensor uids (-1: absent)
  std::string name;
};

struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Node> nodes;  // in the order cuDNN receives them (a valid evaluation order)
};

// The buffers of one Attention call, and where each non-virtual tensor of a graph lives.
enum class Buffer { Qkv, Out, Lse, Dout, Dqkv, Workspace, Scale, One, NegInf };
struct Binding {
  int64_t uid = 0;
  Buffer buffer = Buffer::Qkv;
  int64_t offset = 0;  // elements of the buffer's type
};

// The graph of the forward (or backward) for one shape; needs the cuDNN library (its
// descriptors are built and finalized) but no GPU. Throws in a build without cuDNN.
Graph attention_graph(bool forward, int B, int T, int NH, int HS, DType fmt, bool causal);
// The variant pack of forward (or backward) for n_embd C, as the Attention class binds it.
std::vector<Binding> attention_bindings(bool forward, int64_t C, bool causal);

}  // namespace st::cudnn_ir
