// A file of named records: what one rank of an optimizer keeps in a checkpoint, in one format that
// the C++ and the Python shims both write and read (onebit.h, "Checkpoint files"). Each record is
// an int64, an array of int64, float32 or float64 values, or a text, under a name. The format,
// little-endian:
//
//   "ONEBITRF" | u32 version (1) | u32 records | records... | u32 CRC-32 of every byte before it
//   record: u16 name bytes | name | u8 kind | u64 count | count values (8, 8, 4, 8 or 1 bytes each)
//
// Writing goes to a temporary file in the same folder, flushed and renamed over the path, so a
// crash mid-write leaves the old file or none, never half of one. A file is written whole from
// records held in memory (write), or streamed: each record goes to the temporary file as it is put,
// none held, and commit() finishes it (what a job's one file needs, its ranks' parts put one at a
// time). Reading checks the magic, the version, every length against the file's size and the CRC,
// says which check failed, and holds only the records kept.
//
// A job's file holds every rank's part: what all ranks hold alike under its plain name, once, and
// what is rank r's own under "rank<r>/<name>" (r in decimal digits; any other name is plain).
// read_rank(path, r) reads rank r's view of it: the plain records and rank r's with the prefix
// taken off, holding no other rank's (it reads them all for the CRC); rank 0's view for a rank
// the file has no part of (a job grown since), whose "rank" record says so. A one-rank file, which
// has no prefixed records, reads whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace onebit {

class RecordFile {
 public:
  enum class Kind : std::uint8_t { kAbsent = 0, kInt = 1, kInts = 2, kFloats = 3, kDoubles = 4, kText = 5 };

  void put_int(const std::string& name, std::int64_t value);
  void put_ints(const std::string& name, const std::int64_t* values, std::size_t count);
  void put_floats(const std::string& name, const float* values, std::size_t count);
  void put_doubles(const std::string& name, const double* values, std::size_t count);
  void put_text(const std::string& name, const std::string& text);

  RecordFile();
  RecordFile(RecordFile&&) noexcept;
  RecordFile& operator=(RecordFile&&) noexcept;
  ~RecordFile();  // a streamed file not committed: its temporary file removed, `path` untouched

  // Throws Error(ONEBIT_SYSTEM_ERROR) naming the path and the OS's reason.
  void write(const std::string& path) const;
  // A file streamed to `path`: each put writes its record to the temporary file at once and keeps
  // only its name, kind and count; commit() completes the file and renames it over `path`. The
  // records' values cannot be got back from it. Throws as write() does.
  static RecordFile stream_to(const std::string& path);
  void commit();

  // Throws Error(ONEBIT_SYSTEM_ERROR) when the file cannot be read, ONEBIT_INVALID_ARGUMENT naming
  // what is wrong with it (not a record file, another version, cut short, a CRC that differs).
  static RecordFile read(const std::string& path);
  // Rank `rank`'s view of a job's file (the header says what it holds); read() would hold every rank's.
  static RecordFile read_rank(const std::string& path, int rank);
  // read() of bytes already in memory, or read_rank() where `rank` >= 0; `origin` is what errors
  // call them (the fuzz target's door).
  static RecordFile parse(const std::vector<unsigned char>& bytes, const std::string& origin, int rank = -1);

  // The format's CRC-32 (zlib's: the IEEE polynomial, reflected) of `size` bytes; `crc` the CRC of
  // the bytes before them, to go on from.
  static std::uint32_t crc32(const unsigned char* data, std::size_t size, std::uint32_t crc = 0);

  class Source;  // the bytes being read: a file's, or bytes in memory

  Kind kind(const std::string& name) const;
  std::size_t count(const std::string& name) const;  // values (bytes of a text); 0 when absent
  std::vector<std::string> names() const;            // in the order written
  // Each throws Error(ONEBIT_INVALID_ARGUMENT) naming the record when it is absent or of another kind.
  std::int64_t get_int(const std::string& name) const;
  std::vector<std::int64_t> get_ints(const std::string& name) const;
  std::vector<float> get_floats(const std::string& name) const;
  std::vector<double> get_doubles(const std::string& name) const;
  std::string get_text(const std::string& name) const;

 private:
  class Sink;
  // The name a record read under `stored` is kept as, or nothing to skip it.
  using Rename = std::function<std::optional<std::string>(const std::string& stored)>;
  static RecordFile parse_from(const Source& source, const std::string& origin, const Rename& kept_as);
  static RecordFile rank_view(const Source& source, const std::string& origin, int rank);

  struct Record {
    Kind kind;
    std::size_t count;
    std::vector<unsigned char> bytes;  // the values as stored (none for a streamed file's)
  };
  void put(const std::string& name, Kind kind, std::size_t count, const void* values, std::size_t value_bytes);
  void check_new(const std::string& name, Kind kind, std::size_t count) const;
  void hold(const std::string& name, Kind kind, std::size_t count, std::vector<unsigned char> bytes);
  const Record& get(const std::string& name, Kind kind) const;

  std::string origin_ = "this checkpoint";  // what errors call it: the path it was read from
  std::vector<std::string> order_;
  std::map<std::string, Record> records_;
  std::unique_ptr<Sink> sink_;  // a streamed file's temporary file
};

}  // namespace onebit
