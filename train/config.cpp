// Config YAML I/O: parsing (one document of sections, or --set overrides), the typed
// reading and range checks of every key, validation of the rules between keys,
// config_to_yaml and config_help. Every key is declared once in the schema
// (config_schema.cpp: type, range, description, accessor into Config); everything here
// walks that table, so adding a key needs no change in this file.
#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>
#include <variant>

#include "core/error.h"
#include "data/excerpt.h"
#include "train/config_schema.h"

namespace st {
using namespace detail;  // the schema (config_schema.h)
namespace {

// Parameters with their gradients and AdamW moments plus activations, in values: above this
// the config is a typo, not a model (validate()).
constexpr double kMaxModelValues = 1e12;

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of
// neighbours, the usual typos.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// " (did you mean 'x'?)" for the closest of `candidates`, or "" when none is close.
std::string closest(const std::string& name, const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(1, name.size() / 4);  // 'fp8' is no typo of 'fp32'
  std::string best;
  size_t best_d = limit + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (c != name && d < best_d) best = c, best_d = d;
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

// Suggestion for an unknown key or section: a near spelling, else a key of the same name
// in another section (`train.n_layer` -> `model.n_layer`, top-level `lr` -> `train.lr`).
std::string did_you_mean(const std::string& name) {
  std::vector<std::string> names;
  for (const Key& k : kSchema) names.push_back(k.name);
  names.insert(names.end(), std::begin(kSections), std::end(kSections));
  std::string hint = closest(name, names);
  if (!hint.empty()) return hint;
  for (const Key& k : kSchema)
    if (section_of(k) == name)
      return " (a section: name one of its keys, e.g. '" + std::string(k.name) + "')";
  const std::string leaf = name.substr(name.find('.') + 1);
  for (const Key& k : kSchema)
    if (leaf == leaf_of(k) && name != k.name)
      return " (did you mean '" + std::string(k.name) + "'?)";
  return "";
}

// Shortest text that parses back to exactly `v` (std::to_chars round-trip guarantee).
std::string shortest(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A string as a YAML scalar: plain when safe; double-quoted where YAML needs it or where a
// YAML 1.1 reader (PyYAML) would take it for a boolean, null or number.
std::string yaml_string(const std::string& s) {
  static const std::set<std::string> words = {"y",   "n",    "yes", "no",   "true", "false", "on",
                                              "off", "null", "~",   ".inf", ".nan", "-.inf"};
  std::string lower = s;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-' || s[0] == '.')) ? 1 : 0;
  const bool number_like = i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]));
  YAML::Emitter e;
  if (words.count(lower) || number_like) e << YAML::DoubleQuoted;
  e << s;
  return e.c_str();
}

std::string yaml_value(const Key& k, Config& c) {
  const Ref r = k.ref(c);
  if (auto p = std::get_if<int*>(&r))
    return k.auto_word && **p == kAutoInt ? "auto" : std::to_string(**p);
  if (auto p = std::get_if<uint64_t*>(&r)) return std::to_string(**p);
  if (auto p = std::get_if<double*>(&r)) {  // ".0": integral values still read as floats
    const std::string s = shortest(**p);
    return s.find_first_of(".en") == std::string::npos ? s + ".0" : s;
  }
  if (auto p = std::get_if<bool*>(&r)) return **p ? "true" : "false";
  return yaml_string(*std::get<std::string*>(r));
}

// A YAML value or --set text, as the typed parsers see it.
struct Raw {
  std::string text;
  const char* shape = nullptr;  // "a sequence" / "a mapping" when not a scalar
};

Raw raw_of(const YAML::Node& n) {
  if (n.IsSequence()) return {"", "a sequence"};
  if (n.IsMap()) return {"", "a mapping"};
  return {n.IsNull() ? "" : n.Scalar()};  // null: `key:` with nothing, or `~`
}

std::string describe(const Raw& r) {
  if (r.shape) return r.shape;
  if (r.text.empty()) return "an empty value";
  return "'" + excerpt(r.text, 60) + "'";
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Bounds as prose for errors ("between 1 and 96", "> 0 and <= 10") or as an interval for
// help ("[1, 96]", "(0, 10]"); one-sided bounds read ">= 0" either way.
std::string bounds_text(const Bounds& b, bool integral, bool prose) {
  auto num = [&](double v) { return integral ? std::to_string((long long)v) : shortest(v); };
  const bool has_lo = b.lo > -kInf, has_hi = b.hi < kInf;
  if (!has_lo && !has_hi) return "any";
  if (has_lo && has_hi && !prose)
    return (b.lo_open ? "(" : "[") + num(b.lo) + ", " + num(b.hi) + (b.hi_open ? ")" : "]");
  if (has_lo && has_hi && !b.lo_open && !b.hi_open)
    return "between " + num(b.lo) + " and " + num(b.hi);
  std::string s;
  if (has_lo) s = (b.lo_open ? "> " : ">= ") + num(b.lo);
  if (has_lo && has_hi) s += " and ";
  if (has_hi) s += (b.hi_open ? "< " : "<= ") + num(b.hi);
  return s;
}

void check_range(const Key& k, double v, const std::string& shown, const std::string& where) {
  Bounds b = k.bounds;  // narrowed to what an int field can hold
  if (type_of(k) == 0)
    b.lo = std::max(b.lo, double(INT_MIN)), b.hi = std::min(b.hi, double(INT_MAX));
  if (!((b.lo_open ? v > b.lo : v >= b.lo) && (b.hi_open ? v < b.hi : v <= b.hi)))
    fail(where, k.name, " = ", shown, " is out of range (must be ",
         bounds_text(b, type_of(k) == 0, true), ")");
}

void check_choice(const Key& k, const std::string& v, const Raw& raw, const std::string& where) {
  std::vector<std::string> choices;
  std::stringstream ss(k.choices);
  for (std::string choice; std::getline(ss, choice, '|');) choices.push_back(choice);
  if (std::find(choices.begin(), choices.end(), v) == choices.end())
    fail(where, k.name, ": expected one of ", k.choices, ", got ", describe(raw),
         closest(v, choices));
}

// std::from_chars over the whole of `s`, after an optional '+' (YAML and people write it).
template <class T>
std::errc parse_number(const std::string& s, T& v) {
  const size_t skip = (s.size() > 1 && s[0] == '+' && s[1] != '-') ? 1 : 0;
  const auto [end, ec] = std::from_chars(s.data() + skip, s.data() + s.size(), v);
  return end == s.data() + s.size() ? ec : std::errc::invalid_argument;
}

// Parses `raw` as key k's type, checks its range and stores it in c. `where` starts errors.
void assign(const Key& k, Config& c, const Raw& raw, const std::string& where) {
  const std::string s = trim(raw.text);
  auto expected = [&](const char* what) {
    fail(where, k.name, ": expected ", what, ", got ", describe(raw));
  };
  const Ref r = k.ref(c);
  if (auto p = std::get_if<int*>(&r)) {
    if (k.auto_word && s == "auto" && !raw.shape) {
      **p = kAutoInt;
      return;
    }
    int64_t v = 0;
    const std::errc ec = raw.shape ? std::errc::invalid_argument : parse_number(s, v);
    if (ec == std::errc::result_out_of_range)
      v = s[0] == '-' ? INT64_MIN : INT64_MAX;
    else if (ec != std::errc())
      expected(k.auto_word ? "an integer or auto" : "an integer");
    check_range(k, static_cast<double>(v), s, where);  // also catches what int cannot hold
    **p = static_cast<int>(v);
  } else if (auto p = std::get_if<uint64_t*>(&r)) {
    uint64_t v = 0;
    if (raw.shape || parse_number(s, v) != std::errc()) expected("an integer in [0, 2^64)");
    check_range(k, static_cast<double>(v), s, where);
    **p = v;
  } else if (auto p = std::get_if<double*>(&r)) {
    double v = 0;
    const std::errc ec = raw.shape ? std::errc::invalid_argument : parse_number(s, v);
    if (ec == std::errc::result_out_of_range)
      fail(where, k.name, " = ", s, " is out of range (not representable as a double)");
    if (ec != std::errc()) expected("a number");
    if (!std::isfinite(v)) expected("a finite number");
    check_range(k, v, s, where);
    **p = v;
  } else if (auto p = std::get_if<bool*>(&r)) {
    if (raw.shape || (s != "true" && s != "false")) expected("true or false");
    **p = s == "true";
  } else {
    std::string* str = std::get<std::string*>(r);
    if (k.choices) {  // a sequence or mapping fails here too, with the list of choices
      check_choice(k, s, raw, where);
      *str = s;
    } else {
      if (raw.shape) expected("a string (quote it if it holds YAML syntax)");
      *str = raw.text;  // not trimmed: quoted YAML strings keep their spaces
    }
  }
}

// Re-checks every key of a Config (it may have been built in code), then the rules that
// tie keys together.
void validate(Config& c, const std::string& where) {
  for (const Key& k : kSchema) {
    const Ref r = k.ref(c);
    if (auto p = std::get_if<int*>(&r); p && !(k.auto_word && **p == kAutoInt))
      check_range(k, **p, std::to_string(**p), where);
    if (auto p = std::get_if<double*>(&r)) {
      if (!std::isfinite(**p)) fail(where, k.name, " = ", shortest(**p), " is not finite");
      check_range(k, **p, shortest(**p), where);
    }
    if (auto p = std::get_if<std::string*>(&r); p && k.choices) check_choice(k, **p, {**p}, where);
  }
  const ModelSection& m = c.model;
  const TrainSection& t = c.train;
  if (m.n_embd % m.n_head != 0)
    fail(where, "model.n_embd = ", m.n_embd, " is not divisible by model.n_head = ", m.n_head,
         " (each head gets n_embd / n_head channels)");
  if (t.seq_len > m.max_seq_len)
    fail(where, "train.seq_len = ", t.seq_len, " exceeds model.max_seq_len = ", m.max_seq_len,
         " (raise model.max_seq_len or lower train.seq_len)");
  if (t.min_lr > t.lr)
    fail(where, "train.min_lr = ", shortest(t.min_lr), " exceeds train.lr = ", shortest(t.lr),
         " (the schedule decays from lr down to min_lr)");
  // Tokens per optimizer step are counted in int: B * T * grad_accum_steps must fit.
  const double step_tokens = double(t.batch_size) * t.seq_len * t.grad_accum_steps;
  if (step_tokens > INT_MAX)
    fail(where, "train.batch_size x train.seq_len x train.grad_accum_steps = ", t.batch_size, " x ",
         t.seq_len, " x ", t.grad_accum_steps, " = ", shortest(step_tokens),
         " tokens per step is more than ", INT_MAX, " (lower one of them)");
  // Sizes no machine holds (an extra zero in a key) are refused here, before anything is
  // allocated, instead of ending in std::bad_alloc: weights with their gradient and AdamW
  // state (4 values per parameter) plus a rough count of the activations kept for backward
  // (per token and layer about 16 C plus the attention scores, and the logits).
  const double C = m.n_embd, L = m.n_layer, V = m.vocab_size, T = t.seq_len, B = t.batch_size;
  const double params = V * C + double(m.max_seq_len) * C + L * (12 * C * C + 13 * C) + 2 * C;
  const double values = 4 * params + B * T * (L * (16 * C + 2 * m.n_head * T) + 2 * V);
  if (values > kMaxModelValues)
    fail(where, "the model and batch need about ", shortest(std::round(values / 1e9)),
         "e9 values (", shortest(std::round(params / 1e6)), "e6 parameters; model.n_layer ",
         m.n_layer, ", n_embd ", m.n_embd, ", vocab_size ", m.vocab_size, ", train.batch_size ",
         t.batch_size, ", seq_len ", t.seq_len, "), more than the limit of ",
         shortest(kMaxModelValues), " (4 TB in FP32); lower them");
  // A smaller vocabulary would index past the embedding table on the first unseen token.
  const int tokens = c.data.tokenizer == "gpt2" ? 50257 : 256;
  if (m.vocab_size < tokens)
    fail(where, "model.vocab_size = ", m.vocab_size, " is smaller than the ", c.data.tokenizer,
         " tokenizer's ", tokens, " tokens (set model.vocab_size: ", tokens, ")");
  attention_configs(c, where);  // attention.layer_backends and fp32_out_heads (config_views.cpp)
}

// "file:LINE: " for a YAML node, so editors jump to it.
std::string at(const std::string& src, const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.line >= 0 ? src + ":" + std::to_string(m.line + 1) + ": " : src + ": ";
}

void apply_override(Config& c, const std::string& o, const std::string& src) {
  const std::string where = src + ": --set " + o + ": ";
  const size_t eq = o.find('=');
  if (eq == std::string::npos) fail(where, "expected section.key=value (or device=value)");
  const std::string name = trim(o.substr(0, eq));
  const Key* k = find_key(name);
  if (!k) fail(where, "unknown key '", name, "'", did_you_mean(name));
  assign(*k, c, Raw{o.substr(eq + 1)}, where);
}

// One section's mapping: every entry must be a key of that section.
void parse_section(Config& c, const std::string& section, const YAML::Node& body,
                   const std::string& src, std::set<std::string>& seen) {
  for (const auto& kv : body) {
    const std::string where = at(src, kv.first);
    if (!kv.first.IsScalar())
      fail(where, section, ": expected a key name, got ", raw_of(kv.first).shape);
    const std::string name = section + "." + kv.first.Scalar();
    if (!seen.insert(name).second) fail(where, "duplicate key '", name, "'");
    const Key* k = find_key(name);
    if (!k) fail(where, "unknown key '", name, "'", did_you_mean(name));
    assign(*k, c, raw_of(kv.second), where);
  }
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides) {
  const std::string src = source.empty() ? "<config>" : source;
  YAML::Node root;
  try {
    // All documents: a '---' line starts a second one, which YAML::Load would drop silently.
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml_text);
    if (docs.size() > 1)
      fail(src, ": holds ", docs.size(), " YAML documents (the second starts at line ",
           docs[1].Mark().line >= 0 ? std::to_string(docs[1].Mark().line + 1) : std::string("?"),
           ", after a '---' line); a config is one document: remove the '---' and merge the",
           " keys after it into the first");
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::Exception& e) {
    fail(src, ":", e.mark.line + 1, ":", e.mark.column + 1, ": invalid YAML: ", e.msg);
  }
  Config c;
  c.source = source;
  if (!root.IsNull() && !root.IsMap())
    fail(src, ": expected a mapping of sections (train:, model:, ...), got ",
         describe(raw_of(root)));
  std::set<std::string> seen;
  for (const auto& kv : root) {
    const std::string where = at(src, kv.first);
    if (!kv.first.IsScalar()) fail(where, "expected a section name, got ", raw_of(kv.first).shape);
    const std::string name = kv.first.Scalar();
    const YAML::Node& body = kv.second;
    if (!seen.insert(name).second) fail(where, "duplicate key '", name, "'");
    const Key* k = find_key(name);
    if (k && name.find('.') == std::string::npos) {  // a top-level key such as `device`
      assign(*k, c, raw_of(body), where);
    } else if (k) {
      fail(where, "'", name, "' must be written as '", leaf_of(*k), ":' under '", section_of(*k),
           ":'");
    } else if (!is_section(name)) {
      fail(where, "unknown ", body.IsMap() ? "section" : "key", " '", name, "'",
           did_you_mean(name));
    } else if (!body.IsNull()) {  // `hooks:` with nothing under it keeps the defaults
      if (!body.IsMap())
        fail(where, name, ": expected a mapping of keys, got ", describe(raw_of(body)));
      parse_section(c, name, body, src, seen);
    }
  }
  for (const std::string& o : overrides) apply_override(c, o, src);
  validate(c, src + (overrides.empty() ? ": " : " (with --set overrides): "));
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  // Only a regular file: fopen of a FIFO blocks until a writer comes, a directory reads empty.
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    fail("cannot read config file '", path, "': not a regular file (a directory, FIFO or",
         " device?); give the YAML file");
  // stdio rather than ifstream: errno is reliable.
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot read config file '", path, "': ", std::strerror(errno));
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err) fail("cannot read config file '", path, "': ", std::strerror(err));
  return parse_config(text, path, overrides);
}

void validate_config(const Config& config) {
  Config c = config;  // accessors hand out mutable pointers
  validate(c, (c.source.empty() ? std::string("<config>") : c.source) + ": ");
}

std::string config_to_yaml(const Config& config) {
  Config c = config;
  std::ostringstream os;
  os << "# stabletrain config, fully resolved; `train --help-config` documents every key.\n";
  std::string section;
  for (const Key& k : kSchema) {
    const std::string sec = section_of(k);
    if (sec != section && !sec.empty()) os << "\n" << sec << ":\n";
    section = sec;
    std::string line = (sec.empty() ? "" : "  ") + leaf_of(k) + ": " + yaml_value(k, c);
    line.resize(std::max<size_t>(line.size(), 40), ' ');  // comments line up
    os << line << "  # " << k.desc << "\n";
  }
  return os.str();
}

std::string config_help() {
  static const char* types[] = {"int", "uint64", "float", "string", "bool"};
  Config defaults;
  std::vector<std::vector<std::string>> rows;  // key, type, default, range, description
  for (const Key& k : kSchema) {
    const size_t t = type_of(k);
    rows.push_back({k.name, k.choices ? "enum" : k.auto_word ? "int|auto" : types[t],
                    yaml_value(k, defaults),
                    k.choices   ? k.choices
                    : t >= 3    ? "-"
                    : k.auto_word ? "auto, " + bounds_text(k.bounds, t == 0, false)
                                : bounds_text(k.bounds, t == 0, false),
                    k.desc});
  }
  // Columns sized for the typical row; an outlier (a long path) just pushes its line right.
  const size_t width[4] = {26, 8, 10, 17};
  std::ostringstream os;
  os << "stabletrain config keys. Every key is optional (unset keys take the default); write\n"
        "`section.key` as `key:` under `section:` in the YAML file, or override it on the\n"
        "command line with --set section.key=value (--set device=cpu for top-level keys).\n";
  std::string section = "-";
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string sec = section_of(kSchema[i]);
    if (sec != section) os << "\n" << (sec.empty() ? "top level" : sec) << ":\n";
    section = sec;
    std::string line = "  ";
    for (int j = 0; j < 4; ++j) {
      line += rows[i][j] + "  ";
      line.resize(std::max(line.size(), 2 + std::accumulate(width, width + j + 1, size_t(0))), ' ');
    }
    os << line << rows[i][4] << "\n";
  }
  return os.str();
}

namespace {

void flatten_into(const YAML::Node& n, const std::string& prefix,
                  std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n)
      flatten_into(kv.second, prefix.empty() ? kv.first.as<std::string>()
                                             : prefix + "." + kv.first.as<std::string>(), out);
  } else if (n.IsScalar()) {
    out[prefix] = n.Scalar();
  } else if (n.IsSequence()) {
    YAML::Emitter e;
    e << YAML::Flow << n;
    out[prefix] = e.c_str();
  } else {
    out[prefix] = "";
  }
}

}  // namespace

std::map<std::string, std::string> flatten_yaml(const YAML::Node& doc) {
  std::map<std::string, std::string> out;
  flatten_into(doc, "", out);
  return out;
}

}  // namespace st
