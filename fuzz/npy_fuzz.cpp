// The .npy reader (--embeddings-file, test fixtures): any input is refused with mambacpp::Error or gives an array
// whose element count matches its shape. Run: ./npy_fuzz -max_len=2048 ../fuzz/corpus/npy
#include <string_view>

#include "fuzz_target.h"
#include "mambacpp/npy.h"

MAMBACPP_FUZZ_TARGET(npy) {
  const mambacpp::NpyArray a = mambacpp::parse_npy(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  MAMBACPP_FUZZ_CHECK(static_cast<size_t>(a.numel()) == a.values.size());
  MAMBACPP_FUZZ_CHECK(a.values.size() <= size);  // never more elements than the input has bytes
}
