// A short, printable excerpt of untrusted text (file content, a CSV field, a YAML value)
// for an error message: bytes outside printable ASCII become \xNN (\n, \r, \t as such) and
// the text is cut after `max` input bytes with "..." so a binary or huge file cannot flood
// the terminal or break the one-line error.
#pragma once
#include <cstdio>
#include <string>
#include <string_view>

namespace st {

inline std::string excerpt(std::string_view s, size_t max = 40) {
  std::string out;
  const size_t n = s.size() < max ? s.size() : max;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace st
