// Internal to train/config.cpp and train/config_schema.cpp: the config schema, every key
// declared once (name, field of Config, type, range, description, choices) in
// config_schema.cpp, and the questions asked of it. config.cpp's parsing, --set overrides,
// validation, config_to_yaml and config_help all walk this table. Not part of the public
// header train/config.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <variant>

#include "train/config.h"

namespace st::detail {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The field a key lives in; the alternative is the key's type (an enum is a string with
// choices).
using Ref = std::variant<int*, uint64_t*, double*, std::string*, bool*>;

struct Bounds {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
};

struct Key {
  const char* name;               // "section.key", or a bare name for a top-level key
  Ref (*ref)(Config&);            // the field in a Config
  Bounds bounds;                  // numbers only
  const char* desc;               // one line: also the comment in config_to_yaml
  const char* choices = nullptr;  // enums: "a|b|c"
  bool auto_word = false;         // int keys: also accept "auto", stored as kAutoInt
};

// A fixed array defined in config_schema.cpp, walked with range-for or indexed.
template <class T>
struct Table {
  const T* first;
  size_t size;
  const T* begin() const { return first; }
  const T* end() const { return first + size; }
  const T& operator[](size_t i) const { return first[i]; }
};

// Every key; the order here is the order of config_to_yaml and config_help, top-level keys
// first.
extern const Table<Key> kSchema;
// The section names (run, model, ...), in schema order.
extern const Table<const char*> kSections;

// "model" of "model.n_layer"; empty for a top-level key.
std::string section_of(const Key& k);
// "n_layer" of "model.n_layer"; the name itself for a top-level key.
std::string leaf_of(const Key& k);
bool is_section(const std::string& s);
// The key named `name` ("section.key"), or null.
const Key* find_key(const std::string& name);
// A key's type: the index of its Ref alternative (0 int, 1 uint64, 2 double, 3 string,
// 4 bool).
size_t type_of(const Key& k);

}  // namespace st::detail
