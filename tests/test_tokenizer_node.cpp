// GPT-2 tokenizer against an independent encoder: the npm package gpt-3-encoder 1.1.4, run
// unmodified with node (tests/node/gpt2_reference.js). The package is installed into the
// build folder on first use (tests/node/install_gpt3_encoder.sh: needs node, npm and the
// registry); without node the tests fail with the install hint.
//   - token ids of the whole of Tiny Shakespeare and of tests/data/tokenizer_text.txt
//     (Unicode, digits, contractions, repeated spaces, newlines);
//   - pre-tokenization (the package's own regex) and ids of a random stress text drawn from
//     characters at the edges of every rule;
//   - the letter / number / whitespace class of every code point.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "tokenizer_fixture.h"
#include "core/rng.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;
using namespace st;
using st::test::kVocabDir, st::test::slurp, st::test::tok;
using st::test::sh;

namespace {

const std::string kPkg = ST_NPM_PREFIX "/node_modules/gpt-3-encoder";

const fs::path& tmp() { return st::test::scratch_root("st_node_"); }

// Installs the package once (under a lock: ctest runs test cases in parallel processes).
void ensure_package() {
  static bool ok = false;
  if (ok) return;
  const std::string err = (tmp() / "install.err").string();
  const int rc = sh("mkdir -p '" ST_NPM_PREFIX "' && flock '" ST_NPM_PREFIX "/.lock' bash '" +
                    std::string(ST_NODE_DIR) + "/install_gpt3_encoder.sh' '" ST_NPM_PREFIX "' 2>" + err);
  ASSERT_EQ(rc, 0) << slurp(err);
  ok = true;
}

std::vector<int64_t> node_numbers(const std::string& mode, const std::string& text_file) {
  ensure_package();
  const std::string out = (tmp() / (mode + ".out")).string();
  const std::string err = (tmp() / (mode + ".err")).string();
  const int rc = sh("node '" ST_NODE_DIR "/gpt2_reference.js' '" + kPkg + "' " + mode + " '" +
                    text_file + "' '" + out + "' 2>" + err);
  EXPECT_EQ(rc, 0) << slurp(err);
  std::vector<int64_t> v;
  std::ifstream f(out);
  for (std::string line; std::getline(f, line);) v.push_back(line.empty() ? -1 : std::stoll(line));
  return v;
}

// Index of the first difference, or -1.
template <class A, class B>
int64_t first_diff(const A& a, const B& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (static_cast<int64_t>(a[i]) != static_cast<int64_t>(b[i])) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
}

void compare_ids(const std::string& file) {
  const std::vector<int64_t> ref = node_numbers("encode", file);
  const std::vector<int32_t> ids = tok().encode(slurp(file));
  const int64_t d = first_diff(ids, ref);
  EXPECT_EQ(d, -1) << file << ": first difference at token " << d << " of " << ids.size()
                   << " (node: " << ref.size() << " tokens)";
  std::printf("  %s: %zu ids, node %zu ids, identical: %s\n", fs::path(file).filename().c_str(),
              ids.size(), ref.size(), d == -1 ? "yes" : "NO");
}

// A text stressing every rule: letters, numbers, other, \s variants, apostrophes and
// contraction letters, astral characters, combining marks, in random runs.
std::string stress_text(size_t n_chars, uint64_t seed) {
  const char* pool[] = {" ", " ", " ", "\n", "\n", "\t", "\r\n", "\u00a0", "\u3000", "\ufeff",
                        "\u2028", "\u0085", "\u200b", "'", "'", "s", "t", "re", "ve", "m", "ll",
                        "d", "S", "a", "Z", "é", "ß", "中", "ǅ", "𝐀", "e\u0301", "5", "0", "٣",
                        "½", "Ⅻ", "²", "𝟘", "!", ",", ".", "\"", "-", "😀", "👍🏽", "$", "_", "<|",
                        "|>", "’"};
  const size_t np = sizeof pool / sizeof pool[0];
  Rng r(seed);
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) s += pool[r.below(np)];
  return s;
}

}  // namespace

TEST(TokenizerVsNode, SameVocabularyFiles) {
  ensure_package();
  EXPECT_EQ(slurp(kPkg + "/encoder.json"), slurp(kVocabDir + "/encoder.json"));
  EXPECT_EQ(slurp(kPkg + "/vocab.bpe"), slurp(kVocabDir + "/vocab.bpe"));
}

TEST(TokenizerVsNode, TinyShakespeareIdForId) { compare_ids(ST_SHARED_DATA_DIR "/tinyshakespeare.txt"); }

TEST(TokenizerVsNode, UnicodeDigitsContractionsSpaces) {
  compare_ids(ST_TEST_DATA_DIR "/tokenizer_text.txt");
}

TEST(TokenizerVsNode, RandomStressTextPiecesAndIds) {
  const std::string file = (tmp() / "stress.txt").string();
  std::string text = stress_text(200000, 3);
  std::ofstream(file, std::ios::binary) << text;
  const std::vector<int64_t> ref = node_numbers("pretokenize", file);
  std::vector<std::string_view> pieces;
  gpt2_pretokenize(text, pieces);
  std::vector<int64_t> lens;
  for (auto p : pieces) lens.push_back(static_cast<int64_t>(p.size()));
  const int64_t d = first_diff(lens, ref);
  size_t at = 0;
  for (int64_t i = 0; i < d; ++i) at += static_cast<size_t>(lens[i]);
  EXPECT_EQ(d, -1) << "pre-token " << d << " differs, at byte " << at << ": '"
                   << text.substr(at, 40) << "'";
  std::printf("  stress text: %zu bytes, %zu pieces (node %zu)\n", text.size(), lens.size(), ref.size());
  compare_ids(file);
}

// Runs of quotes and punctuation: where gpt-3-encoder keys merge pairs by the string
// "a,b" (11 pairs of vocab.bpe collide that way), the ids must still agree.
TEST(TokenizerVsNode, PunctuationRuns) {
  const std::string file = (tmp() / "punct.txt").string();
  const char* pool[] = {"\"", ",", ".", "'", ")", "]", "}", "[", "\n", " "};
  Rng r(17);
  std::string s;
  for (int i = 0; i < 100000; ++i) s += pool[r.below(10)];
  std::ofstream(file, std::ios::binary) << s;
  compare_ids(file);
}

TEST(TokenizerVsNode, EveryCodePointClass) {
  ensure_package();
  const std::string out = (tmp() / "classes.bin").string();
  FILE* p = popen("node -p process.versions.unicode", "r");
  char ver[32] = {};
  if (p) {
    if (!fgets(ver, sizeof ver, p)) ver[0] = 0;
    pclose(p);
  }
  std::string node_ver(ver);
  while (!node_ver.empty() && node_ver.back() == '\n') node_ver.pop_back();
  if (node_ver != unicode_tables_version())
    GTEST_SKIP() << "node has Unicode " << node_ver << ", data/unicode_tables.inc is for "
                 << unicode_tables_version()
                 << ": classes of newly assigned code points may differ (regenerate with "
                    "tools/gen/gen_unicode_tables.js)";
  ASSERT_EQ(sh("node '" ST_NODE_DIR "/gpt2_reference.js' '" + kPkg + "' classes '" + out + "'"), 0);
  const std::string c = slurp(out);
  ASSERT_EQ(c.size(), 0x110000u);
  int64_t differ = 0, counts[4] = {};
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    const CharClass k = unicode_class(cp);
    const char mine = "LNSO"[static_cast<int>(k)];
    ++counts[static_cast<int>(k)];
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    if (mine != c[cp] && differ++ < 5) ADD_FAILURE() << "U+" << std::hex << cp << ": " << mine << " vs node " << c[cp];
  }
  EXPECT_EQ(differ, 0);
  std::printf("  Unicode %s: %lld letters, %lld numbers, %lld spaces; %lld differ from node\n",
              unicode_tables_version(), (long long)counts[0], (long long)counts[1],
              (long long)counts[2], (long long)differ);
}

