// Calibration corpora: reading, documents, splits and tokens.
#include "services/calibrate/corpus.h"

#include <zlib.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <regex>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

constexpr size_t kBoundaryPrefix = 256;

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<std::string> ReadCorpusText(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::NotFoundError("no corpus file " + path);
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError("corpus " + path + " is not a regular file");
  }
  // gzread passes non-gzip files through unchanged, so one reader serves both kinds.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> gz(gzopen(path.c_str(), "rb"), &gzclose);
  if (!gz) return absl::NotFoundError("cannot open corpus " + path);
  std::string text;
  char buf[1 << 16];
  while (true) {
    const int n = gzread(gz.get(), buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      const char* msg = gzerror(gz.get(), &err);
      return absl::DataLossError(absl::StrCat("corpus ", path, ": corrupt gzip stream after ",
                                              text.size(), " bytes: ", msg ? msg : "?"));
    }
    if (n == 0) break;
    text.append(buf, n);
  }
  int err = 0;
  gzerror(gz.get(), &err);
  if (err != Z_OK && err != Z_STREAM_END) {
    return absl::DataLossError(
        absl::StrCat("corpus ", path, ": truncated gzip stream after ", text.size(), " bytes"));
  }
  if (text.empty()) return absl::InvalidArgumentError("corpus " + path + " is empty");
  if (absl::Status utf8 = ValidateUtf8(text); !utf8.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("corpus ", path, " is not UTF-8 text: ", std::string(utf8.message())));
  }
  return text;
}

absl::StatusOr<std::vector<std::string>> SplitDocuments(std::string_view text,
                                                        const std::string& boundary) {
  std::regex re;
  try {
    re = std::regex(boundary, std::regex::ECMAScript | std::regex::optimize);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError("document boundary pattern '" + boundary +
                                      "' is not a regular expression: " + e.what());
  }
  std::vector<std::string> docs;
  std::string current;
  auto flush = [&]() {
    if (current.find_first_not_of(" \t\r\n") != std::string::npos) docs.push_back(current);
    current.clear();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    end = end == std::string_view::npos ? text.size() : end + 1;
    std::string_view line = text.substr(pos, end - pos);
    std::string_view bare = line;
    while (!bare.empty() && (bare.back() == '\n' || bare.back() == '\r')) bare.remove_suffix(1);
    // std::regex recurses per character: match a bounded prefix, which is where a heading is.
    if (bare.size() > kBoundaryPrefix) bare = bare.substr(0, kBoundaryPrefix);
    if (std::regex_search(bare.begin(), bare.end(), re)) flush();
    current.append(line);
    pos = end;
  }
  flush();
  return docs;
}

// A line of running text: long enough, no box-drawing characters (U+2500-U+257F, the cells of
// text tables), and mostly letters and spaces.
bool IsProseLine(std::string_view line, size_t min_line_chars) {
  if (line.size() < min_line_chars) return false;
  size_t letters = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    if (c == 0xE2 && i + 1 < line.size() &&
        (static_cast<unsigned char>(line[i + 1]) == 0x94 ||
         static_cast<unsigned char>(line[i + 1]) == 0x95)) {
      return false;
    }
    if (std::isalpha(c) || c == ' ') ++letters;
  }
  return 10 * letters >= 7 * line.size();
}

double ProseFraction(std::string_view document, size_t min_line_chars) {
  size_t total = 0, prose = 0, pos = 0;
  while (pos < document.size()) {
    size_t end = document.find('\n', pos);
    if (end == std::string_view::npos) end = document.size();
    std::string_view line = document.substr(pos, end - pos);
    pos = end + 1;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos) continue;
    line.remove_prefix(first);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) {
      line.remove_suffix(1);
    }
    total += line.size();
    if (IsProseLine(line, min_line_chars)) prose += line.size();
  }
  return total == 0 ? 0.0 : static_cast<double>(prose) / static_cast<double>(total);
}

std::vector<std::string> KeepProse(std::vector<std::string> documents, double min_fraction) {
  std::vector<std::string> out;
  for (std::string& d : documents) {
    if (ProseFraction(d) >= min_fraction) out.push_back(std::move(d));
  }
  return out;
}

const char* SplitName(Split split) {
  switch (split) {
    case kTrain:
      return "train";
    case kValidation:
      return "validation";
    case kTest:
      return "test";
  }
  return "?";
}

std::array<std::vector<std::string>, 3> AssignSplits(std::vector<std::string> documents,
                                                     const SplitFractions& fractions,
                                                     uint64_t seed) {
  std::array<std::vector<std::string>, 3> out;
  for (size_t i = 0; i < documents.size(); ++i) {
    const uint64_t h = SplitMix64(SplitMix64(seed) ^ Fnv1a64(documents[i]));
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
    const Split s = u < fractions.train                          ? kTrain
                    : u < fractions.train + fractions.validation ? kValidation
                                                                 : kTest;
    out[s].push_back(std::move(documents[i]));
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> TokenizeDocuments(const Tokenizer& tokenizer,
                                                       std::span<const std::string> documents,
                                                       int64_t want, int64_t* used) {
  std::vector<int32_t> tokens;
  int64_t n = 0;
  for (const std::string& doc : documents) {
    if (want > 0 && static_cast<int64_t>(tokens.size()) >= want) break;
    auto ids = tokenizer.Encode(doc, /*add_special=*/false, /*parse_special=*/false);
    if (!ids.ok()) return ids.status();
    tokens.insert(tokens.end(), ids->begin(), ids->end());
    ++n;
  }
  if (used) *used = n;
  return tokens;
}

}  // namespace riskkv
