// Calibration corpora: reading plain and gzip text, bad input, documents, prose filter, splits.
#include "services/calibrate/corpus.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/model/model.h"
#include "services/calibrate/corpus_kinds.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;

class CorpusFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("riskkv_corpus_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string WritePlain(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::string WriteGzip(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, content.data(), static_cast<unsigned>(content.size())),
              static_cast<int>(content.size()));
    gzclose(f);
    return path;
  }
  std::string ReadBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  fs::path dir_;
};

const char kText[] =
    "Title line\n"
    "   an introduction that is long enough to count as running prose here.\n"
    "   :alpha: n.\n"
    "   The first entry, whose body is a sentence of some length, as prose is.\n"
    "\n"
    "   :beta: adj.\n"
    "   The second entry \xE2\x80\x94 with a dash \xE2\x80\x94 and more words after it.\n"
    "Chapter\xC2\xA0"
    "2. Headings\n"
    "   short\n"
    "   list\n";

TEST_F(CorpusFiles, ReadsPlainAndGzipAlike) {
  auto plain = ReadCorpusText(WritePlain("a.txt", kText));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(*plain, kText);
  auto gz = ReadCorpusText(WriteGzip("a.txt.gz", kText));
  ASSERT_TRUE(gz.ok()) << gz.status();
  EXPECT_EQ(*gz, kText);
}

TEST_F(CorpusFiles, BadFilesAreNamedErrors) {
  auto missing = ReadCorpusText((dir_ / "none.txt").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("none.txt"), std::string_view::npos);

  auto dir = ReadCorpusText(dir_.string());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dir.status().message().find("not a regular file"), std::string_view::npos);

  auto empty = ReadCorpusText(WritePlain("empty.txt", ""));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);

  std::string bad_utf8 = "good text then \xC3( and more";
  auto latin = ReadCorpusText(WritePlain("latin.txt", bad_utf8));
  EXPECT_EQ(latin.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(latin.status().message().find("missing continuation byte at offset 16"),
            std::string_view::npos)
      << latin.status();
  auto cut = ReadCorpusText(WritePlain("cut.txt", "ends inside \xE2\x80"));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  auto surrogate = ReadCorpusText(WritePlain("sur.txt", "a \xED\xA0\x80 b"));
  EXPECT_EQ(surrogate.status().code(), absl::StatusCode::kInvalidArgument);

  std::string big;
  for (int i = 0; i < 2000; ++i) big += "line " + std::to_string(i * 7919 % 1000) + " of text\n";
  const std::string gz = ReadBytes(WriteGzip("big.gz", big));
  ASSERT_GT(gz.size(), 100u);
  auto truncated = ReadCorpusText(WritePlain("trunc.gz", gz.substr(0, gz.size() / 2)));
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss) << truncated.status();
  std::string corrupt = gz;
  for (size_t i = 20; i < 60; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5A);
  auto bad = ReadCorpusText(WritePlain("corrupt.gz", corrupt));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
}

TEST_F(CorpusFiles, KindsReadFilesAndDirectoriesEachFileOnItsOwn) {
  fs::create_directories(dir_ / "kind");
  WritePlain("kind/b.txt", "Doc 3\n   three\nDoc 4\n   four\n");
  WriteGzip("kind/a.txt.gz", "   before any heading\nDoc 1\n   one\n");
  fs::create_symlink(dir_ / "kind" / "b.txt", dir_ / "kind" / "c.txt");  // read once
  fs::create_directories(dir_ / "kind" / "sub");                         // not a file
  auto docs = ReadKindDocuments({"k", (dir_ / "kind").string(), "^Doc "});
  ASSERT_TRUE(docs.ok()) << docs.status();
  // a.txt.gz first (name order), its leading text a document of its own, never joined to b.txt.
  EXPECT_EQ(*docs, (std::vector<std::string>{"   before any heading\n", "Doc 1\n   one\n",
                                             "Doc 3\n   three\n", "Doc 4\n   four\n"}));
  auto one = ReadKindDocuments({"k", (dir_ / "kind" / "b.txt").string(), "^Doc "});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 2u);

  auto missing = ReadKindDocuments({"gone", (dir_ / "nothing.txt").string(), "^Doc "});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("kind 'gone'"), std::string::npos);
  EXPECT_NE(missing.status().message().find("nothing.txt"), std::string::npos);
  WritePlain("kind/bad.txt", std::string("Doc 5\n\xFF\xFE\n"));
  auto bad = ReadKindDocuments({"k", (dir_ / "kind").string(), "^Doc "});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bad.txt"), std::string::npos) << bad.status();
  fs::create_directories(dir_ / "empty");
  auto empty = ReadKindDocuments({"e", (dir_ / "empty").string(), "^Doc "});
  EXPECT_NE(empty.status().message().find("holds no file"), std::string::npos);
}

TEST(CorpusKinds, SpecsNameKindsPathsAndDefaults) {
  auto two = ParseCorpusSpec("a=/x/one.txt,b=/y", "^B");
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].name, "b");
  EXPECT_EQ((*two)[1].path, "/y");
  EXPECT_EQ((*two)[1].boundary, "^B");
  auto defaults = ParseCorpusSpec("legal,mine=/m.txt", "^B");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ((*defaults)[0].path, DefaultCorpus()[1].path);
  EXPECT_EQ((*defaults)[0].boundary, DefaultCorpus()[1].boundary);  // its own
  auto bare = ParseCorpusSpec("/some/file.txt", "^B");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ((*bare)[0].name, "text");
  EXPECT_EQ((*bare)[0].path, "/some/file.txt");
  for (const auto& [spec, needle] :
       std::vector<std::pair<std::string, std::string>>{{"a=/x,a=/y", "'a' named twice"},
                                                        {"a=/x,,b=/y", "'' is neither"},
                                                        {"a=/x,novel", "'novel' is neither"},
                                                        {"=/x", "'=/x' is not KIND=PATH"},
                                                        {"a=", "'a=' is not KIND=PATH"},
                                                        {"bad name=/x", "kind name 'bad name'"}}) {
    auto r = ParseCorpusSpec(spec, "^B");
    ASSERT_FALSE(r.ok()) << spec;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  }
  EXPECT_TRUE(ValidateCorpusKinds(DefaultCorpus()).ok());
  EXPECT_FALSE(ValidateCorpusKinds({}).ok());
}

TEST(Corpus, SplitsDocumentsAtBoundaryLines) {
  auto docs = SplitDocuments(kText, R"(^([A-Za-z]|\s+:[^:]+:))");
  ASSERT_TRUE(docs.ok()) << docs.status();
  ASSERT_EQ(docs->size(), 4u);
  EXPECT_EQ((*docs)[0].rfind("Title line\n", 0), 0u);
  EXPECT_EQ((*docs)[1].rfind("   :alpha:", 0), 0u);
  EXPECT_NE((*docs)[1].find("\n\n"), std::string::npos);  // blank lines stay with their doc
  EXPECT_EQ((*docs)[2].rfind("   :beta:", 0), 0u);
  EXPECT_EQ((*docs)[3].rfind("Chapter", 0), 0u);
  std::string joined;
  for (const auto& d : *docs) joined += d;
  EXPECT_EQ(joined, kText);  // nothing lost, nothing added

  auto one = SplitDocuments(kText, "^never matches$");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);
  auto blank = SplitDocuments("a\n\n  \nb\n", "^.?$");
  ASSERT_TRUE(blank.ok());
  EXPECT_EQ(blank->size(), 2u);  // whitespace-only documents dropped

  auto bad = SplitDocuments(kText, "(unclosed");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string_view::npos);
}

TEST(Corpus, ProseFractionTellsProseFromLists) {
  EXPECT_DOUBLE_EQ(ProseFraction("   short\n   list\n   of words\n"), 0.0);
  EXPECT_DOUBLE_EQ(ProseFraction(""), 0.0);
  const std::string line(50, 'x');
  EXPECT_DOUBLE_EQ(ProseFraction("  " + line + "\n"), 1.0);
  // 50 prose characters and 10 list characters.
  EXPECT_NEAR(ProseFraction(line + "\n  abcdefghij\n"), 50.0 / 60.0, 1e-12);
  // Text tables are not prose, however long their lines.
  EXPECT_DOUBLE_EQ(
      ProseFraction("\xE2\x94\x82 2.1.1 \xE2\x94\x82 Jun 12 1990 \xE2\x94\x82 additions were "
                    "by Eric S. Raymond \xE2\x94\x82\n"),
      0.0);
  EXPECT_DOUBLE_EQ(ProseFraction("1990 5485 42842 278958 790 1990 5485 42842 278958 790\n"), 0.0);
  auto kept = KeepProse({"   a\n   b\n", line + "\n", "x\n" + line + "\n"}, 0.5);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0], line + "\n");
}

TEST(Corpus, SplitsAreDisjointCompleteAndReproducible) {
  std::vector<std::string> docs;
  for (int i = 0; i < 4000; ++i) docs.push_back("doc " + std::to_string(i));
  const auto a = AssignSplits(docs, {0.5, 0.25}, 7);
  const auto b = AssignSplits(docs, {0.5, 0.25}, 7);
  const auto c = AssignSplits(docs, {0.5, 0.25}, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::set<std::string> seen;
  for (const auto& split : a) {
    for (const auto& d : split) EXPECT_TRUE(seen.insert(d).second) << d << " in two splits";
  }
  EXPECT_EQ(seen.size(), docs.size());
  EXPECT_NEAR(static_cast<double>(a[kTrain].size()) / docs.size(), 0.5, 0.04);
  EXPECT_NEAR(static_cast<double>(a[kValidation].size()) / docs.size(), 0.25, 0.04);
  // A document's split depends on its content only: more documents move none of the others,
  // and a duplicate lands beside its original.
  std::vector<std::string> more = docs;
  more.insert(more.begin() + 100, "an inserted document");
  more.push_back("doc 17");
  const auto m = AssignSplits(more, {0.5, 0.25}, 7);
  for (int s = 0; s < 3; ++s) {
    std::vector<std::string> without;
    for (const auto& d : m[s]) {
      if (d != "an inserted document") without.push_back(d);
    }
    const bool has17 = std::count(a[s].begin(), a[s].end(), "doc 17") > 0;
    if (has17) without.pop_back();  // the duplicate, last in the corpus
    EXPECT_EQ(without, a[s]) << SplitName(static_cast<Split>(s));
  }
  // Order within a split follows the corpus.
  for (const auto& split : a) {
    for (size_t i = 1; i < split.size(); ++i) {
      EXPECT_LT(std::stoi(split[i - 1].substr(4)), std::stoi(split[i].substr(4)));
    }
  }
}

TEST(Corpus, TokenizesDocumentsUntilEnough) {
  auto model = Model::Load((testing::TestdataDir() / "tiny_llama.gguf").string(), {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  const Tokenizer& tok = (*model)->tokenizer();
  const std::vector<std::string> docs = {"hello world. ", "a second document. ",
                                         "and a third one. "};
  int64_t used = 0;
  auto all = TokenizeDocuments(tok, docs, 0, &used);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(used, 3);
  std::vector<int32_t> expect;
  for (const auto& d : docs) {
    auto ids = tok.Encode(d, false, false);
    ASSERT_TRUE(ids.ok());
    expect.insert(expect.end(), ids->begin(), ids->end());
  }
  EXPECT_EQ(*all, expect);
  auto first = tok.Encode(docs[0], false, false);
  auto some = TokenizeDocuments(tok, docs, static_cast<int64_t>(first->size()), &used);
  ASSERT_TRUE(some.ok());
  EXPECT_EQ(used, 1);
  EXPECT_EQ(*some, *first);
}

}  // namespace
}  // namespace riskkv
