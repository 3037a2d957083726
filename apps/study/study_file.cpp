// The study file: parsing, checks and resolution into runs (study_file.h, docs/studies.md).
// The config schema is not repeated here: every override is applied to the base config by
// train's own loader (parse_config with --set overrides), first alone (so an error names the
// study file's line and key), then all of a run's together (cross-key rules).
#include "apps/study/study_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "train/config.h"

namespace st::study_tool {
namespace {

namespace fs = std::filesystem;

// The keys the study sets on every run itself: giving them in the file is refused.
const char* const kOwnedKeys[] = {"run.out_dir", "run.name", "train.ckpt_every",
                                  "train.keep_checkpoints"};

const char* const kTopKeys[] = {"base", "out_dir", "set", "axes", "runs", "reference",
                                "reference_hooks", "checkpoints", "jobs", "compare", "report"};

std::string read_text(const std::string& path, const char* what) {
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    fail("cannot read ", what, " '", path, "': not a regular file");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read ", what, " '", path, "': ", std::strerror(errno));
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// The study file's reader: "FILE:LINE: " prefixes and typed scalars.
struct Reader {
  std::string file;

  std::string at(const YAML::Node& n) const {
    const YAML::Mark m = n.Mark();
    return m.line >= 0 ? file + ":" + std::to_string(m.line + 1) + ": " : file + ": ";
  }
  static const char* shape(const YAML::Node& n) {
    return n.IsMap() ? "a mapping" : n.IsSequence() ? "a list" : n.IsNull() ? "nothing" : "a value";
  }
  std::string scalar(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) fail(at(n), key, ": expected a single value, got ", shape(n));
    return n.Scalar();
  }
  std::string text(const YAML::Node& n, const std::string& key) const {
    const std::string s = scalar(n, key);
    if (s.empty()) fail(at(n), key, ": expected a non-empty text");
    return s;
  }
  bool boolean(const YAML::Node& n, const std::string& key) const {
    const std::string s = scalar(n, key);
    if (s != "true" && s != "false") fail(at(n), key, ": expected true or false, got '", s, "'");
    return s == "true";
  }
  int64_t integer(const YAML::Node& n, const std::string& key, int64_t lo, int64_t hi) const {
    const std::string s = scalar(n, key);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size())
      fail(at(n), key, ": expected an integer, got '", s, "'");
    if (v < lo || v > hi) fail(at(n), key, " = ", v, " is out of range (must be between ", lo, " and ", hi, ")");
    return v;
  }
  double number(const YAML::Node& n, const std::string& key) const {
    const std::string s = scalar(n, key);
    double v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v))
      fail(at(n), key, ": expected a number, got '", s, "'");
    return v;
  }
  void expect_map(const YAML::Node& n, const std::string& key) const {
    if (!n.IsMap()) fail(at(n), key, ": expected a mapping (key: value lines), got ", shape(n));
  }
  // The keys of a mapping, each once, each one of `known`.
  template <class F>
  void for_keys(const YAML::Node& n, const std::string& where, const std::vector<std::string>& known,
                F f) const {
    std::set<std::string> seen;
    for (const auto& kv : n) {
      if (!kv.first.IsScalar()) fail(at(kv.first), where, ": expected a key name, got ", shape(kv.first));
      const std::string k = kv.first.Scalar();
      const std::string full = where.empty() ? k : where + "." + k;
      if (!seen.insert(k).second) fail(at(kv.first), "duplicate key '", full, "'");
      if (!known.empty() && std::find(known.begin(), known.end(), k) == known.end()) {
        std::string list;
        for (const auto& x : known) list += (list.empty() ? "" : ", ") + x;
        fail(at(kv.first), "unknown key '", full, "' (a study file has ", list, ")");
      }
      f(k, kv.first, kv.second);
    }
  }
};

// A file-system-safe piece of a run name: letters, digits and . _ + - kept, the rest '_'.
std::string safe(const std::string& s) {
  std::string out;
  for (char ch : s)
    out += (std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("._+-", ch)) ? ch : '_';
  if (out.empty()) return "none";
  if (out[0] == '.') out[0] = '_';  // no hidden or "." / ".." directories
  return out;
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || s[0] == '.' || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("._+-", ch);
  });
}

std::string leaf(const std::string& key) {
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string join_sets(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + std::string("--set ") + x;
  return s;
}

}  // namespace

std::map<std::string, std::string> flatten_config(const std::string& yaml) {
  std::map<std::string, std::string> out;
  const YAML::Node root = YAML::Load(yaml);
  for (const auto& sec : root) {
    const std::string s = sec.first.Scalar();
    if (sec.second.IsMap()) {
      for (const auto& kv : sec.second)
        out[s + "." + kv.first.Scalar()] = kv.second.IsScalar() ? kv.second.Scalar() : "";
    } else {
      out[s] = sec.second.IsScalar() ? sec.second.Scalar() : "";
    }
  }
  return out;
}

Study load_study(const std::string& path, const std::string& out_override) {
  const Reader rd{path};
  const std::string text = read_text(path, "study file");
  YAML::Node root;
  try {
    const std::vector<YAML::Node> docs = YAML::LoadAll(text);
    if (docs.size() > 1) fail(path, ": holds ", docs.size(), " YAML documents; a study file is one");
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::Exception& e) {
    fail(path, ":", e.mark.line + 1, ":", e.mark.column + 1, ": invalid YAML: ", e.msg);
  }
  if (!root.IsMap())
    fail(path, ": expected a mapping with base:, out_dir:, axes: ... (docs/studies.md), got ",
         Reader::shape(root));

  Study s;
  s.file = path;
  std::vector<Override> common;             // set:
  std::vector<YAML::Node> common_nodes;
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, YAML::Node>>>> axes;
  struct Explicit {
    std::string name;
    YAML::Node node;
    std::vector<Override> sets;
    std::vector<YAML::Node> nodes;
  };
  std::vector<Explicit> explicit_runs;
  YAML::Node reference_node, base_node;

  // A `key: value` mapping of config overrides (set:, a run's set:).
  auto read_sets = [&](const YAML::Node& n, const std::string& where, std::vector<Override>& out,
                       std::vector<YAML::Node>& nodes) {
    if (n.IsNull()) return;
    rd.expect_map(n, where);
    rd.for_keys(n, where, {}, [&](const std::string& k, const YAML::Node&, const YAML::Node& v) {
      out.push_back({k, rd.scalar(v, where + "." + k)});
      nodes.push_back(v);
    });
  };

  rd.for_keys(root, "", {std::begin(kTopKeys), std::end(kTopKeys)},
              [&](const std::string& k, const YAML::Node&, const YAML::Node& v) {
    if (k == "base") {
      s.base = rd.text(v, k);
      base_node = v;
    } else if (k == "out_dir") {
      s.out_dir = rd.text(v, k);
    } else if (k == "set") {
      read_sets(v, "set", common, common_nodes);
    } else if (k == "axes") {
      rd.expect_map(v, k);
      rd.for_keys(v, "axes", {}, [&](const std::string& key, const YAML::Node& kn, const YAML::Node& list) {
        const std::string where = "axes." + key;
        if (!list.IsSequence())
          fail(rd.at(list), where, ": expected a list of values ([a, b, ...]), got ", Reader::shape(list));
        if (list.size() == 0) fail(rd.at(kn), where, ": the list of values is empty (give at least one)");
        std::vector<std::pair<std::string, YAML::Node>> values;
        for (size_t i = 0; i < list.size(); ++i) {
          const std::string val = rd.scalar(list[i], where + "[" + std::to_string(i) + "]");
          for (const auto& [other, n] : values)
            if (other == val) fail(rd.at(list[i]), where, ": value '", val, "' is listed twice");
          values.emplace_back(val, list[i]);
        }
        axes.emplace_back(key, std::move(values));
      });
    } else if (k == "runs") {
      if (!v.IsSequence()) fail(rd.at(v), "runs: expected a list of {name:, set:} entries, got ", Reader::shape(v));
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string where = "runs[" + std::to_string(i) + "]";
        rd.expect_map(v[i], where);
        Explicit e;
        e.node = v[i];
        rd.for_keys(v[i], where, {"name", "set"}, [&](const std::string& rk, const YAML::Node&, const YAML::Node& rv) {
          if (rk == "name") e.name = rd.text(rv, where + ".name");
          else read_sets(rv, where + ".set", e.sets, e.nodes);
        });
        if (e.name.empty()) fail(rd.at(v[i]), where, ": a run needs a name:");
        if (!valid_name(e.name))
          fail(rd.at(v[i]), where, ".name: '", e.name, "' is not a safe directory name (letters, digits",
               " and . _ + -, not starting with . or -)");
        explicit_runs.push_back(std::move(e));
      }
    } else if (k == "reference") {
      s.reference = rd.text(v, k);
      reference_node = v;
    } else if (k == "reference_hooks") {
      s.reference_hooks = rd.boolean(v, k);
    } else if (k == "checkpoints") {
      s.checkpoints = static_cast<int>(rd.integer(v, k, 1, 100000));
    } else if (k == "jobs") {
      s.jobs = static_cast<int>(rd.integer(v, k, 1, 64));
    } else if (k == "compare") {
      if (v.IsNull()) return;
      rd.expect_map(v, k);
      rd.for_keys(v, "compare", {"enabled", "diverge_tol", "top"},
                  [&](const std::string& ck, const YAML::Node&, const YAML::Node& cv) {
        if (ck == "enabled") s.compare = rd.boolean(cv, "compare.enabled");
        if (ck == "top") s.top = static_cast<int>(rd.integer(cv, "compare.top", 0, 1000000));
        if (ck == "diverge_tol") {
          s.diverge_tol = rd.number(cv, "compare.diverge_tol");
          if (!(s.diverge_tol > 0)) fail(rd.at(cv), "compare.diverge_tol: must be > 0 (nats)");
        }
      });
    } else if (k == "report") {
      if (v.IsNull()) return;
      rd.expect_map(v, k);
      rd.for_keys(v, "report", {"enabled", "max_checkpoints", "read_checkpoints"},
                  [&](const std::string& rk, const YAML::Node&, const YAML::Node& rv) {
        if (rk == "enabled") s.report = rd.boolean(rv, "report.enabled");
        if (rk == "read_checkpoints") s.read_checkpoints = rd.boolean(rv, "report.read_checkpoints");
        if (rk == "max_checkpoints")
          s.max_checkpoints = static_cast<int>(rd.integer(rv, "report.max_checkpoints", 2, 100000));
      });
    }
  });

  if (s.base.empty()) fail(path, ": base: is missing (the config file every run starts from)");
  if (!out_override.empty()) s.out_dir = out_override;
  if (s.out_dir.empty()) fail(path, ": out_dir: is missing (or give --out DIR)");
  while (s.out_dir.size() > 1 && s.out_dir.back() == '/') s.out_dir.pop_back();
  if (axes.empty() && explicit_runs.empty())
    fail(path, ": no runs: give axes: (key: [values]) and/or runs: (name:, set:)");

  // The base config, checked on its own first: its errors name the base file.
  std::string base_text;
  try {
    base_text = read_text(s.base, "base config");
    parse_config(base_text, s.base);
  } catch (const Error& e) {
    fail(rd.at(base_node), "base: ", e.what(), " (base: is relative to the working directory)");
  }

  // One override on the base config: the loader's error, located in the study file.
  // Overrides that break a cross-key rule alone, by "KEY=VALUE": where they are, in case the
  // whole run breaks it too (then the error is reported at that line).
  std::map<std::string, std::string> alone_breaks_rule;
  auto check_one = [&](const Override& o, const YAML::Node& n, const std::string& where) {
    for (const char* owned : kOwnedKeys)
      if (o.key == owned)
        fail(rd.at(n), where, ": ", o.key, " is set by the study itself (run.out_dir = OUT/NAME,",
             " run.name = NAME, train.ckpt_every from checkpoints:, train.keep_checkpoints = 0)");
    if (s.reference_hooks && o.key == "hooks.reference_run")
      fail(rd.at(n), where, ": hooks.reference_run is set by the study (reference_hooks: true)");
    const std::string arg = o.key + "=" + o.value;
    try {
      parse_config(base_text, s.base, {arg});
    } catch (const Error& e) {
      std::string msg = e.what();
      // A rule that ties keys together (train.seq_len <= model.max_seq_len, ...) is judged
      // on each run's whole set below: alone, train.seq_len 256 breaks it, beside
      // model.max_seq_len 256 it does not. Only the override's own error is reported here.
      if (msg.rfind(s.base + " (with --set overrides): ", 0) == 0) {
        alone_breaks_rule.emplace(arg, rd.at(n) + where);
        return;
      }
      const std::string prefix = s.base + ": --set " + arg + ": ";
      if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
      fail(rd.at(n), where, ": ", msg);
    }
  };
  for (size_t i = 0; i < common.size(); ++i) check_one(common[i], common_nodes[i], "set." + common[i].key);
  for (const auto& [key, values] : axes) {
    for (const auto& o : common)
      if (o.key == key)
        fail(rd.at(values.front().second), "axes.", key, ": the key is also under set: (give it in one place)");
    for (const auto& [val, n] : values) check_one({key, val}, n, "axes." + key);
    s.axis_keys.push_back(key);
  }
  for (size_t r = 0; r < explicit_runs.size(); ++r)
    for (size_t i = 0; i < explicit_runs[r].sets.size(); ++i)
      check_one(explicit_runs[r].sets[i], explicit_runs[r].nodes[i],
                "runs[" + std::to_string(r) + "].set." + explicit_runs[r].sets[i].key);

  // The runs: the cross product of the axes (the first axis varies slowest), then runs:.
  std::vector<std::string> labels;
  for (const auto& [key, values] : axes) {
    std::string label = leaf(key);
    for (const auto& [other, v2] : axes)
      if (other != key && leaf(other) == label) label = key;  // two axes end alike: full keys
    labels.push_back(safe(label));
  }
  std::vector<StudyRun> runs;
  std::vector<YAML::Node> run_nodes;
  if (!axes.empty()) {
    std::vector<size_t> idx(axes.size(), 0);
    for (bool more = true; more;) {
      StudyRun r;
      r.sets = common;
      for (size_t a = 0; a < axes.size(); ++a) {
        const auto& [val, n] = axes[a].second[idx[a]];
        r.name += (a ? "_" : "") + labels[a] + "-" + safe(val);
        r.sets.push_back({axes[a].first, val});
      }
      runs.push_back(std::move(r));
      run_nodes.push_back(axes.front().second.front().second);
      more = false;
      for (size_t a = axes.size(); a-- > 0;) {
        if (++idx[a] < axes[a].second.size()) {
          more = true;
          break;
        }
        idx[a] = 0;
      }
    }
  }
  for (const Explicit& e : explicit_runs) {
    StudyRun r;
    r.name = e.name;
    r.sets = common;
    for (const Override& o : e.sets) {  // a run's own value replaces set:'s
      auto it = std::find_if(r.sets.begin(), r.sets.end(), [&](const Override& x) { return x.key == o.key; });
      if (it != r.sets.end()) it->value = o.value;
      else r.sets.push_back(o);
    }
    runs.push_back(std::move(r));
    run_nodes.push_back(e.node);
  }
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (runs[i].name == runs[j].name)
        fail(rd.at(run_nodes[i]), "two runs are named '", runs[i].name,
             "' (run names come from the axis values and runs[].name; rename one)");

  // The reference, run first (reference_hooks reads its checkpoints while the others train).
  if (s.reference.empty()) s.reference = runs.front().name;
  auto ref = std::find_if(runs.begin(), runs.end(), [&](const StudyRun& r) { return r.name == s.reference; });
  if (ref == runs.end()) {
    std::string names;
    for (const auto& r : runs) names += (names.empty() ? "" : ", ") + r.name;
    fail(rd.at(reference_node), "reference: '", s.reference, "' is not a run of the study (runs: ", names, ")");
  }
  std::rotate(runs.begin(), ref, ref + 1);

  // Each run's whole config, without the study's keys: train.max_steps, and the cross-key
  // rules that only the combination breaks.
  auto merged = [&](const StudyRun& r, const std::vector<std::string>& args) {
    try {
      return parse_config(base_text, s.base, args);
    } catch (const Error& e) {
      std::string msg = e.what();
      for (const std::string& a : args)
        if (auto it = alone_breaks_rule.find(a); it != alone_breaks_rule.end()) {
          const std::string prefix = s.base + " (with --set overrides): ";
          if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
          fail(it->second, ": ", msg, " (run '", r.name, "')");
        }
      fail(path, ": run '", r.name, "' (", s.base, " ", join_sets(args), "): ", msg);
    }
  };
  int64_t min_steps = INT64_MAX;
  for (StudyRun& r : runs) {
    for (const Override& o : r.sets) r.args.push_back(o.key + "=" + o.value);
    r.max_steps = merged(r, r.args).train.max_steps;
    min_steps = std::min(min_steps, r.max_steps);
  }
  if (min_steps < s.checkpoints)
    fail(path, ": checkpoints: ", s.checkpoints, " is more than the ", min_steps,
         " steps of the shortest run (train.max_steps)");
  s.ckpt_every = static_cast<int>(min_steps / s.checkpoints);
  for (StudyRun& r : runs) {
    r.dir = s.out_dir + "/" + r.name;
    r.args.push_back("run.out_dir=" + r.dir);
    r.args.push_back("run.name=" + r.name);
    r.args.push_back("train.ckpt_every=" + std::to_string(s.ckpt_every));
    r.args.push_back("train.keep_checkpoints=0");
    if (s.reference_hooks && r.name != s.reference)
      r.args.push_back("hooks.reference_run=" + s.out_dir + "/" + s.reference);
    r.config_yaml = config_to_yaml(merged(r, r.args));
  }
  s.runs = std::move(runs);
  s.n_explicit = static_cast<int>(explicit_runs.size());
  return s;
}

std::string resolved_study_yaml(const Study& s) {
  auto q = [](const std::string& v) {
    YAML::Emitter e;
    e << YAML::DoubleQuoted << v;  // every value quoted: read back as the same text
    return std::string(e.c_str());
  };
  std::ostringstream os;
  os << "# The resolved study, written by `study " << s.file << "`: every run in the order it runs,\n"
     << "# with the overrides it gets on top of the base config (the study adds run.out_dir =\n"
     << "# OUT/NAME, run.name = NAME, train.ckpt_every = " << s.ckpt_every
     << ", train.keep_checkpoints = 0" << (s.reference_hooks ? ", hooks.reference_run" : "")
     << ").\n# `study " << s.out_dir << "/study.yaml` runs the same study (docs/studies.md).\n";
  os << "base: " << q(s.base) << "\n";
  os << "out_dir: " << q(s.out_dir) << "\n";
  os << "checkpoints: " << s.checkpoints << "  # train.ckpt_every " << s.ckpt_every << "\n";
  os << "reference: " << q(s.reference) << "\n";
  os << "reference_hooks: " << (s.reference_hooks ? "true" : "false") << "\n";
  if (s.jobs > 1) os << "jobs: " << s.jobs << "\n";
  os << "compare:\n  enabled: " << (s.compare ? "true" : "false") << "\n";
  if (s.diverge_tol > 0) {
    char b[64];
    const auto r = std::to_chars(b, b + sizeof b, s.diverge_tol);
    os << "  diverge_tol: " << std::string(b, r.ptr) << "\n";
  }
  if (s.top >= 0) os << "  top: " << s.top << "\n";
  os << "report:\n  enabled: " << (s.report ? "true" : "false") << "\n";
  if (s.max_checkpoints > 0) os << "  max_checkpoints: " << s.max_checkpoints << "\n";
  os << "  read_checkpoints: " << (s.read_checkpoints ? "true" : "false") << "\n";
  os << "runs:\n";
  for (const StudyRun& r : s.runs) {
    os << "  - name: " << r.name << "\n";
    if (r.sets.empty()) continue;
    os << "    set:\n";
    for (const Override& o : r.sets) os << "      " << o.key << ": " << q(o.value) << "\n";
  }
  return os.str();
}

}  // namespace st::study_tool
