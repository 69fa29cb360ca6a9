// Wire form names (see wire_form.h).
#include "common/kvcodec/wire_form.h"

#include <string>

namespace riskkv {

std::string_view WireFormName(WireForm form) {
  switch (form) {
    case WireForm::kPlain:
      return "plain";
    case WireForm::kInt8:
      return "int8";
    case WireForm::kInt4:
      return "int4";
    case WireForm::kTransform:
      return "transform";
  }
  return "unknown";
}

absl::StatusOr<WireForm> ParseWireForm(std::string_view name) {
  for (WireForm f : {WireForm::kPlain, WireForm::kInt8, WireForm::kInt4, WireForm::kTransform}) {
    if (name == WireFormName(f)) return f;
  }
  return absl::InvalidArgumentError("wire form '" + std::string(name) +
                                    "' is not plain, int8, int4 or transform");
}

}  // namespace riskkv
