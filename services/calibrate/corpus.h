// Calibration text: a plain or gzip-compressed UTF-8 file (such as a Debian package's
// documentation), cut into documents, each document assigned to exactly one of the train,
// validation and test splits, so no text is shared between fitting, selection and the held-out
// report.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace riskkv {

// Reads a text file, decompressing it when it is gzip (by content, not name). NotFound when it
// does not exist, InvalidArgument when it is not a regular file, DataLoss when the gzip stream is
// corrupt or truncated, InvalidArgument when it is empty or not UTF-8 (the byte offset of the first
// bad sequence is named).
absl::StatusOr<std::string> ReadCorpusText(const std::string& path);

// Cuts `text` into documents: a document starts at every line matching `boundary` (ECMAScript
// regular expression, matched against the line's first 256 bytes without its newline) and runs
// to the next such
// line; text before the first match is a document of its own. Documents that hold only
// whitespace are dropped. InvalidArgument for a malformed pattern.
absl::StatusOr<std::vector<std::string>> SplitDocuments(std::string_view text,
                                                        const std::string& boundary);

// Share of a document's non-blank bytes that sit on lines of running text: at least
// `min_line_chars` bytes, no box-drawing characters, at least 70% letters and spaces. Near 1 for
// prose, near 0 for indexes, word lists, tables of contents and text tables.
double ProseFraction(std::string_view document, size_t min_line_chars = 40);

// Keeps the documents whose ProseFraction is at least `min_fraction` (in order).
std::vector<std::string> KeepProse(std::vector<std::string> documents, double min_fraction);

enum Split { kTrain = 0, kValidation = 1, kTest = 2 };
const char* SplitName(Split split);

struct SplitFractions {
  double train = 0.5;
  double validation = 0.25;  // the test split takes the rest
};

// Assigns each document to a split by a seeded hash of its content: reproducible for a seed, the
// same whatever other documents are added or dropped, and identical documents always land in the
// same split. Documents keep their order within a split.
std::array<std::vector<std::string>, 3> AssignSplits(std::vector<std::string> documents,
                                                     const SplitFractions& fractions,
                                                     uint64_t seed);

// Encodes documents one by one, in order, and concatenates their tokens, stopping once at least
// `want` tokens are collected (0: all). *used receives how many documents were encoded.
absl::StatusOr<std::vector<int32_t>> TokenizeDocuments(const Tokenizer& tokenizer,
                                                       std::span<const std::string> documents,
                                                       int64_t want, int64_t* used);

}  // namespace riskkv
