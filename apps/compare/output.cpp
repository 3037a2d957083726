// compare (apps/compare.cpp): small text helpers (shortest round-trip numbers, CSV fields,
// step lists) and the output files — compare.csv and the loss CSV, each built in memory,
// written to a temporary file and renamed into place — and the usage-error line.
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "apps/compare/compare.h"

namespace st::compare_tool {

// ---------------------------------------------------------------- small helpers

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

std::string num(double v) {  // shortest round-trip
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::vector<int64_t> keys(const std::map<int64_t, std::string>& m) {
  std::vector<int64_t> v;
  for (const auto& kv : m) v.push_back(kv.first);
  return v;
}

// ---------------------------------------------------------------- output

const char* const kCompareCsvHeader =
    "run_a,run_b,step,step_a,step_b,pairing,tensor,layer,head,w1,w1_normalized,max_abs_diff";

std::string compare_csv_fields(const StepPair& sp, const char* pairing, const DistanceRow& r) {
  return std::to_string(sp.a) + "," + std::to_string(sp.a) + "," + std::to_string(sp.b) + "," +
         pairing + "," + csv_field(r.tensor) + "," + std::to_string(r.layer) + "," +
         std::to_string(r.head) + "," + num(r.w1) + "," + num(r.w1_normalized) + "," +
         num(r.max_abs_diff);
}

void write_atomically(const std::string& path, const std::string& text, std::string& tmp_out) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("cannot write ", path, " (temporary ", tmp, "): ", std::strerror(errno),
                 "; give a writable -o path");
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      fail("cannot write ", path, " (temporary ", tmp, "): write failed (disk full?)");
    }
  }
  tmp_out = tmp;
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "compare: usage error: %s (compare RUN_A RUN_B [RUN_C ...] [-o FILE] "
               "[--step N] [--max-step-gap N] [--top K]; --help for more)\n", msg.c_str());
  return 2;
}

void write_outputs(const std::vector<Run>& runs, const std::vector<PairResult>& pairs,
                   bool file_mode, const std::string& out_csv, const std::string& loss_csv,
                   size_t& n_rows, size_t& n_loss_rows) {
  const Run& A = runs[0];
  std::string csv = std::string(kCompareCsvHeader) + "\n";
  n_rows = 0;
  for (size_t k = 1; k < runs.size(); ++k)
    for (const StepPair& sp : pairs[k].steps)
      for (const DistanceRow& row : pairs[k].rows.at(sp.a)) {
        csv += csv_field(A.name) + "," + csv_field(runs[k].name) + "," +
               compare_csv_fields(sp, pairing_name(sp, file_mode), row) + "\n";
        ++n_rows;
      }
  std::string loss_text;
  n_loss_rows = 0;
  if (!file_mode) {
    loss_text = "step,run,loss,val_loss,loss_diff_vs_a\n";
    std::set<int64_t> steps;
    for (const Run& r : runs)
      for (const auto& kv : r.metrics) steps.insert(kv.first);
    for (const int64_t step : steps) {
      const auto ia = A.metrics.find(step);
      for (const Run& r : runs) {
        const auto it = r.metrics.find(step);
        if (it == r.metrics.end()) continue;
        const LossPoint& p = it->second;
        loss_text += std::to_string(step) + "," + csv_field(r.name) + ",";
        if (p.has_loss) loss_text += num(p.loss);
        loss_text += ",";
        if (p.has_val) loss_text += num(p.val);
        loss_text += ",";
        if (p.has_loss && ia != A.metrics.end() && ia->second.has_loss)
          loss_text += num(p.loss - ia->second.loss);
        loss_text += "\n";
        ++n_loss_rows;
      }
    }
  }
  std::string tmp_csv, tmp_loss;
  write_atomically(out_csv, csv, tmp_csv);
  if (!file_mode) {
    try {
      write_atomically(loss_csv, loss_text, tmp_loss);
    } catch (...) {
      std::remove(tmp_csv.c_str());
      throw;
    }
  }
  if (std::rename(tmp_csv.c_str(), out_csv.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_csv.c_str());
    if (!tmp_loss.empty()) std::remove(tmp_loss.c_str());
    fail("cannot write ", out_csv, ": ", why);
  }
  if (!tmp_loss.empty() && std::rename(tmp_loss.c_str(), loss_csv.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_loss.c_str());
    fail("wrote ", out_csv, " but cannot write ", loss_csv, ": ", why);
  }
}

}  // namespace st::compare_tool
