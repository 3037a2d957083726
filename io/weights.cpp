#include "io/weights.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "io/checkpoint.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c and safetensors files are little-endian; this code reads them in place"
#endif

namespace fs = std::filesystem;

namespace st {
namespace {

constexpr int32_t kLlmcMagic = 20240326;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, ": cannot read: ", std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail(path, ": read error");
  return ss.str();
}

// Atomic write: temporary file in the same folder, then rename.
void write_atomic(const std::string& path, const std::string& head, const void* body, size_t n) {
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot write '", tmp, "': ", std::strerror(errno));
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size() &&
            (n == 0 || std::fwrite(body, 1, n, f) == n);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("cannot write '", path, "': ", std::strerror(err));
  }
}

// Bounds (model/gpt2.h) checked before anything is sized from the shape: num_parameters()
// then cannot overflow.
void check_config(const GPT2Config& c, const std::string& path) {
  check_model_shape(c, path + ": bad model shape");
}

// One tensor of the safetensors file: its HF name, shape, and where it sits in our flat
// parameter array (a slice of a stacked parameter, maybe transposed).
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;  // as stored in the file
  int64_t offset;              // into the flat parameter array
  int64_t rows, cols;          // our (out, in) layout when transposed; rows=n, cols=1 otherwise
  bool transposed;
};

std::vector<HfTensor> hf_tensors(const GPT2Config& c) {
  const auto shapes = param_shapes(c);
  std::array<int64_t, kNumParams> off{};
  int64_t o = 0;
  for (int i = 0; i < kNumParams; ++i) off[i] = o, o += shape_numel(shapes[i]);
  const int64_t C = c.n_embd, V = c.vocab_size, T = c.max_seq_len;
  std::vector<HfTensor> v;
  auto plain = [&](std::string name, int64_t offset, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    v.push_back({std::move(name), std::move(shape), offset, n, 1, false});
  };
  // Conv1D weight: ours (out, in) at offset -> file (in, out).
  auto conv = [&](std::string name, int64_t offset, int64_t out, int64_t in) {
    v.push_back({std::move(name), {in, out}, offset, out, in, true});
  };
  plain("transformer.wte.weight", off[kWte], {V, C});
  plain("transformer.wpe.weight", off[kWpe], {T, C});
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    plain(h + "ln_1.weight", off[kLn1w] + l * C, {C});
    plain(h + "ln_1.bias", off[kLn1b] + l * C, {C});
    conv(h + "attn.c_attn.weight", off[kQkvw] + l * 3 * C * C, 3 * C, C);
    plain(h + "attn.c_attn.bias", off[kQkvb] + l * 3 * C, {3 * C});
    conv(h + "attn.c_proj.weight", off[kAttprojw] + l * C * C, C, C);
    plain(h + "attn.c_proj.bias", off[kAttprojb] + l * C, {C});
    plain(h + "ln_2.weight", off[kLn2w] + l * C, {C});
    plain(h + "ln_2.bias", off[kLn2b] + l * C, {C});
    conv(h + "mlp.c_fc.weight", off[kFcw] + l * 4 * C * C, 4 * C, C);
    plain(h + "mlp.c_fc.bias", off[kFcb] + l * 4 * C, {4 * C});
    conv(h + "mlp.c_proj.weight", off[kFcprojw] + l * 4 * C * C, C, 4 * C);
    plain(h + "mlp.c_proj.bias", off[kFcprojb] + l * C, {C});
  }
  plain("transformer.ln_f.weight", off[kLnfw], {C});
  plain("transformer.ln_f.bias", off[kLnfb], {C});
  return v;
}

float to_float(const char* p, const std::string& dtype) {
  if (dtype == "F32") {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (dtype == "BF16" || dtype == "F16") {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return dtype == "BF16" ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
  }
  double d;  // F64
  std::memcpy(&d, p, 8);
  return static_cast<float>(d);
}

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "F64") return 8;
  return 0;
}

// Bytes per element of every dtype of the safetensors spec (0: unknown).
size_t any_dtype_bytes(const std::string& d) {
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E5M2" || d == "F8_E4M3") return 1;
  if (d == "I16" || d == "U16" || d == "F16" || d == "BF16") return 2;
  if (d == "I32" || d == "U32" || d == "F32") return 4;
  if (d == "I64" || d == "U64" || d == "F64") return 8;
  return 0;
}

std::string clip(const std::string& s) { return s.size() <= 40 ? s : s.substr(0, 40) + "..."; }

// The whole layout of a safetensors file, before any value is read: every entry but
// __metadata__ is a tensor {dtype (known), shape (non-negative integers), data_offsets
// [begin, end)} with begin <= end <= the data section and end - begin exactly
// numel * dtype size; sorted by offset the tensors neither overlap nor leave a hole, and
// they cover the data section exactly (the spec allows no holes; a wrong header length
// shows up here). __metadata__, when present, maps strings to strings.
void check_safetensors_layout(const nlohmann::json& header, uint64_t data_size,
                              const std::string& path) {
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string name = clip(it.key());
    const nlohmann::json& e = it.value();
    if (it.key() == "__metadata__") {
      if (!e.is_object()) fail(path, ": safetensors __metadata__ is not a JSON object");
      for (auto m = e.begin(); m != e.end(); ++m)
        if (!m.value().is_string())
          fail(path, ": safetensors __metadata__ '", clip(m.key()),
               "' is not a string (the format maps strings to strings)");
      continue;
    }
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets") || !e["dtype"].is_string() || !e["shape"].is_array() ||
        !e["data_offsets"].is_array())
      fail(path, ": safetensors tensor '", name,
           "' is not an object with dtype (string), shape and data_offsets (arrays)");
    const std::string dtype = e["dtype"].get<std::string>();
    const uint64_t eb = any_dtype_bytes(dtype);
    if (!eb) fail(path, ": tensor '", name, "' has unknown dtype '", clip(dtype), "'");
    // numel * eb in checked arithmetic: bounded by the data section or refused.
    unsigned __int128 bytes = eb;
    for (const nlohmann::json& d : e["shape"]) {
      if (!d.is_number_unsigned())
        fail(path, ": tensor '", name, "' has shape ", clip(e["shape"].dump()),
             ", expected non-negative integers");
      bytes *= d.get<uint64_t>();
      if (bytes > data_size) bytes = data_size + 1;  // too big already; no overflow
    }
    const nlohmann::json& off = e["data_offsets"];
    if (off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(path, ": tensor '", name, "' has data_offsets ", clip(off.dump()),
           ", expected [begin, end] (non-negative integers)");
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_size)
      fail(path, ": tensor '", name, "' has data_offsets [", b, ", ", en,
           "), expected begin <= end <= ", data_size,
           " (the data section's size; truncated file?)");
    if (bytes != en - b)
      fail(path, ": tensor '", name, "' has data_offsets [", b, ", ", en, ") holding ", en - b,
           " bytes, but shape ", clip(e["shape"].dump()), " of ", dtype, " needs ",
           bytes > data_size ? std::string("more than the file holds")
                             : std::to_string(uint64_t(bytes)));
    spans.push_back({b, en, name});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t at = 0;
  const Span* prev = nullptr;
  for (const Span& t : spans) {
    if (t.begin < at)
      fail(path, ": tensor '", t.name, "' data_offsets [", t.begin, ", ", t.end,
           ") overlap tensor '", prev->name, "' [", prev->begin, ", ", prev->end, ")");
    if (t.begin > at)
      fail(path, ": bytes [", at, ", ", t.begin, ") of the data section belong to no tensor "
           "(the format allows no holes: damaged file or wrong header length)");
    at = t.end;
    prev = &t;
  }
  if (at != data_size)
    fail(path, ": bytes [", at, ", ", data_size, ") of the data section belong to no tensor "
         "(the format allows no holes: damaged file or wrong header length)");
}

// An integer metadata value: the whole string a decimal integer in [lo, hi].
int metadata_int(const nlohmann::json& meta, const char* key, int lo, int hi,
                 const std::string& path) {
  const std::string v = meta.at(key).get<std::string>();
  int64_t x = 0;
  bool ok = !v.empty() && v.size() <= 10;
  for (char c : v) ok = ok && c >= '0' && c <= '9';
  if (ok) {
    for (char c : v) x = x * 10 + (c - '0');
    ok = x >= lo && x <= hi;
  }
  if (!ok)
    fail(path, ": safetensors __metadata__ ", key, " = '", clip(v), "', expected an integer in ",
         lo, "..", hi);
  return static_cast<int>(x);
}

}  // namespace

ModelWeights load_safetensors_unchecked(const std::string& path, int n_head);

WeightFormat detect_weight_format(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return WeightFormat::Unknown;
  unsigned char b[16] = {};
  const size_t n = std::fread(b, 1, sizeof b, f);
  std::fclose(f);
  int32_t magic = 0;
  if (n >= 4) std::memcpy(&magic, b, 4);
  if (n >= 4 && magic == kLlmcMagic) return WeightFormat::Llmc;
  if (n >= 8 && std::memcmp(b, kCheckpointMagic, 8) == 0) return WeightFormat::Checkpoint;
  if (n >= 9 && b[8] == '{') return WeightFormat::Safetensors;
  return WeightFormat::Unknown;
}

ModelWeights load_llmc(const std::string& path) {
  const std::string s = slurp(path);
  if (s.size() < 1024)
    fail(path, ": truncated llm.c model file (", s.size(), " bytes, less than the 1024-byte header)");
  int32_t h[256];
  std::memcpy(h, s.data(), sizeof h);
  if (h[0] != kLlmcMagic)
    fail(path, ": not an llm.c model file (magic ", h[0], ", expected ", kLlmcMagic, ")");
  if (h[1] != 3 && h[1] != 5)
    fail(path, ": llm.c model version ", h[1], " is not supported (3: FP32, 5: BF16)");
  ModelWeights w;
  GPT2Config& c = w.config;
  c.max_seq_len = h[2];
  c.vocab_size = h[3];
  c.n_layer = h[4];
  c.n_head = h[5];
  c.n_embd = h[6];
  c.padded_vocab_size = h[7];
  if (c.padded_vocab_size == 0) c.padded_vocab_size = c.vocab_size;  // files older than Vp
  check_model_shape(c, path + ": bad llm.c header (maxT " + std::to_string(h[2]) + ", V " +
                           std::to_string(h[3]) + ", L " + std::to_string(h[4]) + ", NH " +
                           std::to_string(h[5]) + ", C " + std::to_string(h[6]) + ", Vp " +
                           std::to_string(h[7]) + ")");
  const int64_t n = num_parameters(c);  // < 2^46 within the bounds: no overflow below
  const size_t elem = h[1] == 3 ? 4 : 2;
  const size_t want = 1024 + static_cast<size_t>(n) * elem;
  if (s.size() != want)
    fail(path, ": llm.c model size mismatch: the header describes ", n, " parameters (",
         want, " bytes in version ", h[1], "), the file has ", s.size(), " bytes (",
         s.size() < want ? "truncated" : "trailing data", ")");
  w.params.resize(static_cast<size_t>(n));
  if (elem == 4) {
    std::memcpy(w.params.data(), s.data() + 1024, static_cast<size_t>(n) * 4);
  } else {
    std::vector<uint16_t> b(static_cast<size_t>(n));
    std::memcpy(b.data(), s.data() + 1024, b.size() * 2);
    convert_bf16_to_f32(b.data(), w.params.data(), b.size());
  }
  return w;
}

void save_llmc(const std::string& path, const ModelWeights& w, bool bf16) {
  GPT2Config c = w.config;
  c.padded_vocab_size = c.vp();
  ST_CHECK(static_cast<int64_t>(w.params.size()) == num_parameters(c), "save_llmc: ",
           w.params.size(), " values for a model of ", num_parameters(c));
  int32_t h[256] = {};
  h[0] = kLlmcMagic;
  h[1] = bf16 ? 5 : 3;
  h[2] = c.max_seq_len;
  h[3] = c.vocab_size;
  h[4] = c.n_layer;
  h[5] = c.n_head;
  h[6] = c.n_embd;
  h[7] = c.padded_vocab_size;
  const std::string head(reinterpret_cast<const char*>(h), sizeof h);
  if (!bf16) {
    write_atomic(path, head, w.params.data(), w.params.size() * 4);
  } else {
    std::vector<uint16_t> b(w.params.size());
    convert_f32_to_bf16(w.params.data(), b.data(), b.size());
    write_atomic(path, head, b.data(), b.size() * 2);
  }
}

std::string hf_config_json(const GPT2Config& c) {
  nlohmann::ordered_json j = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.max_seq_len},
      {"n_ctx", c.max_seq_len},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},  // tanh approximation, as layers/activation_cpu
      {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"bos_token_id", 50256},
      {"eos_token_id", 50256},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  return j.dump(2) + "\n";
}

void save_safetensors(const std::string& path, const ModelWeights& w, const std::string& dtype) {
  ST_CHECK(dtype == "F32" || dtype == "BF16", "safetensors dtype must be F32 or BF16, got ", dtype);
  GPT2Config c = w.config;
  c.padded_vocab_size = c.vp();
  ST_CHECK(static_cast<int64_t>(w.params.size()) == num_parameters(c), "save_safetensors: ",
           w.params.size(), " values for a model of ", num_parameters(c));
  const size_t eb = dtype_bytes(dtype);
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"},
                            {"producer", "stabletrain"},
                            {"n_layer", std::to_string(c.n_layer)},
                            {"n_head", std::to_string(c.n_head)},
                            {"n_embd", std::to_string(c.n_embd)},
                            {"n_positions", std::to_string(c.max_seq_len)},
                            {"vocab_size", std::to_string(c.vocab_size)}};
  std::vector<float> data;
  data.reserve(w.params.size());
  for (const HfTensor& t : hf_tensors(c)) {
    const size_t begin = data.size() * eb;
    const float* src = w.params.data() + t.offset;
    if (!t.transposed) {
      data.insert(data.end(), src, src + t.rows);
    } else {  // ours (rows=out, cols=in) -> file (in, out)
      for (int64_t i = 0; i < t.cols; ++i)
        for (int64_t o = 0; o < t.rows; ++o) data.push_back(src[o * t.cols + i]);
    }
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape},
                      {"data_offsets", {begin, data.size() * eb}}};
  }
  std::string js = header.dump();
  js.append((8 - js.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  const uint64_t n = js.size();
  std::memcpy(head.data(), &n, 8);
  head += js;
  if (dtype == "F32") {
    write_atomic(path, head, data.data(), data.size() * 4);
  } else {
    std::vector<uint16_t> b(data.size());
    convert_f32_to_bf16(data.data(), b.data(), b.size());
    write_atomic(path, head, b.data(), b.size() * 2);
  }
}

ModelWeights load_safetensors(const std::string& path, int n_head) {
  try {
    return load_safetensors_unchecked(path, n_head);
  } catch (const nlohmann::json::exception& e) {  // a header entry of the wrong JSON type
    fail(path, ": malformed safetensors header: ", e.what());
  }
}

ModelWeights load_safetensors_unchecked(const std::string& path, int n_head) {
  const std::string s = slurp(path);
  if (s.size() < 8) fail(path, ": truncated safetensors file (", s.size(), " bytes)");
  uint64_t hn;
  std::memcpy(&hn, s.data(), 8);
  if (hn > s.size() - 8) fail(path, ": truncated safetensors file (header of ", hn, " bytes, file of ", s.size(), ")");
  const nlohmann::json header = nlohmann::json::parse(s.begin() + 8, s.begin() + 8 + static_cast<int64_t>(hn), nullptr, false);
  if (header.is_discarded() || !header.is_object()) fail(path, ": the safetensors header is not a JSON object");
  const size_t data0 = 8 + hn;
  check_safetensors_layout(header, s.size() - data0, path);
  // Tensors by name, with the "transformer." prefix added where the file leaves it out.
  std::map<std::string, nlohmann::json> byname;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& k = it.key();
    if (k == "__metadata__" || k == "lm_head.weight" || k.find(".attn.bias") != std::string::npos ||
        k.find(".attn.masked_bias") != std::string::npos)
      continue;
    byname[k.rfind("transformer.", 0) == 0 ? k : "transformer." + k] = it.value();
  }
  auto shape_of = [&](const std::string& name) {
    auto it = byname.find(name);
    if (it == byname.end()) fail(path, ": no tensor '", name, "' (not a GPT-2 safetensors file?)");
    return it->second.at("shape").get<std::vector<int64_t>>();
  };
  ModelWeights w;
  GPT2Config& c = w.config;
  const auto wte = shape_of("transformer.wte.weight"), wpe = shape_of("transformer.wpe.weight");
  if (wte.size() != 2 || wpe.size() != 2) fail(path, ": wte/wpe are not 2-D");
  for (int64_t d : {wte[0], wte[1], wpe[0]})
    if (d < 1 || d > kMaxVocab)
      fail(path, ": wte/wpe shapes ", nlohmann::json(wte).dump(), ", ",
           nlohmann::json(wpe).dump(), " are out of range (1..", kMaxVocab, ")");
  c.vocab_size = static_cast<int>(wte[0]);
  c.n_embd = static_cast<int>(wte[1]);
  c.max_seq_len = static_cast<int>(wpe[0]);
  c.n_layer = 0;
  while (c.n_layer <= kMaxLayers &&
         byname.count("transformer.h." + std::to_string(c.n_layer) + ".ln_1.weight"))
    ++c.n_layer;
  c.n_head = n_head;
  if (header.contains("__metadata__")) {
    // Integer metadata (ours: the model shape) parsed strictly; where it states the shape
    // the tensors must agree.
    const nlohmann::json& meta = header["__metadata__"];
    if (meta.contains("n_head")) c.n_head = metadata_int(meta, "n_head", 1, kMaxHeads, path);
    const std::pair<const char*, int> stated[] = {{"n_layer", c.n_layer},
                                                  {"n_embd", c.n_embd},
                                                  {"n_positions", c.max_seq_len},
                                                  {"vocab_size", c.vocab_size}};
    for (const auto& [key, have] : stated)
      if (meta.contains(key) && metadata_int(meta, key, 1, kMaxVocab, path) != have)
        fail(path, ": safetensors __metadata__ ", key, " = ", meta[key].get<std::string>(),
             " but the tensors give ", have);
  }
  if (c.n_head <= 0) fail(path, ": the file does not say n_head; give it (model.n_head)");
  c.padded_vocab_size = 0;
  check_config(c, path);
  c.padded_vocab_size = c.vp();
  const std::vector<HfTensor> expect = hf_tensors(c);
  if (byname.size() != expect.size()) {
    std::string extra;
    std::set<std::string> known;
    for (const HfTensor& t : expect) known.insert(t.name);
    for (const auto& kv : byname)
      if (!known.count(kv.first)) extra += " " + kv.first;
    fail(path, ": ", byname.size(), " tensors, a GPT-2 with ", c.n_layer, " layers has ",
         expect.size(), extra.empty() ? "" : "; unexpected:" + extra);
  }
  // Every tensor's shape, dtype and size first: the shape taken from wte/wpe and the
  // layer count says nothing about the other tensors' sizes, and num_parameters(c) values
  // are allocated only once all of them are known to be in the file.
  struct Src {
    const HfTensor* t;
    std::string dtype;
    size_t eb;
    uint64_t begin;
  };
  std::vector<Src> src;
  for (const HfTensor& t : expect) {
    const auto found = byname.find(t.name);
    if (found == byname.end()) fail(path, ": no tensor '", t.name, "' (not a GPT-2 safetensors file?)");
    const nlohmann::json& e = found->second;
    const auto shape = e.at("shape").get<std::vector<int64_t>>();
    if (shape != t.shape)
      fail(path, ": tensor '", t.name, "' has shape ", nlohmann::json(shape).dump(), ", expected ",
           nlohmann::json(t.shape).dump());
    const std::string dtype = e.at("dtype").get<std::string>();
    const size_t eb = dtype_bytes(dtype);
    if (!eb) fail(path, ": tensor '", t.name, "' has dtype ", dtype, " (F32, BF16, F16 or F64 expected)");
    const auto off = e.at("data_offsets").get<std::vector<uint64_t>>();
    const uint64_t n = static_cast<uint64_t>(t.rows * t.cols);
    if (off.size() != 2 || off[1] < off[0] || off[1] - off[0] != n * eb || data0 + off[1] > s.size())
      fail(path, ": tensor '", t.name, "' has data_offsets ", nlohmann::json(off).dump(),
           " that do not hold ", n, " ", dtype, " values inside the file (truncated?)");
    src.push_back({&t, dtype, eb, off[0]});
  }
  w.params.assign(static_cast<size_t>(num_parameters(c)), 0.0f);  // padded wte rows stay 0
  for (const Src& x : src) {
    const HfTensor& t = *x.t;
    const std::string& dtype = x.dtype;
    const size_t eb = x.eb;
    const uint64_t n = static_cast<uint64_t>(t.rows * t.cols);
    const char* p = s.data() + data0 + x.begin;
    float* dst = w.params.data() + t.offset;
    if (!t.transposed) {
      for (uint64_t i = 0; i < n; ++i) dst[i] = to_float(p + i * eb, dtype);
    } else {  // file (in, out) -> ours (out, in)
      for (int64_t i = 0; i < t.cols; ++i)
        for (int64_t o = 0; o < t.rows; ++o)
          dst[o * t.cols + i] = to_float(p + (i * t.rows + o) * eb, dtype);
    }
  }
  return w;
}

ModelWeights weights_from_checkpoint(const CheckpointState& s, const std::string& path) {
  ModelWeights w;
  w.config = model_config(s);
  const GPT2Config& c = w.config;
  check_config(c, path);
  const size_t n = static_cast<size_t>(num_parameters(c));
  const size_t eb = static_cast<size_t>(s.master_elem_bytes);
  if ((eb != 4 && eb != 8) || s.master.size() != n * eb)
    fail(path, ": the checkpoint's master weights hold ", s.master.size(), " bytes of ", eb,
         "-byte values; its model shape (n_layer ", c.n_layer, ", n_head ", c.n_head,
         ", n_embd ", c.n_embd, ", max_seq_len ", c.max_seq_len, ", padded vocab ", c.vp(),
         ") has ", n, " parameters: the file is inconsistent");
  w.params.resize(n);
  for (size_t i = 0; i < n; ++i)  // little-endian IEEE (checkpoint.h), like every host we build for
    if (eb == 4) {
      std::memcpy(&w.params[i], s.master.data() + i * 4, 4);
    } else {
      double d;
      std::memcpy(&d, s.master.data() + i * 8, 8);
      w.params[i] = static_cast<float>(d);
    }
  return w;
}

ModelWeights load_weights(const std::string& path, int n_head) {
  if (!fs::exists(path)) fail(path, ": no such file");
  switch (detect_weight_format(path)) {
    case WeightFormat::Llmc:
      return load_llmc(path);
    case WeightFormat::Safetensors:
      return load_safetensors(path, n_head);
    case WeightFormat::Checkpoint:
      return weights_from_checkpoint(load_checkpoint(path), path);
    default:
      fail(path, ": not a model file this build reads (llm.c model, safetensors or stabletrain "
           "checkpoint)");
  }
}

}  // namespace st
