// attn_deviation apply: one production attention backend's forward on given inputs.
//
// Reads a raw (B, T, 3C) BF16 file (C = NH * hs, GPT-2's packed c_attn output: q, k, v
// thirds, head h in columns [h*hs, (h+1)*hs) of each), runs the forward of the backend the
// trainer would run -- make_backend(device)->make_attention(cfg)->forward(out, lse, qkv, NH,
// fmt), the path model/gpt2.cpp takes -- and writes O (B, T, C) raw in the compute format
// (bf16: 2 bytes a value; fp32, fp64: native floats), and optionally lse (B, NH, T) (FP32;
// FP64 when the compute format is FP64). apps/bias_kernels.py feeds it tied-maximum inputs.
#include "apps/attn_deviation/apply.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "backends/backends.h"
#include "core/error.h"

namespace st::attn_tool {

namespace {

// The whole --qkv file (core/ and io/ have no raw-file reader: their formats have headers).
std::vector<char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("apply --qkv ", path, ": cannot open: ", std::strerror(errno));
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A scratch output read back at once (apps/bias_kernels.py's temporary folder): a plain
// write, not train/run_io.h's write_file_atomic (temporary file, fsync, rename, for run files
// that must survive a crash). A failed write is core/error.h's WriteError, as everywhere.
void write_raw(const std::string& path, const void* data, size_t bytes, const char* flag) {
  FILE* fp = std::fopen(path.c_str(), "wb");
  if (!fp) fail("apply ", flag, " ", path, ": cannot open for writing: ", std::strerror(errno));
  const bool short_write = std::fwrite(data, 1, bytes, fp) != bytes;
  if (std::fclose(fp) != 0 || short_write)
    fail_write("apply ", flag, " ", path, ": write failed: ", std::strerror(errno), " (disk full?)");
}

// The host values of t (any float storage) as doubles.
std::vector<double> host_values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::F64) {
    const double* p = t.data<double>();
    std::copy(p, p + v.size(), v.begin());
  } else {
    const float* p = t.data<float>();
    std::copy(p, p + v.size(), v.begin());
  }
  return v;
}

// Writes values in format fmt: bf16 bits, float32 or float64. Values must already be exact
// in fmt (the backend rounded them); a BF16 value that is not exact is a bug, refused.
void write_values(const std::string& path, const std::vector<double>& v, DType fmt, const char* flag) {
  if (fmt == DType::BF16) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const float f = static_cast<float>(v[i]);
      bits[i] = float_to_bf16_bits(f);
      ST_CHECK(bf16_bits_to_float(bits[i]) == f || f != f, flag, ": value ", v[i], " at ", i,
               " is not a bf16 value (the backend should have rounded it)");
    }
    write_raw(path, bits.data(), bits.size() * 2, flag);
  } else if (fmt == DType::F32) {
    std::vector<float> f(v.begin(), v.end());
    write_raw(path, f.data(), f.size() * 4, flag);
  } else {
    write_raw(path, v.data(), v.size() * 8, flag);
  }
}

}  // namespace

int apply_cmd(const ApplyArgs& a) {
  const char* who = "apply";
  for (const auto& [name, v] : {std::pair<const char*, int>{"--B", a.B}, {"--T", a.T},
                                {"--NH", a.NH}, {"--hs", a.hs}})
    if (v < 1) fail(who, ": ", name, " must be at least 1 (got ", v, ")");
  if (a.chunk < 0) fail(who, ": --chunk must be >= 0 (got ", a.chunk, ")");
  if (a.device != "cpu" && a.device != "cuda")
    fail(who, ": --device '", a.device, "' (expected cpu or cuda)");
  AttentionConfig cfg;
  try {
    cfg.kind = parse_attention_kind(a.backend);
  } catch (const Error& e) {
    fail(who, " --backend: ", e.what());
  }
  cfg.causal = a.causal;
  DType fmt;
  try {
    fmt = parse_dtype(a.compute);
  } catch (const Error& e) {
    fail(who, " --compute: ", e.what());
  }
  if (fmt != DType::BF16 && fmt != DType::F32 && fmt != DType::F64)
    fail(who, " --compute ", a.compute, ": expected bf16, fp32 or fp64 (the input is BF16)");
  if (!a.accum.empty() && a.accum != "auto") {
    try {
      cfg.accum = parse_dtype(a.accum);
    } catch (const Error& e) {
      fail(who, " --accum: ", e.what());
    }
  }
  if (a.beta_given) {
    if (cfg.kind != AttentionKind::StabilizedFlash)
      fail(who, ": --beta applies to --backend stabilized_flash only (got ", a.backend, ")");
    cfg.beta = a.beta;
  }
  if (a.block_q_given) cfg.block_q = a.block_q;
  if (a.block_k_given) cfg.block_k = a.block_k;
  if (!a.cuda_kernel.empty()) {
    try {
      cfg.cuda_kernel = parse_flash_kernel(a.cuda_kernel);
    } catch (const Error& e) {
      fail(who, " --cuda-kernel: ", e.what());
    }
  }

  const int64_t B = a.B, T = a.T, NH = a.NH, hs = a.hs, C = NH * hs;
  const size_t n_qkv = static_cast<size_t>(B * T * 3 * C);
  const std::vector<char> raw = read_all(a.qkv);
  if (raw.size() != n_qkv * 2)
    fail(who, " --qkv ", a.qkv, ": ", raw.size(), " bytes, expected ", n_qkv * 2,
         " (raw bf16 of shape (B, T, 3 NH hs) = (", B, ", ", T, ", ", 3 * C, "))");
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(raw.data());

  std::unique_ptr<Backend> be;
  try {
    be = a.device == "cpu" ? make_cpu_backend(a.threads) : make_cuda_backend();
  } catch (const Error& e) {
    fail(who, " --device ", a.device, ": ", e.what());
  }
  const bool cuda = be->device() == Device::CUDA;
  // The host copy of the input in the storage the backend reads from host tensors: FP64 for
  // the FP64 compute format, FP32 otherwise (exact for BF16 values).
  const DType host_dt = fmt == DType::F64 ? DType::F64 : DType::F32;
  Tensor qkv_h = Tensor::empty({B, T, 3 * C}, host_dt);
  for (size_t i = 0; i < n_qkv; ++i) {
    const float f = bf16_bits_to_float(bits[i]);
    if (host_dt == DType::F64)
      qkv_h.data<double>()[i] = f;
    else
      qkv_h.data<float>()[i] = f;
  }
  const DType st = be->storage_dtype(fmt);
  const DType lse_dt = cuda ? DType::F32 : host_dt;
  Tensor qkv = qkv_h, out, lse;
  if (cuda) {
    qkv = be->alloc({B, T, 3 * C}, st);
    be->copy(qkv, qkv_h);
  }
  out = cuda ? be->alloc({B, T, C}, st) : Tensor::empty({B, T, C}, st);
  lse = cuda ? be->alloc({B, NH, T}, lse_dt) : Tensor::empty({B, NH, T}, lse_dt);

  std::unique_ptr<Attention> attn;
  try {
    attn = be->make_attention(cfg);
  } catch (const Error& e) {
    fail(who, " --backend ", a.backend, " on ", a.device, ": ", e.what());
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t chunk = a.chunk > 0 ? std::min<int64_t>(a.chunk, B) : B;
  try {
    for (int64_t b0 = 0; b0 < B; b0 += chunk) {
      const int64_t b1 = std::min(B, b0 + chunk);
      attn->forward(out.slice(b0, b1), lse.slice(b0, b1), qkv.slice(b0, b1), a.NH, fmt);
    }
    be->synchronize();
  } catch (const Error& e) {
    fail(who, ": ", a.backend, " forward on ", a.device, ": ", e.what());
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Tensor out_h = out, lse_h = lse;
  if (cuda) {
    out_h = Tensor::empty({B, T, C}, DType::F32);
    be->copy(out_h, out);
    lse_h = Tensor::empty({B, NH, T}, DType::F32);
    be->copy(lse_h, lse);
  }
  write_values(a.out, host_values(out_h), fmt, "--out");
  if (!a.lse.empty()) write_values(a.lse, host_values(lse_h), lse_dt, "--lse");
  const std::string impl = attn->implementation();
  std::fprintf(stderr,
               "attn_deviation apply: %s on %s%s%s, B %lld T %lld NH %lld hs %lld, compute %s%s, "
               "%.3f s; wrote %s\n",
               attn->name().c_str(), a.device.c_str(), impl.empty() ? "" : " path ",
               impl.c_str(), static_cast<long long>(B), static_cast<long long>(T),
               static_cast<long long>(NH), static_cast<long long>(hs), dtype_name(fmt),
               cfg.causal ? ", causal" : ", non-causal", secs, a.out.c_str());
  return 0;
}

}  // namespace st::attn_tool
