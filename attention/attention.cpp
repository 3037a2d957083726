#include "attention/attention.h"

#include "core/error.h"

namespace st {

AttentionKind parse_attention_kind(const std::string& s) {
  if (s == "baseline") return AttentionKind::Baseline;
  if (s == "flash") return AttentionKind::Flash;
  if (s == "stabilized_flash") return AttentionKind::StabilizedFlash;
  fail("unknown attention backend '", s, "' (expected baseline, flash or stabilized_flash)");
}

const char* attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::Baseline: return "baseline";
    case AttentionKind::Flash: return "flash";
    case AttentionKind::StabilizedFlash: return "stabilized_flash";
  }
  return "?";
}

}  // namespace st
