#include "common/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace onebit {

namespace {

constexpr char kMagic[8] = {'O', 'N', 'E', 'B', 'I', 'T', 'R', 'F'};
constexpr std::uint32_t kVersion = 1;
// The format is little-endian, and values are copied as the machine holds them.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "onebit's checkpoint files are little-endian");

}  // namespace

std::uint32_t RecordFile::crc32(const unsigned char* data, std::size_t size) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) c = table[(c ^ data[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

namespace {

std::size_t value_bytes(RecordFile::Kind kind) {
  switch (kind) {
    case RecordFile::Kind::kInt:
    case RecordFile::Kind::kInts:
    case RecordFile::Kind::kDoubles: return 8;
    case RecordFile::Kind::kFloats: return 4;
    case RecordFile::Kind::kText: return 1;
    case RecordFile::Kind::kAbsent: break;
  }
  return 0;
}

const char* kind_name(RecordFile::Kind kind) {
  switch (kind) {
    case RecordFile::Kind::kInt: return "an int64";
    case RecordFile::Kind::kInts: return "int64 values";
    case RecordFile::Kind::kFloats: return "float32 values";
    case RecordFile::Kind::kDoubles: return "float64 values";
    case RecordFile::Kind::kText: return "a text";
    case RecordFile::Kind::kAbsent: break;
  }
  return "nothing";
}

template <typename T>
void append(std::vector<unsigned char>& out, T value) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof value);
}

// Reads the file's bytes in order, each read checked against what is left.
class Cursor {
 public:
  Cursor(const std::vector<unsigned char>& bytes, std::size_t end, const std::string& path)
      : bytes_(bytes), end_(end), path_(path) {}
  template <typename T>
  T take(const char* what) {
    T value;
    std::memcpy(&value, span(sizeof value, what), sizeof value);
    return value;
  }
  const unsigned char* span(std::size_t size, const char* what) {
    ONEBIT_CHECK(size <= end_ - at_, ONEBIT_INVALID_ARGUMENT, path_, ": cut short: ", what, " needs ", size,
                 " bytes at offset ", at_, ", the records end at ", end_);
    const unsigned char* start = bytes_.data() + at_;
    at_ += size;
    return start;
  }
  std::size_t at() const { return at_; }

 private:
  const std::vector<unsigned char>& bytes_;
  std::size_t end_;
  const std::string& path_;
  std::size_t at_ = 0;
};

// `bytes` as the file at `path`, or nothing there changed: written to a temporary file of its own in
// the same folder (mkstemp: no two writers share one), flushed, renamed over `path`, and the
// folder flushed so that the rename survives a crash too.
void write_whole(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::string temporary = path + ".tmp.XXXXXX";
  const int fd = ::mkostemp(temporary.data(), O_CLOEXEC);
  ONEBIT_CHECK(fd >= 0, ONEBIT_SYSTEM_ERROR, "cannot write ", path, ": ", std::strerror(errno));
  std::size_t written = 0;
  int error = 0;
  while (written < bytes.size() && error == 0) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n > 0) written += static_cast<std::size_t>(n);
    else if (n < 0 && errno != EINTR) error = errno;
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  ::close(fd);
  if (error == 0 && ::rename(temporary.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(temporary.c_str());
    fail(ONEBIT_SYSTEM_ERROR, "cannot write ", path, ": ", std::strerror(error));
  }
  const std::size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);  // best effort: some file systems refuse a folder's fsync
    ::close(dir);
  }
}

// The whole file at `path`.
std::vector<unsigned char> read_whole(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ONEBIT_CHECK(fd >= 0, ONEBIT_SYSTEM_ERROR, "cannot read ", path, ": ", std::strerror(errno));
  struct stat about {};
  if (::fstat(fd, &about) != 0 || !S_ISREG(about.st_mode)) {
    const int error = errno;
    ::close(fd);
    fail(ONEBIT_INVALID_ARGUMENT, "cannot read ", path, ": ",
         S_ISDIR(about.st_mode)    ? "it is a folder"
         : !S_ISREG(about.st_mode) ? "not a regular file"
                                   : std::strerror(error));
  }
  std::vector<unsigned char> bytes(static_cast<std::size_t>(about.st_size));
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n == 0 ? 0 : errno;
      ::close(fd);
      fail(ONEBIT_SYSTEM_ERROR, "cannot read ", path, ": ", error == 0 ? "it shrank while read" : std::strerror(error));
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return bytes;
}

}  // namespace

void RecordFile::put(const std::string& name, Kind kind, std::size_t count, const void* values, std::size_t bytes) {
  ONEBIT_CHECK(!name.empty() && name.size() < 65536 && name.find('\0') == std::string::npos, ONEBIT_INVALID_ARGUMENT,
               origin_, ": a record's name must have 1 to 65535 bytes and no NUL, not ", name.size(), " bytes");
  ONEBIT_CHECK(count <= SIZE_MAX / 8, ONEBIT_INVALID_ARGUMENT, origin_, ": record '", name, "' of ", count, " values");
  ONEBIT_CHECK(kind != Kind::kInt || count == 1, ONEBIT_INVALID_ARGUMENT, origin_, ": record '", name,
               "' is an int64 of ", count, " values");
  ONEBIT_CHECK(values != nullptr || bytes == 0, ONEBIT_INVALID_ARGUMENT, "record '", name, "': values is NULL (count ",
               count, ")");
  ONEBIT_CHECK(records_.count(name) == 0, ONEBIT_INVALID_ARGUMENT, origin_, ": record '", name, "' is there twice");
  const auto* start = static_cast<const unsigned char*>(values);
  records_[name] = Record{kind, count, std::vector<unsigned char>(start, start + bytes)};
  order_.push_back(name);
}

void RecordFile::put_int(const std::string& name, std::int64_t value) {
  put(name, Kind::kInt, 1, &value, sizeof value);
}
void RecordFile::put_ints(const std::string& name, const std::int64_t* values, std::size_t count) {
  put(name, Kind::kInts, count, values, count * 8);
}
void RecordFile::put_floats(const std::string& name, const float* values, std::size_t count) {
  put(name, Kind::kFloats, count, values, count * 4);
}
void RecordFile::put_doubles(const std::string& name, const double* values, std::size_t count) {
  put(name, Kind::kDoubles, count, values, count * 8);
}
void RecordFile::put_text(const std::string& name, const std::string& text) {
  put(name, Kind::kText, text.size(), text.data(), text.size());
}

void RecordFile::write(const std::string& path) const {
  std::vector<unsigned char> out(kMagic, kMagic + sizeof kMagic);
  append(out, kVersion);
  append(out, static_cast<std::uint32_t>(order_.size()));
  for (const std::string& name : order_) {
    const Record& r = records_.at(name);
    append(out, static_cast<std::uint16_t>(name.size()));
    out.insert(out.end(), name.begin(), name.end());
    append(out, static_cast<std::uint8_t>(r.kind));
    append(out, static_cast<std::uint64_t>(r.count));
    out.insert(out.end(), r.bytes.begin(), r.bytes.end());
  }
  append(out, crc32(out.data(), out.size()));
  write_whole(path, out);
}

RecordFile RecordFile::read(const std::string& path) { return parse(read_whole(path), path); }

RecordFile RecordFile::parse(const std::vector<unsigned char>& bytes, const std::string& path) {
  ONEBIT_CHECK(bytes.size() >= sizeof kMagic + 12 && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0,
               ONEBIT_INVALID_ARGUMENT, path, ": not a onebit checkpoint file (no \"ONEBITRF\" at its start)");
  const std::size_t end = bytes.size() - 4;
  std::uint32_t stored = 0;
  std::memcpy(&stored, bytes.data() + end, sizeof stored);
  Cursor cursor(bytes, end, path);
  cursor.span(sizeof kMagic, "the magic");
  const auto version = cursor.take<std::uint32_t>("the version");
  ONEBIT_CHECK(version == kVersion, ONEBIT_INVALID_ARGUMENT, path, ": format version ", version, "; this onebit reads ",
               kVersion);
  ONEBIT_CHECK(crc32(bytes.data(), end) == stored, ONEBIT_INVALID_ARGUMENT, path,
               ": its CRC-32 does not match its bytes (the file is damaged)");
  RecordFile file;
  file.origin_ = path;
  const auto records = cursor.take<std::uint32_t>("the record count");
  for (std::uint32_t i = 0; i < records; ++i) {
    const auto name_bytes = cursor.take<std::uint16_t>("a record's name length");
    const std::string name(reinterpret_cast<const char*>(cursor.span(name_bytes, "a record's name")), name_bytes);
    const auto kind = static_cast<Kind>(cursor.take<std::uint8_t>("a record's kind"));
    ONEBIT_CHECK(value_bytes(kind) != 0, ONEBIT_INVALID_ARGUMENT, path, ": record '", name, "' has unknown kind ",
                 static_cast<int>(kind));
    const auto count = cursor.take<std::uint64_t>("a record's count");
    ONEBIT_CHECK(count <= (end - cursor.at()) / value_bytes(kind), ONEBIT_INVALID_ARGUMENT, path, ": record '", name,
                 "' claims ", count, " values, more than the file holds");
    const unsigned char* values = cursor.span(count * value_bytes(kind), "a record's values");
    file.put(name, kind, count, values, count * value_bytes(kind));
  }
  ONEBIT_CHECK(cursor.at() == end, ONEBIT_INVALID_ARGUMENT, path, ": ", end - cursor.at(),
               " bytes after the last record");
  return file;
}

RecordFile::Kind RecordFile::kind(const std::string& name) const {
  const auto found = records_.find(name);
  return found == records_.end() ? Kind::kAbsent : found->second.kind;
}

std::size_t RecordFile::count(const std::string& name) const {
  const auto found = records_.find(name);
  return found == records_.end() ? 0 : found->second.count;
}

std::vector<std::string> RecordFile::names() const { return order_; }

const RecordFile::Record& RecordFile::get(const std::string& name, Kind kind) const {
  const auto found = records_.find(name);
  ONEBIT_CHECK(found != records_.end(), ONEBIT_INVALID_ARGUMENT, origin_, " has no record '", name, "'");
  ONEBIT_CHECK(found->second.kind == kind, ONEBIT_INVALID_ARGUMENT, origin_, "'s record '", name, "' holds ",
               kind_name(found->second.kind), ", not ", kind_name(kind));
  return found->second;
}

std::int64_t RecordFile::get_int(const std::string& name) const {
  std::int64_t value = 0;
  std::memcpy(&value, get(name, Kind::kInt).bytes.data(), sizeof value);
  return value;
}

template <typename T>
static std::vector<T> values_of(const std::vector<unsigned char>& bytes, std::size_t count) {
  std::vector<T> values(count);
  if (count > 0) std::memcpy(values.data(), bytes.data(), count * sizeof(T));
  return values;
}

std::vector<std::int64_t> RecordFile::get_ints(const std::string& name) const {
  const Record& r = get(name, Kind::kInts);
  return values_of<std::int64_t>(r.bytes, r.count);
}
std::vector<float> RecordFile::get_floats(const std::string& name) const {
  const Record& r = get(name, Kind::kFloats);
  return values_of<float>(r.bytes, r.count);
}
std::vector<double> RecordFile::get_doubles(const std::string& name) const {
  const Record& r = get(name, Kind::kDoubles);
  return values_of<double>(r.bytes, r.count);
}
std::string RecordFile::get_text(const std::string& name) const {
  const Record& r = get(name, Kind::kText);
  return std::string(r.bytes.begin(), r.bytes.end());
}

}  // namespace onebit
