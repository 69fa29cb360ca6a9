// A model's identity for the artefacts calibrated on it (predictor banks, retention policies): a
// hash of its hyper-parameters and of every weight byte, so a bank cannot be used with another
// model, or with another quantization or file form of the same one.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model/model.h"

namespace riskkv {

// Lower-case hex SHA-256 (64 characters) of, in this order:
//   1. "riskkv-model-fingerprint v1\n" and the ModelConfig fields that define the computation
//      (architecture, sizes, context length, rms_eps, rope base/dim/layout, tied embeddings,
//      qkv bias) as "key=value\n" lines; doubles in shortest round-trip form. The display name
//      is left out: renaming a model does not change what it computes.
//   2. for each tensor of Model::ForEachWeight, in its fixed order: the line
//      "tensor <name> <dtype> <bytes>\n" followed by the tensor's bytes.
// Deterministic across runs and machines (little-endian hosts). The same weights in GGUF and
// safetensors form usually differ in bytes (layout, dtype), and then get different fingerprints.
// Hashes every weight byte: about as long as reading the model once.
absl::StatusOr<std::string> ModelFingerprint(const Model& model);

}  // namespace riskkv
