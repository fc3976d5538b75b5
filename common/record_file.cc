#include "common/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace onebit {

namespace {

constexpr char kMagic[8] = {'O', 'N', 'E', 'B', 'I', 'T', 'R', 'F'};
constexpr std::uint32_t kVersion = 1;
// The format is little-endian, and values are copied as the machine holds them.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "onebit's checkpoint files are little-endian");

}  // namespace

std::uint32_t RecordFile::crc32(const unsigned char* data, std::size_t size, std::uint32_t crc) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = crc ^ 0xFFFFFFFFu;
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

// What errno says, or `otherwise` when it says nothing (a short read or write).
std::string reason(int error, const char* otherwise) { return error == 0 ? otherwise : std::strerror(error); }

void fsync_folder_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);  // best effort: some file systems refuse a folder's fsync
    ::close(dir);
  }
}

}  // namespace

// The bytes a file's reading takes: a file's (read as they are needed), or bytes in memory.
class RecordFile::Source {
 public:
  virtual ~Source() = default;
  virtual std::size_t size() const = 0;
  virtual void read(std::size_t at, void* into, std::size_t size) const = 0;
};

namespace {

class BytesSource : public RecordFile::Source {
 public:
  explicit BytesSource(const std::vector<unsigned char>& bytes) : bytes_(bytes) {}
  std::size_t size() const override { return bytes_.size(); }
  void read(std::size_t at, void* into, std::size_t size) const override {
    if (size > 0) std::memcpy(into, bytes_.data() + at, size);
  }

 private:
  const std::vector<unsigned char>& bytes_;  // the caller's, alive while it is parsed
};

// The first `size` bytes of the open file `fd` (not owned), read with pread as they are needed.
class FdSource : public RecordFile::Source {
 public:
  FdSource(int fd, std::size_t size, std::string path) : fd_(fd), size_(size), path_(std::move(path)) {}
  std::size_t size() const override { return size_; }
  void read(std::size_t at, void* into, std::size_t size) const override {
    auto* bytes = static_cast<unsigned char*>(into);
    for (std::size_t got = 0; got < size;) {
      const ssize_t n = ::pread(fd_, bytes + got, size - got, static_cast<off_t>(at + got));
      if (n < 0 && errno == EINTR) continue;
      ONEBIT_CHECK(n > 0, ONEBIT_SYSTEM_ERROR, "cannot read ", path_, ": ",
                   reason(n == 0 ? 0 : errno, "it shrank while read"));
      got += static_cast<std::size_t>(n);
    }
  }

 protected:
  int fd_;
  std::size_t size_;
  std::string path_;
};

// The regular file at `path`, open for reading while this lives.
class FileSource : public FdSource {
  struct Opened {
    int fd;
    std::size_t size;
  };

 public:
  explicit FileSource(const std::string& path) : FileSource(open_regular(path), path) {}
  ~FileSource() override { ::close(fd_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

 private:
  FileSource(Opened opened, const std::string& path) : FdSource(opened.fd, opened.size, path) {}

  static Opened open_regular(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ONEBIT_CHECK(fd >= 0, ONEBIT_SYSTEM_ERROR, "cannot read ", path, ": ", std::strerror(errno));
    struct stat about {};
    const bool stated = ::fstat(fd, &about) == 0;
    const int error = errno;
    if (stated && S_ISREG(about.st_mode)) return {fd, static_cast<std::size_t>(about.st_size)};
    ::close(fd);
    fail(stated ? ONEBIT_INVALID_ARGUMENT : ONEBIT_SYSTEM_ERROR, "cannot read ", path, ": ",
         !stated                  ? std::strerror(error)
         : S_ISDIR(about.st_mode) ? "it is a folder"
                                  : "not a regular file");
  }
};

// The CRC-32 of a source's first `end` bytes, read in pieces.
std::uint32_t crc_of(const RecordFile::Source& source, std::size_t end) {
  std::vector<unsigned char> piece(std::min<std::size_t>(end, 1 << 20));
  std::uint32_t crc = 0;
  for (std::size_t at = 0; at < end; at += piece.size()) {
    const std::size_t size = std::min(piece.size(), end - at);
    source.read(at, piece.data(), size);
    crc = RecordFile::crc32(piece.data(), size, crc);
  }
  return crc;
}

// A name of a job's file that is rank r's own: "rank<r>/..." (r decimal digits); its length of
// "rank<r>/", or 0.
std::size_t rank_prefix(const std::string& name) {
  std::size_t at = 4;
  if (name.compare(0, at, "rank") != 0) return 0;
  while (at < name.size() && name[at] >= '0' && name[at] <= '9') ++at;
  return at > 4 && at < name.size() && name[at] == '/' ? at + 1 : 0;
}

}  // namespace

// Where a file's records go as they are put: a temporary file of its own in the target's folder
// (mkstemp: no two writers share one), its record count and CRC written at commit(), then flushed,
// renamed over the path, and the folder flushed so that the rename survives a crash too. Removed,
// the path untouched, if it is never committed; after a failed write it takes nothing more.
class RecordFile::Sink {
 public:
  explicit Sink(std::string path) : path_(std::move(path)), temporary_(path_ + ".tmp.XXXXXX") {
    fd_ = ::mkostemp(temporary_.data(), O_CLOEXEC);
    ONEBIT_CHECK(fd_ >= 0, ONEBIT_SYSTEM_ERROR, "cannot write ", path_, ": ", std::strerror(errno));
    std::vector<unsigned char> head(kMagic, kMagic + sizeof kMagic);
    append(head, kVersion);
    append(head, std::uint32_t{0});  // the record count, written at commit()
    try {
      write_all(head.data(), head.size());
    } catch (...) {  // the destructor does not run for a constructor that throws
      ::close(fd_);
      ::unlink(temporary_.c_str());
      throw;
    }
  }
  ~Sink() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temporary_.c_str());
  }
  Sink(const Sink&) = delete;
  Sink& operator=(const Sink&) = delete;

  // Throws unless a record may still be appended.
  void check_open() const {
    ONEBIT_CHECK(!committed_, ONEBIT_INVALID_ARGUMENT, path_, " is committed: no record can follow");
    ONEBIT_CHECK(!failed_, ONEBIT_INVALID_ARGUMENT, "an earlier write to ", path_,
                 " failed: this stream takes nothing more (destroy it; the path is as it was)");
  }

  void append_record(const std::string& name, Kind kind, std::size_t count, const void* values, std::size_t bytes) {
    check_open();
    ONEBIT_CHECK(records_ < UINT32_MAX, ONEBIT_INVALID_ARGUMENT, path_, ": more than ", UINT32_MAX, " records");
    std::vector<unsigned char> head;
    append(head, static_cast<std::uint16_t>(name.size()));
    head.insert(head.end(), name.begin(), name.end());
    append(head, static_cast<std::uint8_t>(kind));
    append(head, static_cast<std::uint64_t>(count));
    write_all(head.data(), head.size());
    write_all(values, bytes);
    ++records_;
  }

  void commit() {
    check_open();
    const std::uint32_t records = records_;
    pwrite_all(&records, sizeof records, sizeof kMagic + 4);
    const std::uint32_t crc = crc_of(FdSource(fd_, end_, temporary_), end_);
    write_all(&crc, sizeof crc);
    if (::fsync(fd_) != 0) fail_with(errno);
    const int closed = ::close(fd_);
    fd_ = -1;
    if (closed != 0) fail_with(errno);
    if (::rename(temporary_.c_str(), path_.c_str()) != 0) fail_with(errno);
    committed_ = true;
    fsync_folder_of(path_);
  }

 private:
  [[noreturn]] void fail_with(int error) {
    failed_ = true;
    fail(ONEBIT_SYSTEM_ERROR, "cannot write ", path_, ": ", reason(error, "the disk took no more bytes"));
  }
  void write_all(const void* data, std::size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (std::size_t written = 0; written < size;) {
      const ssize_t n = ::write(fd_, bytes + written, size - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_with(n == 0 ? 0 : errno);
      written += static_cast<std::size_t>(n);
      end_ += static_cast<std::size_t>(n);
    }
  }
  void pwrite_all(const void* data, std::size_t size, std::size_t at) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (std::size_t written = 0; written < size;) {
      const ssize_t n = ::pwrite(fd_, bytes + written, size - written, static_cast<off_t>(at + written));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_with(n == 0 ? 0 : errno);
      written += static_cast<std::size_t>(n);
    }
  }

  std::string path_, temporary_;
  int fd_ = -1;
  std::size_t end_ = 0;  // bytes written so far
  std::uint32_t records_ = 0;
  bool committed_ = false;
  bool failed_ = false;  // a write failed: nothing more is taken
};

namespace {

// Reads a source's bytes in order, each read checked against what is left before `end`.
class Cursor {
 public:
  Cursor(const RecordFile::Source& source, std::size_t end, const std::string& path)
      : source_(source), end_(end), path_(path) {}
  template <typename T>
  T take(const char* what) {
    T value;
    source_.read(claim(sizeof value, what), &value, sizeof value);
    return value;
  }
  std::string text(std::size_t size, const char* what) {
    std::string text(size, '\0');
    source_.read(claim(size, what), text.data(), size);
    return text;
  }
  std::vector<unsigned char> bytes(std::size_t size, const char* what) {
    std::vector<unsigned char> bytes(size);
    source_.read(claim(size, what), bytes.data(), size);
    return bytes;
  }
  // The offset of the next `size` bytes, which are then passed.
  std::size_t claim(std::size_t size, const char* what) {
    ONEBIT_CHECK(size <= end_ - at_, ONEBIT_INVALID_ARGUMENT, path_, ": cut short: ", what, " needs ", size,
                 " bytes at offset ", at_, ", the records end at ", end_);
    at_ += size;
    return at_ - size;
  }
  std::size_t at() const { return at_; }

 private:
  const RecordFile::Source& source_;
  std::size_t end_;
  const std::string& path_;
  std::size_t at_ = 0;
};

}  // namespace

RecordFile::RecordFile() = default;
RecordFile::RecordFile(RecordFile&&) noexcept = default;
RecordFile& RecordFile::operator=(RecordFile&&) noexcept = default;
RecordFile::~RecordFile() = default;

void RecordFile::put(const std::string& name, Kind kind, std::size_t count, const void* values, std::size_t bytes) {
  ONEBIT_CHECK(values != nullptr || bytes == 0, ONEBIT_INVALID_ARGUMENT, "record '", name, "': values is NULL (count ",
               count, ")");
  if (sink_) sink_->check_open();
  check_new(name, kind, count);  // before anything is copied or written: a refused record changes nothing
  const auto* start = static_cast<const unsigned char*>(values);
  if (sink_) sink_->append_record(name, kind, count, values, bytes);
  hold(name, kind, count, sink_ ? std::vector<unsigned char>() : std::vector<unsigned char>(start, start + bytes));
}

// Throws unless a record `name` of `count` values of `kind` may be added.
void RecordFile::check_new(const std::string& name, Kind kind, std::size_t count) const {
  ONEBIT_CHECK(!name.empty() && name.size() < 65536 && name.find('\0') == std::string::npos, ONEBIT_INVALID_ARGUMENT,
               origin_, ": a record's name must have 1 to 65535 bytes and no NUL, not ", name.size(), " bytes");
  ONEBIT_CHECK(count <= SIZE_MAX / 8, ONEBIT_INVALID_ARGUMENT, origin_, ": record '", name, "' of ", count, " values");
  ONEBIT_CHECK(kind != Kind::kInt || count == 1, ONEBIT_INVALID_ARGUMENT, origin_, ": record '", name,
               "' is an int64 of ", count, " values");
  ONEBIT_CHECK(records_.count(name) == 0, ONEBIT_INVALID_ARGUMENT, origin_, ": record '", name, "' is there twice");
}

// A checked record held: its values (none for a streamed file's, which are written).
void RecordFile::hold(const std::string& name, Kind kind, std::size_t count, std::vector<unsigned char> bytes) {
  records_[name] = Record{kind, count, std::move(bytes)};
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
  ONEBIT_CHECK(!sink_, ONEBIT_INVALID_ARGUMENT, origin_, " is streamed: commit() writes it");
  Sink sink(path);
  for (const std::string& name : order_) {
    const Record& r = records_.at(name);
    sink.append_record(name, r.kind, r.count, r.bytes.data(), r.bytes.size());
  }
  sink.commit();
}

RecordFile RecordFile::stream_to(const std::string& path) {
  RecordFile file;
  file.origin_ = path;
  file.sink_ = std::make_unique<Sink>(path);
  return file;
}

void RecordFile::commit() {
  ONEBIT_CHECK(sink_ != nullptr, ONEBIT_INVALID_ARGUMENT, origin_, " is not streamed: write(path) writes it");
  sink_->commit();
}

RecordFile RecordFile::read(const std::string& path) {
  return parse_from(FileSource(path), path, [](const std::string& stored) { return stored; });
}

RecordFile RecordFile::read_rank(const std::string& path, int rank) {
  ONEBIT_CHECK(rank >= 0, ONEBIT_INVALID_ARGUMENT, "rank ", rank, " must not be negative");
  return rank_view(FileSource(path), path, rank);  // one file for both readings, should the path be replaced
}

RecordFile RecordFile::parse(const std::vector<unsigned char>& bytes, const std::string& origin, int rank) {
  const BytesSource source(bytes);
  if (rank >= 0) return rank_view(source, origin, rank);
  return parse_from(source, origin, [](const std::string& stored) { return stored; });
}

RecordFile RecordFile::rank_view(const Source& source, const std::string& path, int rank) {
  bool ranks_records = false, own_records = false;
  const auto view = [&](int whose) {
    const std::string own = "rank" + std::to_string(whose) + "/";
    return parse_from(source, path, [&](const std::string& stored) -> std::optional<std::string> {
      if (rank_prefix(stored) == 0) return stored;
      ranks_records = true;
      if (stored.compare(0, own.size(), own) != 0) return std::nullopt;
      own_records = true;
      return stored.substr(own.size());
    });
  };
  RecordFile file = view(rank);
  // A job of more ranks than saved it: rank 0's part, which says whose it is, for the load's rules
  // to take (a warmup part is every rank's) or refuse (error feedback of another layout).
  if (ranks_records && !own_records && rank != 0) return view(0);
  return file;
}

RecordFile RecordFile::parse_from(const Source& source, const std::string& path, const Rename& kept_as) {
  const std::size_t size = source.size();
  char magic[sizeof kMagic] = {};
  if (size >= sizeof kMagic + 12) source.read(0, magic, sizeof magic);
  ONEBIT_CHECK(size >= sizeof kMagic + 12 && std::memcmp(magic, kMagic, sizeof kMagic) == 0, ONEBIT_INVALID_ARGUMENT,
               path, ": not a onebit checkpoint file (no \"ONEBITRF\" at its start)");
  const std::size_t end = size - 4;
  std::uint32_t stored = 0;
  source.read(end, &stored, sizeof stored);
  Cursor cursor(source, end, path);
  cursor.claim(sizeof kMagic, "the magic");
  const auto version = cursor.take<std::uint32_t>("the version");
  ONEBIT_CHECK(version == kVersion, ONEBIT_INVALID_ARGUMENT, path, ": format version ", version, "; this onebit reads ",
               kVersion);
  ONEBIT_CHECK(crc_of(source, end) == stored, ONEBIT_INVALID_ARGUMENT, path,
               ": its CRC-32 does not match its bytes (the file is damaged)");
  RecordFile file;
  file.origin_ = path;
  const auto records = cursor.take<std::uint32_t>("the record count");
  for (std::uint32_t i = 0; i < records; ++i) {
    const auto name_bytes = cursor.take<std::uint16_t>("a record's name length");
    const std::string name = cursor.text(name_bytes, "a record's name");
    const auto kind = static_cast<Kind>(cursor.take<std::uint8_t>("a record's kind"));
    ONEBIT_CHECK(value_bytes(kind) != 0, ONEBIT_INVALID_ARGUMENT, path, ": record '", name, "' has unknown kind ",
                 static_cast<int>(kind));
    const auto count = cursor.take<std::uint64_t>("a record's count");
    ONEBIT_CHECK(count <= (end - cursor.at()) / value_bytes(kind), ONEBIT_INVALID_ARGUMENT, path, ": record '", name,
                 "' claims ", count, " values, more than the file holds");
    const std::size_t bytes = count * value_bytes(kind);
    if (const std::optional<std::string> kept = kept_as(name)) {
      file.check_new(*kept, kind, count);
      file.hold(*kept, kind, count, cursor.bytes(bytes, "a record's values"));
    } else {
      cursor.claim(bytes, "a record's values");
    }
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
  ONEBIT_CHECK(!sink_, ONEBIT_INVALID_ARGUMENT, origin_, " is streamed: its records are written, not held");
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
