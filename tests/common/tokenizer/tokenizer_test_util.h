// Test helpers for the tokenizer tests: specs from the generated gguf_tokenizer.json files, those
// specs written out as real GGUF metadata, and a readable diff of two id sequences.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace riskkv::testing {

// Reads and parses a JSON file; fails the current test on error (returns null JSON then).
nlohmann::json ReadJsonFile(const std::filesystem::path& path);

// The TokenizerSpec that the tokenizer.ggml.* values of `gguf_json` describe, built directly
// (no GGUF reader involved); eog ids as llama.cpp would derive them.
absl::StatusOr<TokenizerSpec> SpecFromGgufJson(const nlohmann::json& gguf_json);

// Writes the tokenizer.ggml.* values of `gguf_json` as the metadata of a GGUF file (no tensors)
// in a per-process temp dir; returns its path.
std::string WriteTokenizerGguf(const std::string& name, const nlohmann::json& gguf_json);

// "" when equal, else where the sequences first differ with a few ids of context.
std::string DescribeIdMismatch(const std::vector<int32_t>& expected,
                               const std::vector<int32_t>& actual);

}  // namespace riskkv::testing
