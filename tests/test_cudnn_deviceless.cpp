// cuDNN's fused attention without a GPU (label cpu; built only with cuDNN 9): the forward and
// backward graphs cuda/cudnn_graph.cu hands cuDNN, planned devicelessly for an H100
// (cuDNN >= 9.8 plans for a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR; tests/data/
// cudnn_deviceprop_h100_sxm.json: the cudaGetDeviceProperties values of an H100 SXM5, from
// which cuDNN's heuristics read the SM version 9.0, the 132 SMs and the shared memory).
//
// What it shows: cuDNN's heuristics recognise both graphs and propose engines that pass
// cuDNN's own support checks, every proposed engine's kernel is generated and compiled, and
// the backward engines are deterministic by cuDNN's numerical notes. Without a driver (this
// machine: the toolkit's stub libcuda, CMake points LD_LIBRARY_PATH at it) finalizing stops
// where the compiled kernel would be loaded into the GPU, so that is the one failure allowed.
// What it cannot show: that the kernels run, or their numbers (tests/test_gpu_cudnn.cpp,
// GpuCudnn.*, on a GPU). Nor that the graph computes attention: cuDNN accepts well-formed
// graphs that compute something else too (tried: the backward without its P^T reshape, so
// dV = P dO, passes here). It fails where cuDNN has no engine (the FP32 test below).
//
// What the graphs compute is checked apart from cuDNN (CudnnGraph.*): an FP64 interpreter of
// the recorded graphs (cuda/cudnn_graph_ir.h: the same tensors, strides and operations the
// descriptors were built from, and the variant-pack bindings the Attention class uses) runs
// them on packed (B, T, 3C) buffers and must give the CPU's FP64 attention: O, lse, dQ, dK,
// dV to 1e-12. The interpreter reads every non-virtual tensor through its declared strides
// and offsets, so a wrong stride, offset, transpose, mask or operand order shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <fstream>
#include <sstream>
#include <string>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/rng.h"
#include "cuda/attention_cuda.h"
#include "cuda/cudnn_graph_ir.h"

namespace st {
namespace {

std::string h100() {
  std::ifstream f(std::string(ST_TEST_DATA_DIR) + "/cudnn_deviceprop_h100_sxm.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Finalized, or stopped only at loading the compiled kernel (no GPU here).
bool compiled(const CudnnDevicelessConfig& c) {
  return c.finalized || c.status.find("cuLibraryLoadData") != std::string::npos;
}

TEST(CudnnDeviceless, BothGraphsPassCudnnsChecksForAnH100) {
  const std::string dev = h100();
  ASSERT_FALSE(dev.empty());
  struct Case {
    int B, T, NH, HS;
    DType fmt;
    bool causal;
  };
  // The GPU tests' shapes (T not a multiple of 64) and GPT-2 small's (B 16, T 1024).
  for (const Case& c : {Case{2, 200, 4, 64, DType::BF16, true}, Case{1, 257, 2, 128, DType::F16, true},
                        Case{16, 1024, 12, 64, DType::BF16, true}, Case{1, 130, 2, 128, DType::BF16, false}}) {
    const CudnnDevicelessReport r = cudnn_plan_deviceless(dev, c.B, c.T, c.NH, c.HS, c.fmt, c.causal);
    char name[128];
    std::snprintf(name, sizeof name, "B=%d T=%d NH=%d HS=%d %s %s", c.B, c.T, c.NH, c.HS,
                  dtype_name(c.fmt), c.causal ? "causal" : "noncausal");
    SCOPED_TRACE(name);
    for (const auto* list : {&r.forward, &r.backward}) {
      const char* pass = list == &r.forward ? "forward" : "backward";
      EXPECT_FALSE(list->empty())
          << pass << ": cuDNN " << r.version << " proposes no engine (its support checks load "
          << "libcuda: a driver, or the toolkit's stub through LD_LIBRARY_PATH, which ctest sets)";
      for (const CudnnDevicelessConfig& e : *list) {
        std::printf("cudnn deviceless %s %s: engine %lld, %s, %s\n", name, pass,
                    static_cast<long long>(e.engine),
                    e.nondeterministic ? "NON-deterministic" : "deterministic", e.status.c_str());
        EXPECT_TRUE(compiled(e)) << pass << " engine " << e.engine << ": " << e.status;
        if (list == &r.backward) {
          EXPECT_FALSE(e.nondeterministic) << "backward engine " << e.engine;
        }
      }
    }
  }
}

// The check can fail: cuDNN has no backward engine for FP32 inputs (its fused attention takes
// 16-bit ones), and the same planning then proposes none.
TEST(CudnnDeviceless, NoBackwardEngineForFp32Inputs) {
  const CudnnDevicelessReport r = cudnn_plan_deviceless(h100(), 2, 200, 4, 64, DType::F32, true);
  EXPECT_TRUE(r.backward.empty()) << r.backward.size() << " backward engines for FP32";
}

// ---- an FP64 interpreter of the recorded graphs ----------------------------------------

// One call's buffers in FP64, laid out as the GPU's (packed qkv and dqkv, (B, T, C) out and
// dout, (B, NH, T) lse, the workspace's FP32 row vector), and the by-value scalars.
struct Buffers {
  std::vector<double> qkv, out, lse, dout, dqkv, workspace;
  double scale = 0, one = 1, neg_inf = -std::numeric_limits<double>::infinity();
};

class Interpreter {
 public:
  Interpreter(const cudnn_ir::Graph& g, const std::vector<cudnn_ir::Binding>& binds, Buffers& b) {
    for (const cudnn_ir::Tensor& t : g.tensors) tensors_[t.uid] = t;
    for (const cudnn_ir::Binding& x : binds) {
      double* base = nullptr;
      switch (x.buffer) {
        case cudnn_ir::Buffer::Qkv: base = b.qkv.data(); break;
        case cudnn_ir::Buffer::Out: base = b.out.data(); break;
        case cudnn_ir::Buffer::Lse: base = b.lse.data(); break;
        case cudnn_ir::Buffer::Dout: base = b.dout.data(); break;
        case cudnn_ir::Buffer::Dqkv: base = b.dqkv.data(); break;
        case cudnn_ir::Buffer::Workspace: base = b.workspace.data(); break;
        case cudnn_ir::Buffer::Scale: base = &b.scale; break;
        case cudnn_ir::Buffer::One: base = &b.one; break;
        case cudnn_ir::Buffer::NegInf: base = &b.neg_inf; break;
      }
      bound_[x.uid] = base + x.offset;
    }
    for (const cudnn_ir::Tensor& t : g.tensors)
      if (!t.is_virtual && !bound_.count(t.uid))
        ADD_FAILURE() << "non-virtual tensor " << t.uid << " has no binding";
    for (const cudnn_ir::Node& n : g.nodes) run(n);
  }

 private:
  using Idx = std::vector<int64_t>;
  static int64_t numel(const Idx& d) {
    int64_t n = 1;
    for (int64_t x : d) n *= x;
    return n;
  }
  static Idx unflat(int64_t i, const Idx& d) {
    Idx r(d.size());
    for (size_t a = d.size(); a-- > 0;) {
      r[a] = i % d[a];
      i /= d[a];
    }
    return r;
  }
  static int64_t flat(const Idx& i, const Idx& d) {
    int64_t r = 0;
    for (size_t a = 0; a < d.size(); ++a) r = r * d[a] + i[a];
    return r;
  }
  static int64_t addr(const Idx& i, const Idx& strides) {
    int64_t r = 0;
    for (size_t a = 0; a < i.size(); ++a) r += i[a] * strides[a];
    return r;
  }
  const cudnn_ir::Tensor& t(int64_t uid) {
    auto it = tensors_.find(uid);
    if (it == tensors_.end()) throw std::runtime_error("unknown tensor " + std::to_string(uid));
    return it->second;
  }
  // Element i of tensor uid (broadcast over its size-1 axes); virtual tensors are dense.
  double get(int64_t uid, Idx i) {
    const cudnn_ir::Tensor& x = t(uid);
    for (size_t a = 0; a < i.size(); ++a)
      if (x.dims[a] == 1) i[a] = 0;
    if (x.is_virtual) return virt_.at(uid)[flat(i, x.dims)];
    return bound_.at(uid)[addr(i, x.strides)];
  }
  void set(int64_t uid, const Idx& i, double v) {
    const cudnn_ir::Tensor& x = t(uid);
    if (x.is_virtual) {
      auto& buf = virt_[uid];
      buf.resize(numel(x.dims));
      buf[flat(i, x.dims)] = v;
    } else {
      bound_.at(uid)[addr(i, x.strides)] = v;
    }
  }

  void run(const cudnn_ir::Node& n) {
    const cudnn_ir::Tensor& y = t(n.y);
    const int64_t ny = numel(y.dims);
    if (n.op == cudnn_ir::Op::Matmul) {
      const int64_t K = t(n.x).dims[3];
      ASSERT_EQ(t(n.b).dims[2], K) << n.name;
      for (int64_t f = 0; f < ny; ++f) {
        const Idx i = unflat(f, y.dims);
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += get(n.x, {i[0], i[1], i[2], k}) * get(n.b, {i[0], i[1], k, i[3]});
        set(n.y, i, s);
      }
    } else if (n.op == cudnn_ir::Op::Pointwise) {
      for (int64_t f = 0; f < ny; ++f) {
        const Idx i = unflat(f, y.dims);
        const double x = n.mode == "GEN_INDEX" ? 0 : get(n.x, i);
        double v = 0;
        if (n.mode == "GEN_INDEX") v = static_cast<double>(i[n.axis]);
        else if (n.mode == "EXP") v = std::exp(x);
        else if (n.mode == "LOG") v = std::log(x);
        else if (n.mode == "BINARY_SELECT") v = get(n.t, i) != 0 ? x : get(n.b, i);
        else {
          const double b = get(n.b, i);
          if (n.mode == "MUL") v = x * b;
          else if (n.mode == "ADD") v = x + b;
          else if (n.mode == "SUB") v = x - b;
          else if (n.mode == "DIV") v = x / b;
          else if (n.mode == "CMP_GE") v = x >= b ? 1 : 0;
          else FAIL() << "pointwise mode " << n.mode << " not interpreted (" << n.name << ")";
        }
        set(n.y, i, v);
      }
    } else if (n.op == cudnn_ir::Op::Reduction) {
      const cudnn_ir::Tensor& x = t(n.x);
      const bool mx = n.mode == "MAX";
      std::vector<double> acc(ny, mx ? -std::numeric_limits<double>::infinity() : 0.0);
      for (int64_t f = 0; f < numel(x.dims); ++f) {
        Idx i = unflat(f, x.dims);
        const double v = get(n.x, i);
        for (size_t a = 0; a < i.size(); ++a)
          if (y.dims[a] == 1) i[a] = 0;
        double& r = acc[flat(i, y.dims)];
        r = mx ? std::max(r, v) : r + v;
      }
      for (int64_t f = 0; f < ny; ++f) set(n.y, unflat(f, y.dims), acc[f]);
    } else {  // Reshape: y is x's memory through y's strides
      const cudnn_ir::Tensor& x = t(n.x);
      std::map<int64_t, Idx> at;  // x's address -> its index
      for (int64_t f = 0; f < numel(x.dims); ++f) {
        const Idx i = unflat(f, x.dims);
        at[addr(i, x.strides)] = i;
      }
      for (int64_t f = 0; f < ny; ++f) {
        const Idx i = unflat(f, y.dims);
        auto it = at.find(addr(i, y.strides));
        ASSERT_TRUE(it != at.end()) << n.name << ": element of y outside x";
        set(n.y, i, get(n.x, it->second));
      }
    }
  }

  std::map<int64_t, cudnn_ir::Tensor> tensors_;
  std::map<int64_t, double*> bound_;
  std::map<int64_t, std::vector<double>> virt_;
};

double max_rel_diff(const std::vector<double>& a, const double* ref, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; ++i) {
    d = std::max(d, std::fabs(a[i] - ref[i]));
    r = std::max(r, std::fabs(ref[i]));
  }
  return std::isfinite(d) ? d / std::max(r, 1e-300) : INFINITY;
}

TEST(CudnnGraph, ForwardAndBackwardGraphsComputeAttention) {
  auto cpu = make_cpu_backend();
  for (const bool causal : {true, false}) {
    const int B = 2, T = 37, NH = 2, HS = 64, C = NH * HS;
    Buffers b;
    b.qkv.resize(static_cast<size_t>(B) * T * 3 * C);
    b.dout.resize(static_cast<size_t>(B) * T * C);
    Rng rng(77 + causal);
    for (double& x : b.qkv) x = rng.normal();
    for (double& x : b.dout) x = rng.normal();
    b.out.assign(b.dout.size(), NAN);
    b.lse.assign(static_cast<size_t>(B) * NH * T, NAN);
    b.dqkv.assign(b.qkv.size(), NAN);
    b.workspace.assign(b.lse.size(), NAN);
    b.scale = 1.0 / std::sqrt(static_cast<double>(HS));  // 1/8: exact in FP32 too
    Interpreter(cudnn_ir::attention_graph(true, B, T, NH, HS, DType::BF16, causal),
                cudnn_ir::attention_bindings(true, C, causal), b);
    Interpreter(cudnn_ir::attention_graph(false, B, T, NH, HS, DType::BF16, causal),
                cudnn_ir::attention_bindings(false, C, causal), b);
    // The CPU's FP64 attention on the same inputs.
    AttentionConfig cfg;
    cfg.causal = causal;
    auto ref = cpu->make_attention(cfg);
    Tensor qkv = Tensor::empty({B, T, 3 * C}, DType::F64), dout = Tensor::empty({B, T, C}, DType::F64);
    std::copy(b.qkv.begin(), b.qkv.end(), qkv.data<double>());
    std::copy(b.dout.begin(), b.dout.end(), dout.data<double>());
    Tensor out = Tensor::empty({B, T, C}, DType::F64), lse = Tensor::empty({B, NH, T}, DType::F64),
           dqkv = Tensor::empty({B, T, 3 * C}, DType::F64);
    ref->forward(out, lse, qkv, NH, DType::F64);
    ref->backward(dqkv, dout, qkv, out, lse, NH, DType::F64);
    const double e_o = max_rel_diff(b.out, out.data<double>(), b.out.size());
    const double e_l = max_rel_diff(b.lse, lse.data<double>(), b.lse.size());
    double e_g[3];
    for (int part = 0; part < 3; ++part) {
      std::vector<double> mine, theirs;
      for (size_t i = 0; i < b.dqkv.size(); ++i)
        if (static_cast<int>((i % (3 * C)) / C) == part) {
          mine.push_back(b.dqkv[i]);
          theirs.push_back(dqkv.data<double>()[i]);
        }
      e_g[part] = max_rel_diff(mine, theirs.data(), mine.size());
    }
    std::printf("cudnn graph (FP64 interpreter) vs CPU FP64 attention, %s: O %.1e lse %.1e dQ %.1e "
                "dK %.1e dV %.1e (max |diff| / max |ref|)\n",
                causal ? "causal" : "noncausal", e_o, e_l, e_g[0], e_g[1], e_g[2]);
    EXPECT_LT(e_o, 1e-12) << "O";
    EXPECT_LT(e_l, 1e-12) << "lse";
    EXPECT_LT(e_g[0], 1e-12) << "dQ";
    EXPECT_LT(e_g[1], 1e-12) << "dK";
    EXPECT_LT(e_g[2], 1e-12) << "dV";
  }
}

}  // namespace
}  // namespace st
