// Cutting the calibration's request sets from a corpus of several kinds of text.
#include "services/calibrate/requests.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/recovery/calibration.h"
#include "services/calibrate/corpus.h"

namespace riskkv {

int KindShare(int total, int n_kinds, int kind) {
  return total / n_kinds + (kind < total % n_kinds ? 1 : 0);
}

absl::StatusOr<RequestSets> MakeRequestSets(const Tokenizer& tokenizer, const CalibrateOptions& o,
                                            CalibrationResult* res) {
  const int n_kinds = static_cast<int>(o.corpus.size());
  std::vector<std::vector<std::string>> kind_docs;
  for (const CorpusKind& kind : o.corpus) {
    ASSIGN_OR_RETURN(std::vector<std::string> docs, ReadKindDocuments(kind));
    kind_docs.push_back(std::move(docs));
  }
  struct Part {
    Split split;
    int wanted;
    const char* name;
  };
  const std::array<Part, 4> parts = {{{kTrain, o.train, "train"},
                                      {kValidation, o.validation, "selection"},
                                      {kValidation, o.confirm, "confirmation"},
                                      {kTest, o.test, "test"}}};
  const int64_t len = o.history + o.eval;
  // per_kind[set][kind]: that kind's requests of the set.
  std::array<std::vector<std::vector<Request>>, 4> per_kind;
  for (auto& p : per_kind) p.resize(n_kinds);
  res->kinds.clear();
  res->corpus = {};
  res->splits = {};
  for (int k = 0; k < n_kinds; ++k) {
    const CorpusKind& kind = o.corpus[k];
    KindStats ks{kind, {}, {}};
    ks.corpus.documents = static_cast<int64_t>(kind_docs[k].size());
    std::vector<std::string> docs = KeepProse(std::move(kind_docs[k]), o.min_prose);
    ks.corpus.dropped = ks.corpus.documents - static_cast<int64_t>(docs.size());
    if (docs.size() < 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kind '", kind.name, "' (", kind.path, ") has ", docs.size(),
          " document(s) of prose under the boundary pattern '", kind.boundary, "' (",
          ks.corpus.dropped, " dropped by --min-prose); three splits need at least 3"));
    }
    auto splits = AssignSplits(std::move(docs), o.fractions, o.seed);
    std::array<int64_t, 3> next_doc = {0, 0, 0};
    for (int s = 0; s < 3; ++s) ks.splits[s].documents = static_cast<int64_t>(splits[s].size());
    for (size_t i = 0; i < parts.size(); ++i) {
      const Part& part = parts[i];
      const int wanted = KindShare(part.wanted, n_kinds, k);
      if (wanted == 0) continue;
      SplitStats& st = ks.splits[part.split];
      const auto docs_left = std::span<const std::string>(splits[part.split])
                                 .subspan(static_cast<size_t>(next_doc[part.split]));
      int64_t used = 0;
      ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                       TokenizeDocuments(tokenizer, docs_left, wanted * len, &used));
      next_doc[part.split] += used;
      st.documents_used += used;
      st.tokens += static_cast<int64_t>(tokens.size());
      per_kind[i][k] = MakeRequests(tokens, o.history, o.eval, wanted);
      st.requests += static_cast<int>(per_kind[i][k].size());
      if (static_cast<int>(per_kind[i][k].size()) < wanted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "kind '", kind.name, "' (", kind.path, "): the ", SplitName(part.split), " split has ",
            docs_left.size(), " documents left for ", part.name, " requests, giving ",
            tokens.size(), " tokens: ", per_kind[i][k].size(), " requests of ", len, " tokens, ",
            wanted, " needed; use more text of this kind, shorter requests or fewer of them"));
      }
    }
    res->corpus.documents += ks.corpus.documents;
    res->corpus.dropped += ks.corpus.dropped;
    for (int s = 0; s < 3; ++s) {
      res->splits[s].documents += ks.splits[s].documents;
      res->splits[s].documents_used += ks.splits[s].documents_used;
      res->splits[s].tokens += ks.splits[s].tokens;
      res->splits[s].requests += ks.splits[s].requests;
    }
    res->kinds.push_back(std::move(ks));
  }
  RequestSets out;
  for (size_t i = 0; i < parts.size(); ++i) {
    for (size_t r = 0;; ++r) {
      bool any = false;
      for (int k = 0; k < n_kinds; ++k) {
        if (r >= per_kind[i][k].size()) continue;
        out.requests[i].push_back(std::move(per_kind[i][k][r]));
        out.kinds[i].push_back(k);
        any = true;
      }
      if (!any) break;
    }
  }
  return out;
}

}  // namespace riskkv
