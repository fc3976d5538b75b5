// The C ABI of checkpoint files (include/onebit/onebit.h, "Checkpoint files"): an opaque handle
// over RecordFile, each entry point a guarded call.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "common/record_file.h"
#include "onebit/onebit.h"
#include "plugin/capi/abi_guard.h"
#include "plugin/capi/optimizer_args.h"

struct onebit_checkpoint {
  onebit::RecordFile file;
  // What onebit_checkpoint_names handed out, alive with the handle: only ever appended to (a
  // deque's elements stay where they are), so every name pointer given stays valid.
  std::deque<std::string> names;
};

namespace {

using onebit::RecordFile;
using onebit::capi::copy_text;
using onebit::capi::non_null;

RecordFile& file_of(onebit_checkpoint_t checkpoint) { return non_null(checkpoint, "checkpoint").file; }

const char* named(const char* name) { return &non_null(name, "name"); }

// A get's `count` must be the record's: the caller sized its array from onebit_checkpoint_record.
template <typename T>
void copy_values(const std::vector<T>& got, const char* name, T* values, std::size_t count) {
  ONEBIT_CHECK(got.size() == count, ONEBIT_INVALID_ARGUMENT, "record '", name, "' holds ", got.size(), " values, not ",
               count);
  ONEBIT_CHECK(values != nullptr || count == 0, ONEBIT_INVALID_ARGUMENT, "values is NULL (count ", count, ")");
  std::copy(got.begin(), got.end(), values);
}

}  // namespace

extern "C" {

onebit_result_t onebit_checkpoint_create(onebit_checkpoint_t* checkpoint) {
  return onebit::abi_guard("onebit_checkpoint_create",
                           [&] { non_null(checkpoint, "checkpoint") = new onebit_checkpoint{}; });
}

void onebit_checkpoint_destroy(onebit_checkpoint_t checkpoint) { delete checkpoint; }

onebit_result_t onebit_checkpoint_put_int(onebit_checkpoint_t checkpoint, const char* name, int64_t value) {
  return onebit::abi_guard("onebit_checkpoint_put_int", [&] { file_of(checkpoint).put_int(named(name), value); });
}

onebit_result_t onebit_checkpoint_put_ints(onebit_checkpoint_t checkpoint, const char* name, const int64_t* values,
                                           size_t count) {
  return onebit::abi_guard("onebit_checkpoint_put_ints",
                           [&] { file_of(checkpoint).put_ints(named(name), values, count); });
}

onebit_result_t onebit_checkpoint_put_floats(onebit_checkpoint_t checkpoint, const char* name, const float* values,
                                             size_t count) {
  return onebit::abi_guard("onebit_checkpoint_put_floats",
                           [&] { file_of(checkpoint).put_floats(named(name), values, count); });
}

onebit_result_t onebit_checkpoint_put_doubles(onebit_checkpoint_t checkpoint, const char* name, const double* values,
                                              size_t count) {
  return onebit::abi_guard("onebit_checkpoint_put_doubles",
                           [&] { file_of(checkpoint).put_doubles(named(name), values, count); });
}

onebit_result_t onebit_checkpoint_put_text(onebit_checkpoint_t checkpoint, const char* name, const char* text) {
  return onebit::abi_guard("onebit_checkpoint_put_text",
                           [&] { file_of(checkpoint).put_text(named(name), &non_null(text, "text")); });
}

onebit_result_t onebit_checkpoint_write(onebit_checkpoint_t checkpoint, const char* path) {
  return onebit::abi_guard("onebit_checkpoint_write", [&] { file_of(checkpoint).write(&non_null(path, "path")); });
}

onebit_result_t onebit_checkpoint_stream(const char* path, onebit_checkpoint_t* checkpoint) {
  return onebit::abi_guard("onebit_checkpoint_stream", [&] {
    onebit_checkpoint_t& out = non_null(checkpoint, "checkpoint");
    out = new onebit_checkpoint{RecordFile::stream_to(&non_null(path, "path")), {}};
  });
}

onebit_result_t onebit_checkpoint_commit(onebit_checkpoint_t checkpoint) {
  return onebit::abi_guard("onebit_checkpoint_commit", [&] { file_of(checkpoint).commit(); });
}

onebit_result_t onebit_checkpoint_read(const char* path, onebit_checkpoint_t* checkpoint) {
  return onebit::abi_guard("onebit_checkpoint_read", [&] {
    onebit_checkpoint_t& out = non_null(checkpoint, "checkpoint");
    out = new onebit_checkpoint{RecordFile::read(&non_null(path, "path")), {}};
  });
}

onebit_result_t onebit_checkpoint_read_rank(const char* path, int rank, onebit_checkpoint_t* checkpoint) {
  return onebit::abi_guard("onebit_checkpoint_read_rank", [&] {
    onebit_checkpoint_t& out = non_null(checkpoint, "checkpoint");
    out = new onebit_checkpoint{RecordFile::read_rank(&non_null(path, "path"), rank), {}};
  });
}

onebit_result_t onebit_checkpoint_record(onebit_checkpoint_t checkpoint, const char* name, onebit_record_kind_t* kind,
                                         size_t* count) {
  return onebit::abi_guard("onebit_checkpoint_record", [&] {
    const RecordFile& file = file_of(checkpoint);
    non_null(kind, "kind") = static_cast<onebit_record_kind_t>(file.kind(named(name)));
    non_null(count, "count") = file.count(name);
  });
}

onebit_result_t onebit_checkpoint_names(onebit_checkpoint_t checkpoint, const char** names, size_t capacity,
                                        size_t* count) {
  return onebit::abi_guard("onebit_checkpoint_names", [&] {
    onebit_checkpoint& c = non_null(checkpoint, "checkpoint");
    ONEBIT_CHECK(names != nullptr || capacity == 0, ONEBIT_INVALID_ARGUMENT, "names is NULL (capacity ", capacity, ")");
    const std::vector<std::string> now = c.file.names();  // the names so far, in order: a prefix grows
    for (std::size_t i = c.names.size(); i < now.size(); ++i) c.names.push_back(now[i]);
    for (std::size_t i = 0; i < c.names.size() && i < capacity; ++i) names[i] = c.names[i].c_str();
    non_null(count, "count") = c.names.size();
  });
}

onebit_result_t onebit_checkpoint_get_int(onebit_checkpoint_t checkpoint, const char* name, int64_t* value) {
  return onebit::abi_guard("onebit_checkpoint_get_int", [&] {
    const std::int64_t got = file_of(checkpoint).get_int(named(name));
    non_null(value, "value") = got;
  });
}

onebit_result_t onebit_checkpoint_get_ints(onebit_checkpoint_t checkpoint, const char* name, int64_t* values,
                                           size_t count) {
  return onebit::abi_guard("onebit_checkpoint_get_ints",
                           [&] { copy_values(file_of(checkpoint).get_ints(named(name)), name, values, count); });
}

onebit_result_t onebit_checkpoint_get_floats(onebit_checkpoint_t checkpoint, const char* name, float* values,
                                             size_t count) {
  return onebit::abi_guard("onebit_checkpoint_get_floats",
                           [&] { copy_values(file_of(checkpoint).get_floats(named(name)), name, values, count); });
}

onebit_result_t onebit_checkpoint_get_doubles(onebit_checkpoint_t checkpoint, const char* name, double* values,
                                              size_t count) {
  return onebit::abi_guard("onebit_checkpoint_get_doubles",
                           [&] { copy_values(file_of(checkpoint).get_doubles(named(name)), name, values, count); });
}

onebit_result_t onebit_checkpoint_get_text(onebit_checkpoint_t checkpoint, const char* name, char* text,
                                           size_t text_size, size_t* length) {
  return onebit::abi_guard("onebit_checkpoint_get_text",
                           [&] { copy_text(file_of(checkpoint).get_text(named(name)), text, text_size, length); });
}

}  // extern "C"
