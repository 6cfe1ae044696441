// fuzz_indexed_dataset.cpp: libFuzzer target for the .bin/.idx reader. The input is split into an
// .idx part and a .bin part; opening must either succeed (then every sequence reads in bounds) or
// throw DataError, never crash or read out of bounds (run under AddressSanitizer).
#include <cstdint>
#include <string>
#include <vector>

#include "config/errors.h"
#include "data/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t cut = data[0] * 256u + data[1];
  const std::string rest(reinterpret_cast<const char*>(data + 2), size - 2);
  const size_t at = rest.empty() ? 0 : cut % (rest.size() + 1);
  try {
    mt::IndexedDataset d("fuzz", rest.substr(0, at), rest.substr(at));
    std::vector<int32_t> buf;
    for (int64_t i = 0; i < d.num_sequences(); ++i) {
      buf.resize(static_cast<size_t>(d.sequence_length(i)));
      d.read(i, 0, d.sequence_length(i), buf.data());
    }
    for (int64_t k = 0; k <= d.num_documents(); ++k) (void)d.document_index(k);
  } catch (const mt::DataError&) {
  }
  return 0;
}
