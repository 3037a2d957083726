// Loader for the PyTorch GPT-2 golden file (tests/data/gpt2_tiny_golden.bin), written by
// tools/golden/gen_gpt2_golden.py; the format is described in tests/data/README.md.
// Header-only; every mismatch or truncation throws st::Error naming the file.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"

namespace st::test {

constexpr int32_t kGoldenGPT2Magic = 20261121;
constexpr int32_t kGoldenGPT2Version = 1;
constexpr int kGoldenGPT2HeaderInts = 256;

struct GoldenGPT2 {
  // header
  int B = 0, T = 0;           // batch
  int V = 0, Vp = 0;          // vocabulary, padded vocabulary
  int maxT = 0, L = 0, NH = 0, C = 0;
  int n_steps = 0;            // optimizer steps recorded
  int64_t num_params = 0;     // flat parameter count, llm.c order, padded vocabulary included
  // data
  std::vector<int32_t> tokens, targets;  // B*T each
  std::vector<float> params;             // initial parameters (num_params)
  std::vector<float> logits;             // B*T*Vp, at the initial parameters
  float loss = 0.0f;                     // mean cross-entropy over B*T, initial parameters
  std::vector<float> grads;              // d loss / d params (num_params)
  std::vector<float> step_losses;        // loss before each step (n_steps); [0] == loss
  std::vector<float> step_grad_norms;    // global grad norm before clipping, each step
  std::vector<float> params_after;       // parameters after n_steps AdamW steps
};

// GPT-2 parameter count for the layout of model/gpt2.h (weights stored (out, in)).
inline int64_t golden_gpt2_num_params(int64_t Vp, int64_t maxT, int64_t L, int64_t C) {
  const int64_t per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C +
                            (4 * C * C + 4 * C) + (4 * C * C + C);
  return Vp * C + maxT * C + L * per_layer + 2 * C;
}

#ifdef ST_TEST_DATA_DIR
inline std::string golden_gpt2_path() { return std::string(ST_TEST_DATA_DIR) + "/gpt2_tiny_golden.bin"; }
#endif

inline GoldenGPT2 load_golden_gpt2(const std::string& path) {
  {
    const uint32_t one = 1;
    unsigned char b;
    std::memcpy(&b, &one, 1);
    if (b != 1) fail("load_golden_gpt2: ", path, ": the file is little-endian; this host is not");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("load_golden_gpt2: cannot open ", path);
  const std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) fail("load_golden_gpt2: read error on ", path);

  const size_t header_bytes = 4 * static_cast<size_t>(kGoldenGPT2HeaderInts);
  if (raw.size() < header_bytes)
    fail("load_golden_gpt2: ", path, ": truncated header (", raw.size(), " bytes, expected at least ",
         header_bytes, ")");
  int32_t h[kGoldenGPT2HeaderInts];
  std::memcpy(h, raw.data(), header_bytes);
  if (h[0] != kGoldenGPT2Magic)
    fail("load_golden_gpt2: ", path, ": bad magic ", h[0], " (expected ", kGoldenGPT2Magic, ")");
  if (h[1] != kGoldenGPT2Version)
    fail("load_golden_gpt2: ", path, ": unsupported version ", h[1], " (expected ",
         kGoldenGPT2Version, ")");

  GoldenGPT2 g;
  g.B = h[2], g.T = h[3], g.V = h[4], g.Vp = h[5], g.maxT = h[6], g.L = h[7], g.NH = h[8];
  g.C = h[9], g.n_steps = h[10], g.num_params = h[11];
  const char* names[] = {"B", "T", "V", "Vp", "maxT", "L", "NH", "C", "n_steps", "num_params"};
  for (int i = 2; i <= 11; ++i)
    if (h[i] <= 0 || h[i] > (1 << 24))
      fail("load_golden_gpt2: ", path, ": header field ", names[i - 2], " = ", h[i],
           " (expected 1..", 1 << 24, ")");
  if (g.Vp < g.V) fail("load_golden_gpt2: ", path, ": Vp ", g.Vp, " < V ", g.V);
  if (g.T > g.maxT) fail("load_golden_gpt2: ", path, ": T ", g.T, " > maxT ", g.maxT);
  if (g.C % g.NH != 0) fail("load_golden_gpt2: ", path, ": C ", g.C, " not divisible by NH ", g.NH);
  const int64_t expect_params = golden_gpt2_num_params(g.Vp, g.maxT, g.L, g.C);
  if (g.num_params != expect_params)
    fail("load_golden_gpt2: ", path, ": num_params ", g.num_params, " but the config implies ",
         expect_params);
  for (int i = 12; i < kGoldenGPT2HeaderInts; ++i)
    if (h[i] != 0) fail("load_golden_gpt2: ", path, ": reserved header int ", i, " = ", h[i]);

  const size_t bt = static_cast<size_t>(g.B) * static_cast<size_t>(g.T);
  const size_t np = static_cast<size_t>(g.num_params);
  const size_t ns = static_cast<size_t>(g.n_steps);
  const size_t nlogits = bt * static_cast<size_t>(g.Vp);
  const size_t expect_bytes = header_bytes + 4 * (2 * bt + 3 * np + nlogits + 1 + 2 * ns);
  if (raw.size() != expect_bytes)
    fail("load_golden_gpt2: ", path, ": ", raw.size(), " bytes, but the header implies ",
         expect_bytes, raw.size() < expect_bytes ? " (truncated)" : " (trailing data)");

  size_t off = header_bytes;
  auto take = [&](auto& vec, size_t n) {
    vec.resize(n);
    std::memcpy(vec.data(), raw.data() + off, 4 * n);
    off += 4 * n;
  };
  take(g.tokens, bt);
  take(g.targets, bt);
  take(g.params, np);
  take(g.logits, nlogits);
  std::memcpy(&g.loss, raw.data() + off, 4);
  off += 4;
  take(g.grads, np);
  take(g.step_losses, ns);
  take(g.step_grad_norms, ns);
  take(g.params_after, np);

  for (size_t i = 0; i < bt; ++i) {
    if (g.tokens[i] < 0 || g.tokens[i] >= g.V)
      fail("load_golden_gpt2: ", path, ": token[", i, "] = ", g.tokens[i], " outside [0, ", g.V, ")");
    if (g.targets[i] < 0 || g.targets[i] >= g.V)
      fail("load_golden_gpt2: ", path, ": target[", i, "] = ", g.targets[i], " outside [0, ", g.V,
           ")");
  }
  return g;
}

}  // namespace st::test
