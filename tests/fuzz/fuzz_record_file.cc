// libFuzzer target: the checkpoint file reader (common/record_file.h), which reads files a user
// may hand it from anywhere. The input is the file's body after the magic and version; the target
// frames it and appends its correct CRC-32, so the fuzzer reaches the records rather than the
// checksum. The reader may refuse (onebit::Error); it must not crash, read out of bounds, or hit
// undefined behaviour — and what it accepts must read back by every accessor, whole and as the view
// of rank 0 to 3 (a job's file: rank<r>/ records), picked by the input's first byte.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/record_file.h"

using namespace onebit;

namespace {

// Every record a file lists, got by its kind's accessor.
void read_back(const RecordFile& file) {
  for (const auto& name : file.names()) {
    switch (file.kind(name)) {
      case RecordFile::Kind::kInt: (void)file.get_int(name); break;
      case RecordFile::Kind::kInts: (void)file.get_ints(name); break;
      case RecordFile::Kind::kFloats: (void)file.get_floats(name); break;
      case RecordFile::Kind::kDoubles: (void)file.get_doubles(name); break;
      case RecordFile::Kind::kText: (void)file.get_text(name); break;
      case RecordFile::Kind::kAbsent: __builtin_trap();  // a record it listed is there
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<unsigned char> bytes = {'O', 'N', 'E', 'B', 'I', 'T', 'R', 'F', 1, 0, 0, 0};
  bytes.insert(bytes.end(), data, data + size);
  const std::uint32_t crc = RecordFile::crc32(bytes.data(), bytes.size());
  const auto* crc_bytes = reinterpret_cast<const unsigned char*>(&crc);
  bytes.insert(bytes.end(), crc_bytes, crc_bytes + sizeof crc);
  const int rank = size > 0 ? data[0] % 4 : 0;
  for (const int view : {-1, rank}) {
    try {
      read_back(RecordFile::parse(bytes, "fuzz", view));
    } catch (const Error&) {
    }
  }
  return 0;
}
