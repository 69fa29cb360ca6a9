// A calibration corpus of several kinds of text (a lexicon, licences, a manual, ...): each kind
// is read from a file or a directory of files and cut into documents at its own boundary, so
// that selection can bound the damage on every kind, not only on the average text.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace riskkv {

struct CorpusKind {
  std::string name;      // [A-Za-z0-9_-]+, unique within a corpus
  std::string path;      // a UTF-8 file (plain or gzip), or a directory of such files
  std::string boundary;  // ECMAScript pattern matching a document's first line
};

// Lines that start a document in the Jargon File (Debian package jargon-text): lexicon entries
// (an indented ":term:") and headings (chapters, appendices and their sections start at column 0;
// body text is indented).
inline constexpr char kJargonBoundary[] = R"(^([A-Za-z]|\s+:[^:]+:))";

// The default corpus, from Debian packages deploy/setup.sh installs: the Jargon File
// (jargon-text, a lexicon), the licences in /usr/share/common-licenses (base-files, legal text,
// cut at numbered sections) and the Debian Reference (debian-reference-en, a technical manual,
// cut at numbered section headings).
std::vector<CorpusKind> DefaultCorpus();

// Parses --corpus: comma-separated entries, each KIND=PATH (cut at `boundary`) or the name of a
// default kind (with its own path and boundary), or a single PATH (one kind, "text", cut at
// `boundary`). InvalidArgument naming the entry for an empty or malformed entry, a bad kind name
// or a kind named twice.
absl::StatusOr<std::vector<CorpusKind>> ParseCorpusSpec(const std::string& spec,
                                                        const std::string& boundary);

// Checks names (well formed, unique) and that the list is not empty.
absl::Status ValidateCorpusKinds(const std::vector<CorpusKind>& kinds);

// Reads a kind's documents: the file's, or those of every regular file in the directory (in
// name order, a file reached twice through links read once), each file cut at the kind's
// boundary on its own so that no document spans two files. Errors name the kind and the file.
absl::StatusOr<std::vector<std::string>> ReadKindDocuments(const CorpusKind& kind);

}  // namespace riskkv
