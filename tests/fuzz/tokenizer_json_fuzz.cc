// Fuzz target: a Hugging Face tokenizer.json (model, merges, pre-tokenizer, special tokens), then
// encoding and decoding text with what it describes.
#include <cstddef>
#include <cstdint>

#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto spec =
      riskkv::Tokenizer::SpecFromTokenizerJson(riskkv::fuzz::AsFile(data, size, "-tokenizer.json"));
  if (!spec.ok()) return 0;
  auto tok = riskkv::Tokenizer::Create(*std::move(spec));
  if (!tok.ok()) return 0;
  for (const char* text : {"Hello, world!", " \n\t 12345 ", "\xe4\xbd\xa0\xe5\xa5\xbd <s></s>"}) {
    auto ids = (*tok)->Encode(text, /*add_special=*/true, /*parse_special=*/true);
    if (ids.ok()) (void)(*tok)->Decode(*ids);
  }
  return 0;
}
