// compare (apps/compare.cpp): reading the runs — a run directory's metrics.jsonl (loss and
// val_loss by step), its checkpoint files and its config.yaml (flattened), the model-shape
// checks between two runs (config.yaml and checkpoints), the pairing of checkpoint steps and
// the config keys that differ.
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/excerpt.h"
#include "apps/compare/compare.h"
#include "train/config.h"

namespace fs = std::filesystem;

namespace st::compare_tool {

std::string normal_path(const std::string& arg) {
  std::string p = fs::path(arg).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// The name of a run directory ("runs/a/" -> "a", "." -> the current folder's name).
std::string dir_name(const std::string& dir) {
  fs::path p(dir);
  std::string n = p.filename().string();
  if (n.empty() || n == "." || n == "..") {
    std::error_code ec;
    const fs::path abs = fs::weakly_canonical(p, ec);
    n = ec ? dir : abs.filename().string();
  }
  return n.empty() ? dir : n;
}

void read_metrics(Run& r) {
  const std::string path = (fs::path(r.path) / "metrics.jsonl").string();
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    fail(path, " is not a regular file (a directory, FIFO or device?); a run directory written",
         " by train holds metrics.jsonl as a file");
  std::ifstream f(path, std::ios::binary);
  if (!f)
    fail("no metrics.jsonl in run directory '", r.arg, "' (", path,
         " cannot be read): give a run directory written by train");
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  // Lines; the last one may be incomplete (no newline) in a run that is still running.
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  size_t last = lines.size();
  while (last > 0 && lines[last - 1].find_first_not_of(" \t\r") == std::string::npos) --last;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      if (i + 1 == last) {
        std::fprintf(stderr,
                     "compare: warning: %s line %zu is incomplete (%zu bytes, not a JSON "
                     "object); skipped (the run is still being written or was cut off)\n",
                     path.c_str(), i + 1, line.size());
        continue;
      }
      fail(path, " line ", i + 1, ": not a JSON object ('", excerpt(line, 60),
           "'); metrics.jsonl is written by train: repair or",
           " delete that line");
    }
    const bool has_loss = j.contains("loss"), has_val = j.contains("val_loss");
    if (!has_loss && !has_val) continue;  // checkpoint lines and others
    if (!j.contains("step") || !j["step"].is_number_integer())
      fail(path, " line ", i + 1, ": a loss line without an integer \"step\"; repair or delete",
           " that line");
    const int64_t step = j["step"].get<int64_t>();
    auto value = [&](const char* key) {
      const auto& v = j[key];
      if (v.is_null()) return kNaN;  // JSON has no NaN: nlohmann writes NaN/Inf as null
      if (!v.is_number())
        fail(path, " line ", i + 1, ": \"", key, "\" is not a number (", excerpt(v.dump(), 60),
             "); repair or delete that line");
      return v.get<double>();
    };
    LossPoint& p = r.metrics[step];
    if (has_loss) {
      p.has_loss = true;
      p.loss = value("loss");
    }
    if (has_val) {
      p.has_val = true;
      p.val = value("val_loss");
    }
  }
}

void list_checkpoints(Run& r) {
  static const std::regex ckpt_re("ckpt_([0-9]{8})\\.bin");
  static const std::regex tmp_re("ckpt_([0-9]{8})\\.bin\\.tmp\\..*");
  std::error_code ec;
  std::vector<std::string> temps;
  for (const auto& e : fs::directory_iterator(r.path, ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, ckpt_re)) {
      if (!e.is_regular_file(ec))
        fail(e.path().string(), " is not a regular file (a directory, FIFO or device?); a",
             " checkpoint is a file written by train: remove or rename it");
      r.ckpts[std::stoll(m[1])] = e.path().string();  // 8 digits: cannot overflow
    }
    else if (std::regex_match(name, tmp_re))
      temps.push_back(e.path().string());
  }
  if (ec) fail("cannot list run directory '", r.arg, "': ", ec.message());
  std::sort(temps.begin(), temps.end());
  for (const auto& t : temps)
    std::fprintf(stderr,
                 "compare: note: ignoring %s: a checkpoint still being written (or left by a "
                 "crashed run), not a checkpoint yet\n",
                 t.c_str());
}

void read_config(Run& r) {
  const fs::path p = fs::path(r.path) / "config.yaml";
  if (!fs::exists(p)) {
    std::fprintf(stderr, "compare: note: %s has no config.yaml; its model shape is checked from"
                         " its checkpoints only\n", r.arg.c_str());
    return;
  }
  r.config_path = p.string();
  if (std::error_code ec; !fs::is_regular_file(p, ec))
    fail(r.config_path, " is not a regular file (a directory, FIFO or device?); restore the",
         " config.yaml train wrote, or remove it to check shapes from the checkpoints only");
  try {
    r.config = flatten_yaml(YAML::LoadFile(r.config_path));
  } catch (const YAML::Exception& e) {
    fail(r.config_path, ": not valid YAML (", e.what(), "); it is written by train: restore it or",
         " delete it to check shapes from the checkpoints only");
  }
}

namespace {

const char* const kShapeKeys[] = {"n_layer", "n_head", "n_embd", "max_seq_len", "vocab_size"};

}  // namespace

std::string config_shape_diff(const Run& a, const Run& b) {
  if (a.config_path.empty() || b.config_path.empty()) return "";
  std::string diff;
  for (const char* k : kShapeKeys) {
    const std::string key = std::string("model.") + k;
    const auto ia = a.config.find(key), ib = b.config.find(key);
    if (ia == a.config.end() || ib == b.config.end() || ia->second == ib->second) continue;
    diff += (diff.empty() ? "" : ", ") + std::string(k) + " " + ia->second + " vs " + ib->second;
  }
  return diff.empty() ? diff : diff + " (" + a.config_path + ", " + b.config_path + ")";
}

std::string ckpt_shape_diff(const std::string& fa, const GPT2Config& ca, const std::string& fb,
                            const GPT2Config& cb) {
  std::string diff;
  auto field = [&](const char* k, int va, int vb) {
    if (va != vb)
      diff += (diff.empty() ? "" : ", ") + std::string(k) + " " + std::to_string(va) + " vs " +
              std::to_string(vb);
  };
  field("n_layer", ca.n_layer, cb.n_layer);
  field("n_head", ca.n_head, cb.n_head);
  field("n_embd", ca.n_embd, cb.n_embd);
  field("max_seq_len", ca.max_seq_len, cb.max_seq_len);
  field("vocab_size", ca.vocab_size, cb.vocab_size);
  field("padded_vocab_size", ca.vp(), cb.vp());
  return diff.empty() ? diff : diff + " (" + fa + ", " + fb + ")";
}

const char* pairing_name(const StepPair& p, bool file_mode) {
  return p.a == p.b ? "exact" : file_mode ? "given" : "nearest";
}

// Keys whose values differ between two configs (run.name and run.out_dir left out).
std::vector<std::string> config_diffs(const Run& a, const Run& b) {
  std::vector<std::string> out;
  if (a.config_path.empty() || b.config_path.empty()) return out;
  std::set<std::string> all;
  for (const auto& kv : a.config) all.insert(kv.first);
  for (const auto& kv : b.config) all.insert(kv.first);
  for (const auto& k : all) {
    if (k == "run.name" || k == "run.out_dir") continue;
    const auto ia = a.config.find(k), ib = b.config.find(k);
    const std::string va = ia == a.config.end() ? "(unset)" : ia->second;
    const std::string vb = ib == b.config.end() ? "(unset)" : ib->second;
    if (va != vb) out.push_back(k + " " + (va.empty() ? "''" : va) + " vs " + (vb.empty() ? "''" : vb));
  }
  return out;
}

}  // namespace st::compare_tool
