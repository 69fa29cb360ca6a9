// riskkv-calibrate's inputs: the options' quick sizes and validation, and the explicit candidate
// group list of --groups.
#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/calibrate/calibrate.h"

namespace riskkv {

void CalibrateOptions::MakeQuick() {
  // Per kind of text (three by default): 3 training, 2 selection, 2 confirmation, 2 test.
  const int kinds = std::max<int>(1, static_cast<int>(corpus.size()));
  history = 128;
  eval = 64;
  train = 3 * kinds;
  validation = 2 * kinds;
  confirm = 2 * kinds;
  test = 2 * kinds;
  noise_requests = 2;
  noise_draws = 1;
  bootstrap_resamples = 500;
}

absl::Status CalibrateOptions::Validate() const {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (history < 1) return bad(absl::StrCat("--history must be >= 1, got ", history));
  if (eval < 1) return bad(absl::StrCat("--eval-tokens must be >= 1, got ", eval));
  if (train < 1) return bad(absl::StrCat("--train must be >= 1, got ", train));
  if (validation < 2) return bad(absl::StrCat("--validation must be >= 2, got ", validation));
  if (confirm < 0 || confirm == 1)
    return bad(absl::StrCat("--confirm must be 0 or >= 2, got ", confirm));
  if (gate == Gate::kStableSplit && confirm < 2)
    return bad("the stable-split gate needs --confirm >= 2");
  if (test < 2) return bad(absl::StrCat("--test must be >= 2, got ", test));
  if (noise_requests < 0 || noise_requests > validation)
    return bad(absl::StrCat("--noise-requests must be in [0, --validation], got ", noise_requests));
  if (noise_draws < 1) return bad(absl::StrCat("--noise-draws must be >= 1, got ", noise_draws));
  if (!(epsilon >= 0.0) || !std::isfinite(epsilon))
    return bad(absl::StrCat("--epsilon must be a finite number >= 0, got ", epsilon));
  if (!(fractions.train > 0.0) || !(fractions.validation > 0.0) ||
      !(fractions.train + fractions.validation < 1.0)) {
    return bad(absl::StrCat("split fractions train ", fractions.train, " and validation ",
                            fractions.validation, " must be > 0 and leave room for test"));
  }
  if (!(min_prose >= 0.0 && min_prose <= 1.0))
    return bad(absl::StrCat("--min-prose must be in [0, 1], got ", min_prose));
  if (bootstrap_resamples < 100 || bootstrap_resamples > 1000000)
    return bad(absl::StrCat("--bootstrap must be in [100, 1000000], got ", bootstrap_resamples));
  if (exhaustive_max_groups < 1 || exhaustive_max_groups > 16)
    return bad(
        absl::StrCat("--exhaustive-max-groups must be in [1, 16], got ", exhaustive_max_groups));
  if (absl::Status s = ValidateCorpusKinds(corpus); !s.ok()) return s;
  // Every kind needs requests of its own in every set its statistics are taken on.
  const int kinds = static_cast<int>(corpus.size());
  if (train < kinds)
    return bad(absl::StrCat("--train ", train, " gives no request to some of the ", kinds,
                            " kinds of text"));
  if (validation < 2 * kinds || test < 2 * kinds || (confirm > 0 && confirm < 2 * kinds)) {
    return bad(absl::StrCat("--validation ", validation, ", --test ", test, " and --confirm ",
                            confirm, " must each give every one of the ", kinds,
                            " kinds of text at least 2 requests (--confirm may be 0)"));
  }
  if (bank_dtype != DType::kF16 && bank_dtype != DType::kF32) return bad("bank dtype: f16 or f32");
  if (kv_dtype != DType::kF16 && kv_dtype != DType::kF32) return bad("KV dtype: f16 or f32");
  if (wire_forms.empty()) return bad("--wire-forms names no form");
  if (!(transform_step > 0.0) || !(transform_step <= kMaxTransformStep)) {
    return bad("--transform-step: a step ratio in (0, 64]");
  }
  for (size_t i = 0; i < wire_forms.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (wire_forms[i] == wire_forms[j]) {
        return bad("--wire-forms names " + std::string(WireFormName(wire_forms[i])) + " twice");
      }
    }
  }
  return rule.Validate();
}

absl::StatusOr<std::vector<LayerGroup>> ParseGroupList(const std::string& text) {
  std::vector<LayerGroup> out;
  auto bad = [&](const std::string& part, const char* why) {
    return absl::InvalidArgumentError("--groups: '" + part + "' " + why +
                                      " (expected TARGETS:ANCHORS like 4-5:3,6)");
  };
  auto number = [](const std::string& s, int32_t* v) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    *v = static_cast<int32_t>(std::stol(s));
    return true;
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(pos, end - pos);
    pos = end + 1;
    if (part.empty()) {
      if (end == text.size()) break;
      return bad(part, "is empty");
    }
    const size_t colon = part.find(':');
    if (colon == std::string::npos) return bad(part, "has no ':'");
    const std::string targets = part.substr(0, colon), anchors = part.substr(colon + 1);
    LayerGroup g;
    const size_t dash = targets.find('-');
    int32_t a = 0, b = 0;
    if (!number(targets.substr(0, dash), &a) ||
        (dash != std::string::npos && !number(targets.substr(dash + 1), &b))) {
      return bad(part, "has targets that are not a layer or a range of layers");
    }
    if (dash == std::string::npos) b = a;
    if (b < a) return bad(part, "has a descending target range");
    for (int32_t l = a; l <= b; ++l) g.targets.push_back(l);
    size_t ap = 0;
    while (ap <= anchors.size()) {
      size_t ae = anchors.find(',', ap);
      if (ae == std::string::npos) ae = anchors.size();
      int32_t v = 0;
      if (!number(anchors.substr(ap, ae - ap), &v))
        return bad(part, "has an anchor that is not a layer");
      g.anchors.push_back(v);
      ap = ae + 1;
    }
    out.push_back(std::move(g));
  }
  if (out.empty()) return absl::InvalidArgumentError("--groups lists no group");
  return out;
}

}  // namespace riskkv
