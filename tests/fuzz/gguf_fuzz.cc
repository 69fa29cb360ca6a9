// Fuzz target: the GGUF reader (header, metadata, tensor directory) and the tokenizer spec it
// carries, the model config read from it and its tensors' rows, from arbitrary file contents. Every
// input must end in a status, never a crash.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/formats/gguf_file.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto gguf = riskkv::GgufFile::Open(riskkv::fuzz::AsFile(data, size, ".gguf"));
  if (!gguf.ok()) return 0;
  (void)(*gguf)->GetUint("general.alignment");
  (void)(*gguf)->GetString("general.architecture");
  // The hyper-parameters (RoPE scaling and its rope_freqs.weight included), and the first row of
  // every tensor of at most 4,096 values dequantized.
  (void)riskkv::ConfigFromGguf(**gguf);
  std::vector<float> row;
  for (const riskkv::TensorView& t : (*gguf)->tensors()) {
    const int64_t n = t.shape.empty() ? 0 : t.shape.back();
    if (n <= 0 || n > 4096) continue;
    row.resize(static_cast<size_t>(n));
    riskkv::DequantizeRow(t.dtype, t.data, row.data(), n);
  }
  auto spec = riskkv::Tokenizer::SpecFromGguf(**gguf);
  if (!spec.ok()) return 0;
  auto tok = riskkv::Tokenizer::Create(*std::move(spec));
  if (!tok.ok()) return 0;
  auto ids = (*tok)->Encode("Hello, world! 123 \xc3\xa9t\xc3\xa9", /*add_special=*/true,
                            /*parse_special=*/true);
  if (ids.ok()) (void)(*tok)->Decode(*ids);
  return 0;
}
