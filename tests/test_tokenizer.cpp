// GPT-2 tokenizer: known ids, pre-tokenization rules, round trips on any bytes, the two BPE
// paths agreeing, and bad vocabulary files. (Ids against the independent node encoder:
// test_tokenizer_node.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "tokenizer_fixture.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;
using namespace st;
using st::test::kVocabDir, st::test::slurp, st::test::tok;

namespace {


std::vector<std::string> pieces(const std::string& s) {
  std::vector<std::string_view> v;
  gpt2_pretokenize(s, v);
  return std::vector<std::string>(v.begin(), v.end());
}

using st::test::error_of;

using V = std::vector<int32_t>;
using S = std::vector<std::string>;

}  // namespace

TEST(Tokenizer, VocabularyShape) {
  EXPECT_EQ(tok().vocab_size(), kGpt2VocabSize);
  EXPECT_EQ(tok().eot(), kGpt2EotToken);
  EXPECT_EQ(tok().num_merges(), 50000u);
  EXPECT_EQ(tok().token_bytes(kGpt2EotToken), "<|endoftext|>");
  EXPECT_EQ(tok().token_bytes(198), "\n");
  EXPECT_EQ(tok().token_bytes(220), " ");
}

TEST(Tokenizer, ByteToUnicodeIsGpt2s) {
  const auto m = gpt2_byte_to_unicode();
  EXPECT_EQ(m['!'], uint32_t('!'));
  EXPECT_EQ(m[' '], 0x120u);   // 'Ġ'
  EXPECT_EQ(m['\n'], 0x10au);  // 'Ċ'
  EXPECT_EQ(m[0], 0x100u);
  EXPECT_EQ(m[0xad], 0x143u);  // the last non-printable byte
  EXPECT_EQ(m[0xff], 0xffu);
}

// Ids from OpenAI's GPT-2 tokenizer (tiktoken "gpt2" gives the same).
TEST(Tokenizer, KnownIds) {
  EXPECT_EQ(tok().encode("Hello world"), (V{15496, 995}));
  EXPECT_EQ(tok().encode(" Hello"), (V{18435}));
  EXPECT_EQ(tok().encode("\n\n"), (V{628}));
  EXPECT_EQ(tok().encode("First Citizen:\nBefore"), (V{5962, 22307, 25, 198, 8421}));
  // Special-token text is ordinary text.
  const V eot_text = tok().encode("<|endoftext|>");
  EXPECT_GT(eot_text.size(), 1u);
  EXPECT_EQ(std::count(eot_text.begin(), eot_text.end(), kGpt2EotToken), 0);
  EXPECT_EQ(tok().decode(eot_text), "<|endoftext|>");
}

TEST(Tokenizer, PretokenizationRules) {
  EXPECT_EQ(pieces("Hello world"), (S{"Hello", " world"}));
  EXPECT_EQ(pieces("don't we're I'll"), (S{"don", "'t", " we", "'re", " I", "'ll"}));
  EXPECT_EQ(pieces("IT'S"), (S{"IT", "'", "S"}));
  EXPECT_EQ(pieces("x'S"), (S{"x", "'", "S"}));  // contractions are lower-case only
  EXPECT_EQ(pieces("a  b"), (S{"a", " ", " b"}));
  EXPECT_EQ(pieces("a   \n\nb"), (S{"a", "   \n", "\n", "b"}));
  EXPECT_EQ(pieces("end   "), (S{"end", "   "}));
  EXPECT_EQ(pieces("x\ny"), (S{"x", "\n", "y"}));
  EXPECT_EQ(pieces("abc123 456!?"), (S{"abc", "123", " 456", "!?"}));
  EXPECT_EQ(pieces(" !! ?"), (S{" !!", " ?"}));
  EXPECT_EQ(pieces(" 's"), (S{" '", "s"}));
  EXPECT_EQ(pieces("café ½ 中文"), (S{"café", " ½", " 中文"}));
  EXPECT_EQ(pieces("a\u3000b"), (S{"a", "\u3000", "b"}));   // ideographic space is \s
  EXPECT_EQ(pieces("a\u00a0b"), (S{"a", "\u00a0", "b"}));   // only U+0020 joins a word
  EXPECT_EQ(pieces("a\u0085b"), (S{"a", "\u0085", "b"}));   // NEL is not \s in JavaScript
  EXPECT_EQ(pieces("e\u0301x"), (S{"e", "\u0301", "x"}));   // combining marks are not \p{L}
  EXPECT_EQ(pieces(""), S{});
}

TEST(Tokenizer, UnicodeClasses) {
  EXPECT_EQ(unicode_class('a'), CharClass::Letter);
  EXPECT_EQ(unicode_class(0xe9), CharClass::Letter);    // é
  EXPECT_EQ(unicode_class(0x4e2d), CharClass::Letter);  // 中
  EXPECT_EQ(unicode_class(0x1d400), CharClass::Letter); // 𝐀
  EXPECT_EQ(unicode_class('7'), CharClass::Number);
  EXPECT_EQ(unicode_class(0x663), CharClass::Number);   // ٣
  EXPECT_EQ(unicode_class(0xbd), CharClass::Number);    // ½
  EXPECT_EQ(unicode_class(0x216b), CharClass::Number);  // Ⅻ
  EXPECT_EQ(unicode_class('\t'), CharClass::Space);
  EXPECT_EQ(unicode_class(0xfeff), CharClass::Space);
  EXPECT_EQ(unicode_class(0x2029), CharClass::Space);
  EXPECT_EQ(unicode_class(0x85), CharClass::Other);
  EXPECT_EQ(unicode_class(0x200b), CharClass::Other);   // zero-width space is not \s
  EXPECT_EQ(unicode_class(0x1f600), CharClass::Other);  // 😀
}

TEST(Tokenizer, InvalidUtf8IsKeptByteForByte) {
  const std::string bad = "ok \xff\xfe x\xc3(\xed\xa0\x80 \xf0\x9f\x98 end\x80";
  EXPECT_EQ(invalid_utf8_bytes(bad), 10);  // ff fe c3 | ed a0 80 | f0 9f 98 | 80
  EXPECT_EQ(invalid_utf8_bytes("naïve 中文 😀"), 0);
  EXPECT_EQ(pieces("a\xff\xfe b"), (S{"a", "\xff\xfe", " b"}));
  EXPECT_EQ(tok().decode(tok().encode(bad)), bad);
}

TEST(Tokenizer, RoundTripTinyShakespeareAndTestText) {
  for (const std::string& path : {std::string(ST_SHARED_DATA_DIR "/tinyshakespeare.txt"),
                                 std::string(ST_TEST_DATA_DIR "/tokenizer_text.txt")}) {
    const std::string text = slurp(path);
    ASSERT_FALSE(text.empty()) << path;
    const V ids = tok().encode(text);
    EXPECT_EQ(tok().decode(ids), text) << path;
    std::printf("  %s: %zu bytes -> %zu tokens\n", fs::path(path).filename().c_str(), text.size(),
                ids.size());
  }
}

TEST(Tokenizer, RoundTripRandomBytesAndCodePoints) {
  Rng r(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = 1 + static_cast<int>(r.below(300));
    for (int i = 0; i < n; ++i) {
      if (trial % 2) {
        s.push_back(static_cast<char>(r.below(256)));  // arbitrary bytes
      } else {  // arbitrary code points (no surrogates), UTF-8 encoded
        uint32_t cp = static_cast<uint32_t>(r.below(r.below(4) ? 0x3000 : 0x110000));
        if (cp >= 0xd800 && cp <= 0xdfff) cp = ' ';
        if (cp < 0x80) s.push_back(static_cast<char>(cp));
        else if (cp < 0x800) s += {char(0xc0 | (cp >> 6)), char(0x80 | (cp & 0x3f))};
        else if (cp < 0x10000)
          s += {char(0xe0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3f)), char(0x80 | (cp & 0x3f))};
        else
          s += {char(0xf0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3f)),
                char(0x80 | ((cp >> 6) & 0x3f)), char(0x80 | (cp & 0x3f))};
      }
    }
    std::string joined;
    for (const auto& p : pieces(s)) joined += p;
    ASSERT_EQ(joined, s) << "pre-tokens do not cover the text, trial " << trial;
    ASSERT_EQ(tok().decode(tok().encode(s)), s) << "trial " << trial;
  }
}

// The heap-driven BPE for long pieces and encoder.py's loop give the same ids.
TEST(Tokenizer, LongAndShortBpeAgree) {
  std::vector<std::string> words;
  const std::string text = slurp(ST_SHARED_DATA_DIR "/tinyshakespeare.txt").substr(0, 200000);
  for (const auto& p : pieces(text)) words.push_back(p);
  Rng r(11);
  const char* alphabet[] = {"a", "b", "e", "th", "in", " ", "\n", "'", "0", "1", "é", "中"};
  for (int i = 0; i < 300; ++i) {
    std::string w;
    const int n = 1 + static_cast<int>(r.below(i < 100 ? 20 : 400));
    for (int k = 0; k < n; ++k) w += alphabet[r.below(12)];
    words.push_back(w);
  }
  words.push_back(std::string(1000, 'a'));
  words.push_back(std::string(1000, ' '));
  size_t checked = 0;
  for (const std::string& w : words) {
    V a, b;
    tok().bpe(w, a, false);
    tok().bpe(w, b, true);
    ASSERT_EQ(a, b) << "'" << w << "'";
    ++checked;
  }
  std::printf("  %zu pieces\n", checked);
}

TEST(Tokenizer, BadVocabularyFiles) {
  const fs::path dir = fs::temp_directory_path() / ("st_tok_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string e = error_of([&] { Gpt2Tokenizer t((dir / "missing").string()); });
  EXPECT_NE(e.find("encoder.json"), std::string::npos) << e;
  EXPECT_NE(e.find((dir / "missing").string()), std::string::npos) << e;
  std::printf("  missing: %s\n", e.c_str());

  const std::string enc = (dir / "encoder.json").string(), bpe = (dir / "vocab.bpe").string();
  fs::copy_file(kVocabDir + "/vocab.bpe", bpe);
  std::ofstream(enc) << "{\"a\": 0, oops";
  e = error_of([&] { Gpt2Tokenizer t(enc, bpe); });
  EXPECT_NE(e.find("not a JSON object"), std::string::npos) << e;
  EXPECT_NE(e.find(enc), std::string::npos) << e;
  std::printf("  corrupt json: %s\n", e.c_str());

  // A vocabulary without most tokens: the merges name tokens it lacks.
  std::ofstream(enc, std::ios::trunc) << "{\"<|endoftext|>\": 0}";
  e = error_of([&] { Gpt2Tokenizer t(enc, bpe); });
  EXPECT_NE(e.find("no token for byte"), std::string::npos) << e;
  std::printf("  not byte-level: %s\n", e.c_str());

  fs::copy_file(kVocabDir + "/encoder.json", enc, fs::copy_options::overwrite_existing);
  std::ofstream(bpe, std::ios::trunc) << "#version: 0.2\nĠ t\nzzzq qqqz\n";
  e = error_of([&] { Gpt2Tokenizer t(enc, bpe); });
  EXPECT_NE(e.find(bpe + ":3"), std::string::npos) << e;
  std::printf("  bad merge: %s\n", e.c_str());
  fs::remove_all(dir);
}

// Issue 19: a vocab.bpe cut mid-line ("Ġre gard" -> "Ġre g", still a valid-looking pair) or
// cut after a single token was accepted, and a truncated encoder.json gave no position. A
// last line without its newline is refused, naming file:line; a truncated encoder.json
// says so; binary content is quoted escaped and short.
TEST(Tokenizer, TruncatedVocabularyFilesAreRefused) {
  const fs::path dir = st::test::make_scratch_dir("st_tok_trunc_");
  const std::string enc = (dir / "encoder.json").string(), bpe = (dir / "vocab.bpe").string();
  fs::copy_file(kVocabDir + "/encoder.json", enc);
  const std::string full = slurp(kVocabDir + "/vocab.bpe");
  ASSERT_EQ(full.back(), '\n');
  const size_t last_line = std::count(full.begin(), full.end(), '\n');
  // Cut inside the last merge's second token, and after the first token of it.
  const size_t start = full.rfind('\n', full.size() - 2) + 1;
  const size_t sp = full.find(' ', start);
  for (const std::string& cut : {full.substr(0, full.size() - 2), full.substr(0, sp + 2),
                                 full.substr(0, sp), full.substr(0, full.size() - 1)}) {
    std::ofstream(bpe, std::ios::binary | std::ios::trunc) << cut;
    const std::string e = error_of([&] { Gpt2Tokenizer t(enc, bpe); });
    EXPECT_NE(e.find(bpe + ":" + std::to_string(last_line) + ": the last line"), std::string::npos) << e;
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  }
  // Intact, it loads.
  std::ofstream(bpe, std::ios::binary | std::ios::trunc) << full;
  EXPECT_NO_THROW(Gpt2Tokenizer t(enc, bpe));

  const std::string json = slurp(kVocabDir + "/encoder.json");
  std::ofstream(enc, std::ios::binary | std::ios::trunc) << json.substr(0, json.size() / 2);
  std::string e = error_of([&] { Gpt2Tokenizer t(enc, bpe); });
  EXPECT_NE(e.find(enc + ": not a JSON object of token -> id: invalid JSON at byte"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  // Binary content is escaped in the message.
  std::ofstream(enc, std::ios::binary | std::ios::trunc) << "{\"\\u0001x\": -5}";
  e = error_of([&] { Gpt2Tokenizer t(enc, bpe); });
  EXPECT_NE(e.find("token '\\x01x' has id -5"), std::string::npos) << e;
  for (char ch : e) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << e;

  // A directory in place of vocab.bpe.
  fs::copy_file(kVocabDir + "/encoder.json", enc, fs::copy_options::overwrite_existing);
  fs::remove(bpe);
  fs::create_directories(bpe);
  e = error_of([&] { Gpt2Tokenizer t(enc, bpe); });
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  fs::remove_all(dir);
}
