// tokenizer.json loading (every normalizer, pre-tokenizer, decoder, post-processor and the BPE model): any input is
// refused with mambacpp::Error, or gives a tokenizer that encodes and decodes a fixed text without failing in any
// other way. Run: ./tokenizer_json_fuzz -max_len=65536 ../fuzz/corpus/tokenizer_json
#include "fuzz_files.h"
#include "fuzz_target.h"
#include "mambacpp/tokenizer.h"

MAMBACPP_FUZZ_TARGET(tokenizer_json) {
  static mambacpp::fuzz::MemFile file;
  const auto tok = mambacpp::Tokenizer::load(file.write(data, size));
  const std::vector<int32_t> ids = tok->encode("Hello, world! 12 \xC3\xA9t\xC3\xA9  <s>\n", true);
  for (int32_t id : ids) MAMBACPP_FUZZ_CHECK(id >= 0 && id < tok->vocab_size());
  (void)tok->decode(ids);
  (void)tok->decode(ids, /*skip_special=*/true);
}
