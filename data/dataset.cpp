#include "data/dataset.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace st {
namespace {

std::vector<int32_t> read_bytes(const std::string& path, const char* key) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    fail(key, ": cannot read '", path, "': ", std::strerror(errno),
         " (fix the path in the config or with --set ", key, "=FILE)");
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) fail(key, ": read error on '", path, "'");
  std::vector<int32_t> t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = static_cast<unsigned char>(s[i]);
  return t;
}

}  // namespace

TokenData load_text_bytes(const std::string& train_path, const std::string& val_path,
                          double val_fraction) {
  TokenData d;
  d.vocab_size = 256;
  d.train = read_bytes(train_path, "data.train_path");
  if (d.train.empty()) fail("data.train_path: '", train_path, "' is empty");
  if (!val_path.empty()) {
    d.val = read_bytes(val_path, "data.val_path");
  } else {
    const size_t nval = static_cast<size_t>(d.train.size() * val_fraction);
    d.val.assign(d.train.end() - nval, d.train.end());
    d.train.resize(d.train.size() - nval);
  }
  d.description = train_path + ": " + std::to_string(d.train.size()) + " train / " +
                  std::to_string(d.val.size()) + " val tokens (byte-level)";
  return d;
}

std::string decode_bytes(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) s.push_back(static_cast<char>(t & 0xff));
  return s;
}

}  // namespace st
