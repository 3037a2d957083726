// The fuzzer's shared parts (test_fuzz.cpp: the loop; test_fuzz_targets.cpp: the
// parsers under test; test_fuzz_corpus.cpp: the seed corpus): a case's files (a bundle) on
// disk, the mutation operations, a target, the tiny model and config the seeds are made of.
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt2.h"
#include "test_util.h"
#include "train/hooks.h"

namespace st::fuzz {

namespace fs = std::filesystem;

using Bundle = std::map<std::string, std::string>;  // file name -> bytes

inline Bundle read_bundle(const fs::path& dir) {
  Bundle b;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) b[e.path().filename().string()] = test::slurp(e.path());
  return b;
}
inline void write_bundle(const fs::path& dir, const Bundle& b) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  for (const auto& [name, bytes] : b) {
    std::ofstream f(dir / name, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw std::runtime_error("fuzz: cannot write " + (dir / name).string());
  }
}
inline std::vector<std::pair<std::string, Bundle>> read_entries(const fs::path& dir) {
  std::vector<std::pair<std::string, Bundle>> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) out.emplace_back(e.path().filename().string(), read_bundle(e.path()));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

inline int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : dflt;
}

// ---- mutations -------------------------------------------------------------------------

struct Mutator {
  std::mt19937_64 g;
  std::string log;  // the operations applied, for the failure message
  uint64_t below(uint64_t n) { return n ? g() % n : 0; }

  static constexpr uint8_t kBoundaryBytes[] = {0x00, 0xFF, 0x7F, 0x80};
  static constexpr int64_t kExtremes[] = {INT32_MAX, INT32_MIN, -1, int64_t(1) << 31,
                                          INT64_MIN, INT64_MAX, int64_t(1) << 32, 0,
                                          int64_t(1) << 62, UINT32_MAX};
  static constexpr const char* kTextExtremes[] = {
      "2147483647", "2147483648", "-2147483649", "9223372036854775807", "-9223372036854775808",
      "18446744073709551616", "-1", "0", "1e308", "1e999", "-1e999", "nan", "inf",
      "99999999999999999999999999", "0x7fffffff", "-0"};

  // One operation on `s`. int_fields: byte offsets of the format's integer fields
  // (offset, width 4 or 8); other: a second file for splicing.
  void op(std::string& s, const std::vector<std::pair<size_t, int>>& int_fields,
          const std::string& other) {
    const size_t n = s.size();
    char buf[128];
    switch (below(10)) {
      case 0: {  // bit flip
        if (!n) break;
        const size_t i = below(n);
        const int bit = static_cast<int>(below(8));
        s[i] = static_cast<char>(s[i] ^ (1 << bit));
        std::snprintf(buf, sizeof buf, "flip bit %d of byte %zu; ", bit, i);
        break;
      }
      case 1: {  // boundary byte
        if (!n) break;
        const size_t i = below(n);
        const uint8_t v = kBoundaryBytes[below(4)];
        s[i] = static_cast<char>(v);
        std::snprintf(buf, sizeof buf, "byte %zu = 0x%02x; ", i, v);
        break;
      }
      case 2: {  // truncate
        const size_t k = below(n + 1);
        s.resize(k);
        std::snprintf(buf, sizeof buf, "truncate to %zu; ", k);
        break;
      }
      case 3: {  // duplicate a chunk
        if (!n) break;
        const size_t a = below(n), len = 1 + below(std::min<size_t>(n - a, 256)), at = below(n + 1);
        s.insert(at, s.substr(a, len));
        std::snprintf(buf, sizeof buf, "copy [%zu,+%zu) to %zu; ", a, len, at);
        break;
      }
      case 4: {  // delete a chunk
        if (!n) break;
        const size_t a = below(n), len = 1 + below(std::min<size_t>(n - a, 256));
        s.erase(a, len);
        std::snprintf(buf, sizeof buf, "delete [%zu,+%zu); ", a, len);
        break;
      }
      case 5:
      case 6: {  // integer field = extreme (a known field, or any offset)
        const int64_t v = kExtremes[below(std::size(kExtremes))];
        size_t at;
        int w;
        if (!int_fields.empty() && below(3) != 0) {
          std::tie(at, w) = int_fields[below(int_fields.size())];
        } else {
          w = below(2) ? 4 : 8;
          if (n < size_t(w)) break;
          at = below(n - w + 1);
        }
        if (at + w > n) break;
        std::memcpy(&s[at], &v, w);  // little-endian host
        std::snprintf(buf, sizeof buf, "int%d at %zu = %lld; ", w * 8, at, (long long)v);
        break;
      }
      case 7: {  // a decimal number in text = extreme
        std::vector<size_t> starts;
        for (size_t i = 0; i < n; ++i)
          if (std::isdigit(static_cast<unsigned char>(s[i])) &&
              (i == 0 || !std::isdigit(static_cast<unsigned char>(s[i - 1]))))
            starts.push_back(i);
        if (starts.empty()) break;
        const size_t a = starts[below(starts.size())];
        size_t e = a;
        while (e < n && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '.')) ++e;
        const char* t = kTextExtremes[below(std::size(kTextExtremes))];
        s.replace(a, e - a, t);
        std::snprintf(buf, sizeof buf, "number at %zu = %s; ", a, t);
        break;
      }
      case 8: {  // splice: our prefix + the other seed's suffix
        if (other.empty()) break;
        const size_t a = below(n + 1), b = below(other.size() + 1);
        s = s.substr(0, a) + other.substr(b);
        std::snprintf(buf, sizeof buf, "splice [0,%zu) + other[%zu,end); ", a, b);
        break;
      }
      default: {  // random run
        if (!n) break;
        const size_t a = below(n), len = 1 + below(std::min<size_t>(n - a, 16));
        for (size_t i = a; i < a + len; ++i) s[i] = static_cast<char>(g());
        std::snprintf(buf, sizeof buf, "random [%zu,+%zu); ", a, len);
        break;
      }
    }
    log += buf;
  }
};
constexpr uint8_t Mutator::kBoundaryBytes[];
constexpr int64_t Mutator::kExtremes[];
constexpr const char* Mutator::kTextExtremes[];

// ---- targets ---------------------------------------------------------------------------

struct Target {
  std::string name;
  // Integer fields of a file (offset, width), for the field-overwrite mutation.
  std::function<std::vector<std::pair<size_t, int>>(const std::string& file, const std::string& bytes)>
      int_fields;
  // After mutating (e.g. the checkpoint's checksum recomputed so the records are reached).
  std::function<void(Bundle&, Mutator&)> fixup;
  // Parses the case's files in `dir`; throws on a defect.
  std::function<void(const fs::path& dir)> run;
  int iters_div = 1;  // subprocess targets: fewer cases
};

// Every parser under test (test_fuzz_targets.cpp).
std::vector<Target> targets();

// The seeds' model: 1 layer, 2 heads, width 8, 8 positions, 256 tokens; its config file.
GPT2Config tiny_model();
extern const char* const kTinyYaml;

// The stability hooks of a tiny model resuming in `dir` (test_fuzz_targets.cpp).
std::unique_ptr<StabilityHooks> tiny_hooks(const fs::path& dir, const fs::path& ref);

}  // namespace st::fuzz
