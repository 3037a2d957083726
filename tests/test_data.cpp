// Token shards, prepare_data and the loader: llm.c's header and size rule, a shard written
// by an independent writer (Python) read back exactly, every kind of bad shard refused with
// the file named, the train/val split rule, and the loader's determinism, rank sharding and
// exact restore.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "test_util.h"
#include "tokenizer_fixture.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "train/config.h"

namespace fs = std::filesystem;
using namespace st;
using st::test::kVocabDir, st::test::slurp, st::test::tok;

namespace {

const std::string kShakespeare = ST_SHARED_DATA_DIR "/tinyshakespeare.txt";

const fs::path& tmp() { return st::test::scratch_root("st_data_"); }

std::string write(const std::string& name, const std::string& bytes) {
  const std::string p = (tmp() / name).string();
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

using st::test::error_of;

using st::test::Cmd;
Cmd run(const std::string& cmd) { return st::test::run_cmd(cmd, tmp()); }

std::vector<int32_t> shard_tokens(const std::string& path) {
  const std::string b = slurp(path);
  std::vector<int32_t> v;
  for (size_t i = 1024; i + 1 < b.size(); i += 2)
    v.push_back(static_cast<unsigned char>(b[i]) | (static_cast<unsigned char>(b[i + 1]) << 8));
  return v;
}

void expect_llmc_header(const std::string& path, int64_t ntok) {
  const std::string b = slurp(path);
  ASSERT_EQ(static_cast<int64_t>(b.size()), 1024 + 2 * ntok) << path;
  int32_t h[256];
  std::memcpy(h, b.data(), 1024);
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], ntok);
  for (int i = 3; i < 256; ++i) ASSERT_EQ(h[i], 0) << "header int " << i;
}

PrepareOptions options(const std::vector<std::string>& inputs, const std::string& name,
                       const std::string& tokenizer = "gpt2") {
  PrepareOptions o;
  o.inputs = inputs;
  o.tokenizer = tokenizer;
  o.tokenizer_dir = kVocabDir;
  o.train_pattern = (tmp() / (name + "_train_*.bin")).string();
  o.val_pattern = (tmp() / (name + "_val_*.bin")).string();
  o.overwrite = true;
  return o;
}

}  // namespace

// prepare_data's shards: llm.c's header, size rule, EOT before the document, and the split
// at the same byte the byte-level loader uses.
TEST(Prepare, ShardsFollowLlmcFormatAndSplitRule) {
  const std::string text = slurp(kShakespeare);
  const PrepareSummary s = prepare_shards(options({kShakespeare}, "ts"));
  ASSERT_EQ(s.train_shards.size(), 1u);
  ASSERT_EQ(s.val_shards.size(), 1u);
  expect_llmc_header(s.train_shards[0], s.train_tokens);
  expect_llmc_header(s.val_shards[0], s.val_tokens);
  const size_t nval = static_cast<size_t>(text.size() * 0.1);  // the byte-level rule
  const size_t cut = text.size() - nval;
  std::vector<int32_t> want_train{kGpt2EotToken}, want_val{kGpt2EotToken};
  tok().encode(text.substr(0, cut), want_train);
  tok().encode(text.substr(cut), want_val);
  EXPECT_EQ(shard_tokens(s.train_shards[0]), want_train);
  EXPECT_EQ(shard_tokens(s.val_shards[0]), want_val);
  EXPECT_EQ(s.train_bytes, static_cast<int64_t>(cut));
  EXPECT_EQ(s.val_bytes, static_cast<int64_t>(nval));
  std::printf("%s", s.text().c_str());
}

// Cutting a long document into slices for the progress bar (prepare.cpp safe_cut) gives the
// ids of one encode call over the whole text; so does splitting into many shards.
TEST(Prepare, SlicedAndShardedEqualsWhole) {
  const std::string text = slurp(kShakespeare) + slurp(kShakespeare).substr(0, 600000);
  const std::string big = write("big.txt", text);
  PrepareOptions o = options({big}, "big");
  o.val_fraction = 0;
  o.val_pattern.clear();
  o.shard_tokens = 100000;
  const PrepareSummary s = prepare_shards(o);
  std::vector<int32_t> all;
  for (const auto& f : s.train_shards) {
    const auto t = shard_tokens(f);
    expect_llmc_header(f, static_cast<int64_t>(t.size()));
    all.insert(all.end(), t.begin(), t.end());
  }
  std::vector<int32_t> want{kGpt2EotToken};
  tok().encode(text, want);
  EXPECT_EQ(s.train_shards.size(), (want.size() + 99999) / 100000);
  EXPECT_EQ(all, want);
}

TEST(Prepare, DocumentsAndByteTokenizer) {
  const std::string a = write("a.txt", "one\n\ntwo\n\nthree"), b = write("b.txt", "four");
  PrepareOptions o = options({a, b}, "docs");
  o.val_fraction = 0;
  o.val_pattern.clear();
  o.doc_separator = "\n\n";
  const PrepareSummary s = prepare_shards(o);
  EXPECT_EQ(s.documents, 4);
  std::vector<int32_t> want;
  for (const char* d : {"one\n\n", "two\n\n", "three", "four"}) {
    want.push_back(kGpt2EotToken);
    tok().encode(d, want);
  }
  EXPECT_EQ(shard_tokens(s.train_shards[0]), want);

  PrepareOptions ob = options({a, b}, "bytes", "byte");
  ob.val_fraction = 0.25;
  const PrepareSummary sb = prepare_shards(ob);
  EXPECT_EQ(sb.vocab_size, 256);
  const std::string all = slurp(a) + slurp(b);  // 19 bytes: the last 4 are validation
  std::vector<int32_t> tr, va;
  for (size_t i = 0; i < all.size(); ++i) (i < all.size() - 4 ? tr : va).push_back((unsigned char)all[i]);
  EXPECT_EQ(shard_tokens(sb.train_shards[0]), tr);
  EXPECT_EQ(shard_tokens(sb.val_shards[0]), va);
}

TEST(Prepare, NonUtf8TextIsTokenizedLosslessly) {
  const std::string text = "caf\xe9 (Latin-1) and \xff\xfe garbage \xc3 cut\n";
  const std::string p = write("latin1.txt", text);
  PrepareOptions o = options({p}, "latin1");
  o.val_fraction = 0;
  o.val_pattern.clear();
  const PrepareSummary s = prepare_shards(o);
  EXPECT_EQ(s.invalid_utf8_bytes, 4);
  EXPECT_NE(s.text().find("not valid UTF-8"), std::string::npos);
  const auto ids = shard_tokens(s.train_shards[0]);
  EXPECT_EQ(tok().decode(ids.data() + 1, ids.size() - 1), text);
}

// The prepare_data binary: output names, summary, refusal to overwrite, bad inputs.
TEST(Prepare, Binary) {
  const std::string out = (tmp() / "bin").string();
  const std::string base = std::string(ST_PREPARE_BIN) + " --input " + kShakespeare +
                           " --output " + out + " --tokenizer-dir " + kVocabDir;
  Cmd r = run(base);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out + "/tinyshakespeare_train_000000.bin"));
  EXPECT_TRUE(fs::exists(out + "/tinyshakespeare_val_000000.bin"));
  EXPECT_NE(r.out.find("bytes/token"), std::string::npos) << r.out;
  std::printf("%s", r.out.c_str());
  r = run(base);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--overwrite"), std::string::npos) << r.err;
  r = run(std::string(ST_PREPARE_BIN) + " --input " + kShakespeare + " --output " + out +
          " --name x --tokenizer-dir /nonexistent/gpt2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("/nonexistent/gpt2/encoder.json"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  std::printf("  %s", r.err.c_str());
  r = run(std::string(ST_PREPARE_BIN) + " --input /nonexistent.txt --output " + out +
          " --tokenizer-dir " + kVocabDir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("/nonexistent.txt"), std::string::npos) << r.err;
  std::printf("  %s", r.err.c_str());
  r = run(std::string(ST_PREPARE_BIN) + " --input " + kShakespeare + " --output " + out +
          " --name b --tokenizer byte");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("1.000 bytes/token"), std::string::npos) << r.out;
}

// A shard written by a few lines of Python (struct + array) reads back exactly.
TEST(Shards, IndependentPythonWriterReadsBack) {
  const std::string path = (tmp() / "py_shard.bin").string();
  const std::string script =
      "import struct, array, random\n"
      "random.seed(3)\n"
      "toks = [random.randrange(50257) for _ in range(10007)] + [0, 50256]\n"
      "with open('" + path + "', 'wb') as f:\n"
      "    f.write(struct.pack('<256i', 20240520, 1, len(toks), *([0] * 253)))\n"
      "    f.write(struct.pack('<%dH' % len(toks), *toks))\n"
      "print(' '.join(map(str, toks)))\n";
  const std::string py = write("writer.py", script);
  const Cmd r = run("/usr/bin/python3 " + py);
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<int32_t> want;
  std::istringstream in(r.out);
  for (int32_t t; in >> t;) want.push_back(t);
  ASSERT_EQ(want.size(), 10009u);
  const TokenShard s = TokenShard::open(path, kGpt2VocabSize);
  ASSERT_EQ(s.size(), 10009);
  EXPECT_EQ(std::vector<int32_t>(s.tokens(), s.tokens() + s.size()), want);
}

TEST(Shards, BadShardsAreRefusedNamingTheFile) {
  std::vector<uint16_t> t = {1, 2, 3, 50256, 7};
  const std::string good = (tmp() / "good.bin").string();
  write_token_shard(good, t.data(), 5);
  const std::string g = slurp(good);
  struct Case {
    std::string name, bytes, expect;
    int vocab;
  } cases[] = {
      {"truncated.bin", g.substr(0, g.size() - 1), "truncated", 50257},
      {"trailing.bin", g + "xx", "trailing data", 50257},
      {"header_only_part.bin", g.substr(0, 500), "less than the 1024-byte header", 50257},
      {"empty.bin", "", "less than the 1024-byte header", 50257},
      {"magic.bin", "XXXX" + g.substr(4), "not an llm.c token shard", 50257},
      {"version.bin", g.substr(0, 4) + std::string("\x02\0\0\0", 4) + g.substr(8), "version 2", 50257},
      {"range.bin", g, "token 50256 at index 3 is outside the vocabulary of 256", 256},
  };
  for (const Case& c : cases) {
    const std::string p = write(c.name, c.bytes);
    const std::string e = error_of([&] { TokenShard::open(p, c.vocab, "data.train_path"); });
    EXPECT_NE(e.find(p), std::string::npos) << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    std::printf("  %s\n", e.c_str());
  }
  // An llm.c model file given as data: named as such.
  std::string model = g;
  const int32_t mm = 20240326;
  std::memcpy(model.data(), &mm, 4);
  const std::string mp = write("model_as_data.bin", model);
  EXPECT_NE(error_of([&] { TokenShard::open(mp, 0); }).find("llm.c model file"), std::string::npos);
  // A glob that matches nothing, through the dataset loader.
  DataSpec ds;
  ds.train_path = (tmp() / "nothing_*.bin").string();
  ds.val_path = ds.train_path;
  const std::string e = error_of([&] { load_token_data(ds); });
  EXPECT_NE(e.find("no token shard matches"), std::string::npos) << e;
  std::printf("  %s\n", e.c_str());
}

// Byte-level text: train is the first bytes, val the last val_fraction (unchanged rule).
TEST(Dataset, ByteLevelTextSplit) {
  const std::string text = slurp(kShakespeare);
  DataSpec ds;
  ds.train_path = kShakespeare;
  const TokenData d = load_token_data(ds);
  EXPECT_EQ(d.vocab_size, 256);
  const size_t nval = static_cast<size_t>(text.size() * 0.1);
  ASSERT_EQ(d.val.size(), static_cast<int64_t>(nval));
  ASSERT_EQ(d.train.size(), static_cast<int64_t>(text.size() - nval));
  const auto tr = d.train.to_vector();
  const auto va = d.val.to_vector();
  for (size_t i = 0; i < tr.size(); ++i) ASSERT_EQ(tr[i], (unsigned char)text[i]);
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i], (unsigned char)text[tr.size() + i]);
}

// data.prepare_from writes the missing shards once; a second load only reads them.
TEST(Dataset, PrepareFromWritesMissingShards) {
  DataSpec ds;
  ds.train_path = (tmp() / "auto/ts_train_*.bin").string();
  ds.val_path = (tmp() / "auto/ts_val_*.bin").string();
  ds.tokenizer = "gpt2";
  ds.tokenizer_dir = kVocabDir;
  ds.prepare_from = kShakespeare;
  std::vector<std::string> lines;
  const TokenData a = load_token_data(ds, [&](const std::string& l) { lines.push_back(l); });
  EXPECT_FALSE(lines.empty());
  const auto mtime = fs::last_write_time(tmp() / "auto/ts_train_000000.bin");
  lines.clear();
  const TokenData b = load_token_data(ds, [&](const std::string& l) { lines.push_back(l); });
  EXPECT_TRUE(lines.empty());
  EXPECT_EQ(fs::last_write_time(tmp() / "auto/ts_train_000000.bin"), mtime);
  EXPECT_EQ(a.train.to_vector(), b.train.to_vector());
  EXPECT_EQ(a.val.to_vector(), b.val.to_vector());
  EXPECT_EQ(a.train.size() + a.val.size(), 338025 + 2);  // the node count plus two EOTs
  std::printf("  %s\n", b.description.c_str());
}

// The shipped configs parse, and the default one names shards it can prepare.
TEST(Dataset, ShippedConfigsParse) {
  const std::string dir = ST_TEST_DATA_DIR "/../../configs/";
  for (const char* name : {"tiny_shakespeare.yaml", "tiny_shakespeare_bytes.yaml", "gpt2_small.yaml"}) {
    const Config c = load_config(dir + name);
    EXPECT_EQ(c.model.vocab_size, c.data.tokenizer == "gpt2" ? 50257 : 256) << name;
  }
  const Config d = load_config(dir + "tiny_shakespeare.yaml");
  EXPECT_EQ(d.data.tokenizer, "gpt2");
  EXPECT_TRUE(reads_as_shards(d.data.train_path, d.data.format));
  EXPECT_FALSE(d.data.prepare_from.empty());
}

namespace {
TokenSet two_spans() {
  TokenSet s;
  std::vector<uint16_t> a(1000), b(777);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(10000 + i);
  s.add(std::move(a));
  s.add(std::move(b));
  return s;
}
}  // namespace

TEST(Loader, WindowsStayInsideSpansAndCoverAnEpoch) {
  const TokenSet s = two_spans();
  const int B = 4, T = 16;
  DataLoader dl(s, B, T, 9, true);
  EXPECT_EQ(dl.windows_per_epoch(), 999 / 16 + 776 / 16);
  std::vector<int32_t> x(B * T), y(B * T);
  std::set<int32_t> starts;
  for (int64_t i = 0; i < dl.windows_per_epoch() / B; ++i) {
    dl.next(x.data(), y.data());
    for (int b = 0; b < B; ++b) {
      const int32_t* w = &x[b * T];
      for (int t = 1; t < T; ++t) ASSERT_EQ(w[t], w[t - 1] + 1) << "window crosses a span";
      ASSERT_EQ(y[b * T + T - 1], w[T - 1] + 1);
      ASSERT_EQ((w[0] % 10000) % T, 0) << "window not at a multiple of T";
      starts.insert(w[0]);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(starts.size()), dl.windows_per_epoch() / B * B);
}

TEST(Loader, DeterministicAndExactRestore) {
  const TokenSet s = two_spans();
  const int B = 3, T = 8;
  DataLoader a(s, B, T, 42, true), b(s, B, T, 42, true), c(s, B, T, 43, true);
  std::vector<int32_t> xa(B * T), ya(B * T), xb(B * T), yb(B * T), xc(B * T), yc(B * T);
  bool differs = false;
  for (int i = 0; i < 150; ++i) {  // crosses epochs (221 windows per epoch)
    a.next(xa.data(), ya.data());
    b.next(xb.data(), yb.data());
    c.next(xc.data(), yc.data());
    ASSERT_EQ(xa, xb);
    differs |= xa != xc;
  }
  EXPECT_TRUE(differs) << "another seed gave the same order";
  const DataLoader::State st = a.state();
  EXPECT_GT(st.epoch, 0);
  DataLoader r(s, B, T, 42, true);
  r.set_state(st);
  for (int i = 0; i < 100; ++i) {
    a.next(xa.data(), ya.data());
    r.next(xb.data(), yb.data());
    ASSERT_EQ(xa, xb) << "restored loader differs at batch " << i;
  }
}

TEST(Loader, RanksPartitionEachEpochEqually) {
  const TokenSet s = two_spans();
  const int T = 8, world = 3;
  std::set<int32_t> seen;
  int64_t per_rank = -1;
  for (int r = 0; r < world; ++r) {
    DataLoader dl(s, 1, T, 5, true, r, world);
    if (per_rank < 0) per_rank = dl.windows_per_epoch();
    EXPECT_EQ(dl.windows_per_epoch(), per_rank);
    std::vector<int32_t> x(T), y(T);
    for (int64_t i = 0; i < per_rank; ++i) {
      dl.next(x.data(), y.data());
      EXPECT_TRUE(seen.insert(x[0]).second) << "window served to two ranks";
    }
  }
  EXPECT_EQ(per_rank, (999 / 8 + 776 / 8) / world);
  EXPECT_EQ(static_cast<int64_t>(seen.size()), per_rank * world);
}

namespace {

// A byte-level vocabulary of n tokens in `dir` (encoder.json, vocab.bpe): the 256 byte
// tokens at ids 0..255, "ab" (one merge, "a b"), <|endoftext|> at `eot`, fillers elsewhere.
std::string write_vocab(const std::string& name, int n, int eot) {
  const fs::path dir = tmp() / name;
  fs::create_directories(dir);
  const auto b2u = gpt2_byte_to_unicode();
  auto key = [](uint32_t cp) {
    std::string k;
    if (cp < 0x80) k.push_back(static_cast<char>(cp));
    else k += {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
    return k == "\"" ? std::string("\\\"") : k == "\\" ? std::string("\\\\") : k;
  };
  std::string j = "{";
  for (int id = 0; id < n; ++id) {
    const std::string k = id == eot ? "<|endoftext|>" : id < 256 ? key(b2u[id]) : id == 256 ? "ab"
                                                                                         : "t" + std::to_string(id);
    j += (id ? ", \"" : "\"") + k + "\": " + std::to_string(id);
  }
  std::ofstream(dir / "encoder.json", std::ios::binary) << j << "}";
  std::ofstream(dir / "vocab.bpe", std::ios::binary) << "#version: 0.2\na b\n";
  return dir.string();
}

}  // namespace

// Issue 19: a 70,001-token vocabulary made prepare_data store id 70000 as 4464 (uint16 wrap)
// and exit 0. It is refused up front: ids are uint16, a vocabulary holds at most 65536.
TEST(Prepare, VocabularyAboveTheTokenFormatIsRefused) {
  const std::string dir = write_vocab("vocab70001", 70001, 70000);
  const std::string out = (tmp() / "out70001").string();
  const Cmd r = run(std::string(ST_PREPARE_BIN) + " --input " + kShakespeare + " --output " + out +
                    " --tokenizer-dir " + dir);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find(dir + "/encoder.json: a vocabulary of 70001 tokens does not fit the token "
                             "format (ids are stored as uint16: at most 65536 tokens"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out + "/tinyshakespeare_train_000000.bin"));
}

// Issue 19: vocabularies of 50,258..65,536 were accepted by prepare_data and refused by
// train (shards checked against GPT-2's 50257). Now one rule (data/shards.h: kMaxTokenVocab):
// a 65536-token vocabulary, <|endoftext|> = 65535, prepares, loads as shards and as text
// with that vocabulary, and model.vocab_size 65536 is a valid config.
TEST(Dataset, VocabularyRuleAgreesBetweenPrepareAndTrain) {
  const std::string dir = write_vocab("vocab65536", 65536, 65535);
  PrepareOptions o = options({kShakespeare}, "v65536");
  o.tokenizer_dir = dir;
  const PrepareSummary s = prepare_shards(o);
  EXPECT_EQ(s.vocab_size, 65536);
  const auto train = glob_files(o.train_pattern), val = glob_files(o.val_pattern);
  ASSERT_EQ(train.size(), 1u);
  EXPECT_EQ(shard_tokens(train[0]).front(), 65535);  // <|endoftext|> opens the document

  DataSpec ds;
  ds.train_path = o.train_pattern;
  ds.val_path = o.val_pattern;
  ds.tokenizer = "gpt2";
  ds.tokenizer_dir = dir;
  TokenData d = load_token_data(ds);
  EXPECT_EQ(d.vocab_size, 65536);
  EXPECT_EQ(d.train.to_vector().front(), 65535);
  ds.train_path = kShakespeare;  // text, tokenized on load
  ds.val_path.clear();
  d = load_token_data(ds);
  EXPECT_EQ(d.vocab_size, 65536);
  // The config side of the rule.
  EXPECT_EQ(parse_config("model: {vocab_size: 65536}\n", "x.yaml").model.vocab_size, 65536);
  EXPECT_NE(error_of([] { parse_config("model: {vocab_size: 65537}\n", "x.yaml"); })
                .find("between 1 and 65536"),
            std::string::npos);
  // With GPT-2's own files, those shards hold tokens outside its 50257.
  ds.train_path = o.train_pattern;
  ds.val_path = o.val_pattern;
  ds.tokenizer_dir = kVocabDir;
  EXPECT_NE(error_of([&] { load_token_data(ds); }).find("outside the vocabulary of 50257"),
            std::string::npos);
}

// Issue 19: a FIFO as a shard path hung `train` (open() waits for a writer). It is refused
// before it is opened.
TEST(Shards, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = (tmp() / "fifo_train.bin").string();
  fs::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string msg = st::test::error_without_blocking_on_fifo(fifo, [fifo] {
    DataSpec ds;
    ds.train_path = fifo;
    ds.val_path = fifo;
    load_token_data(ds);
  });
  EXPECT_NE(msg.find("data.train_path: " + fifo + ": not a regular file (a FIFO)"), std::string::npos)
      << msg;
  EXPECT_FALSE(is_token_shard(fifo));
  // A directory named like a shard, too.
  const std::string d = (tmp() / "dir_shard.bin").string();
  fs::create_directories(d);
  EXPECT_NE(error_of([&] { TokenShard::open(d, 0); }).find("not a regular file (a directory)"),
            std::string::npos);
}

// Issue 19: running out of memory printed "prepare_data: error: std::bad_alloc". A 400 MB
// (sparse) input under a 300 MB address-space limit now gives one line that says what ran
// out and what to do.
TEST(Prepare, OutOfMemoryIsOneLine) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan reserves more address space than the limit";
#endif
  const fs::path dir = tmp() / "oom";
  fs::create_directories(dir);
  const std::string big = (dir / "big.txt").string();
  { std::ofstream(big, std::ios::binary); }
  ASSERT_EQ(truncate(big.c_str(), 400ll << 20), 0);
  const Cmd r = run("ulimit -v 300000; " + std::string(ST_PREPARE_BIN) + " --input " + big +
                    " --output " + (dir / "out").string() + " --tokenizer byte --quiet");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("prepare_data: error: out of memory while tokenizing", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find("bad_alloc"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  fs::remove(big);
}
