// Reading a corpus of several kinds of text.
#include "services/calibrate/corpus_kinds.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "services/calibrate/corpus.h"

namespace riskkv {
namespace fs = std::filesystem;

std::vector<CorpusKind> DefaultCorpus() {
  return {
      {"lexicon", "/usr/share/doc/jargon-text/jargon.txt.gz", kJargonBoundary},
      // "  0. Definitions.", "1. Definitions", "  2.1. ...", "A. ...", "Section 3".
      {"legal", "/usr/share/common-licenses",
       R"(^\s{0,6}(\d{1,2}(\.\d{1,2})*\.?|[A-Z]\.|Section \d+\.?)\s+\S)"},
      // Section headings start at column 0 with their number ("1.2.8. Named pipes").
      {"manual", "/usr/share/debian-reference/debian-reference.en.txt.gz", R"(^\d+(\.\d+)*\.)"},
  };
}

absl::Status ValidateCorpusKinds(const std::vector<CorpusKind>& kinds) {
  if (kinds.empty()) return absl::InvalidArgumentError("--corpus names no kind of text");
  std::set<std::string> seen;
  for (const CorpusKind& k : kinds) {
    if (k.name.empty() || k.name.size() > 40 ||
        k.name.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
            std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--corpus: kind name '", k.name, "' must be 1-40 of [A-Za-z0-9_-]"));
    }
    if (!seen.insert(k.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("--corpus: kind '", k.name, "' named twice"));
    }
    if (k.path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--corpus: kind '", k.name, "' has no path"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CorpusKind>> ParseCorpusSpec(const std::string& spec,
                                                        const std::string& boundary) {
  const std::vector<CorpusKind> defaults = DefaultCorpus();
  auto find_default = [&](const std::string& name) -> const CorpusKind* {
    for (const CorpusKind& k : defaults) {
      if (k.name == name) return &k;
    }
    return nullptr;
  };
  std::vector<CorpusKind> kinds;
  if (spec.find_first_of("=,") == std::string::npos && find_default(spec) == nullptr) {
    kinds.push_back({"text", spec, boundary});
  } else {
    size_t pos = 0;
    while (pos <= spec.size()) {
      size_t end = spec.find(',', pos);
      if (end == std::string::npos) end = spec.size();
      const std::string entry = spec.substr(pos, end - pos);
      pos = end + 1;
      const size_t eq = entry.find('=');
      if (eq == std::string::npos) {
        const CorpusKind* k = find_default(entry);
        if (k == nullptr) {
          std::string names;
          for (const CorpusKind& d : defaults) names += (names.empty() ? "" : ", ") + d.name;
          return absl::InvalidArgumentError(absl::StrCat(
              "--corpus: '", entry, "' is neither KIND=PATH nor a default kind (", names, ")"));
        }
        kinds.push_back(*k);
        continue;
      }
      if (eq == 0 || eq + 1 == entry.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--corpus: '", entry, "' is not KIND=PATH"));
      }
      kinds.push_back({entry.substr(0, eq), entry.substr(eq + 1), boundary});
    }
  }
  if (absl::Status s = ValidateCorpusKinds(kinds); !s.ok()) return s;
  return kinds;
}

absl::StatusOr<std::vector<std::string>> ReadKindDocuments(const CorpusKind& kind) {
  auto named = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("kind '", kind.name, "': ", s.message()));
  };
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(kind.path, ec)) {
    std::set<fs::path> seen;
    std::vector<fs::path> entries;
    for (const fs::directory_entry& e : fs::directory_iterator(kind.path, ec)) {
      entries.push_back(e.path());
    }
    if (ec) return named(absl::InvalidArgumentError("cannot list " + kind.path));
    std::sort(entries.begin(), entries.end());
    for (const fs::path& p : entries) {
      if (!fs::is_regular_file(p, ec)) continue;
      if (seen.insert(fs::canonical(p, ec)).second) files.push_back(p.string());
    }
    if (files.empty()) {
      return named(absl::InvalidArgumentError("directory " + kind.path + " holds no file"));
    }
  } else {
    files.push_back(kind.path);
  }
  std::vector<std::string> docs;
  for (const std::string& file : files) {
    auto text = ReadCorpusText(file);
    if (!text.ok()) return named(text.status());
    auto cut = SplitDocuments(*text, kind.boundary);
    if (!cut.ok()) return named(cut.status());
    for (std::string& d : *cut) docs.push_back(std::move(d));
  }
  return docs;
}

}  // namespace riskkv
