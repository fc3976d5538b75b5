// What the three C++ optimizer shims (onebit_adam.hpp, zero_one_adam.hpp, onebit_lamb.hpp) share:
// their parameter groups laid end to end in flat arrays — m, v, the gathered gradients and the one
// tagged buffer the compressed allreduce averages — and that buffer's error-feedback state in a
// checkpoint. Header-only over the C ABI, as the shims are.
#ifndef ONEBIT_FLAT_PARAMETERS_HPP_
#define ONEBIT_FLAT_PARAMETERS_HPP_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "onebit/call_error.hpp"
#include "onebit/onebit.h"
#include "onebit/optimizer_report.hpp"
#include "onebit/resume_rules.hpp"

namespace onebit {

// Where each parameter group sits in an optimizer's flat arrays: group i holds count(i) elements
// from offset(i), in the order the groups were given.
class FlatLayout {
 public:
  // Checks what every shim asks of its groups — at least one, and params not NULL where the group
  // has elements — naming `who` (e.g. "onebit::OnebitAdam") and the group.
  template <typename Group>
  FlatLayout(const std::vector<Group>& groups, const std::string& who) {
    if (groups.empty()) throw CallError(ONEBIT_INVALID_ARGUMENT, who + ": no parameter groups");
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (groups[i].params == nullptr && groups[i].count != 0) {
        throw CallError(ONEBIT_INVALID_ARGUMENT, who + ": group " + std::to_string(i) + "'s params is NULL");
      }
      offsets_.push_back(total_);
      counts_.push_back(groups[i].count);
      total_ += groups[i].count;
    }
  }

  std::size_t groups() const { return counts_.size(); }
  std::size_t total() const { return total_; }
  std::size_t offset(std::size_t group) const { return offsets_[group]; }
  std::size_t count(std::size_t group) const { return counts_[group]; }
  const std::vector<std::size_t>& counts() const { return counts_; }

  // step()'s input, one gradient array per group, copied into `flat` (total() floats). Checked
  // first: the number of arrays and that none is NULL where its group has elements; a refused
  // call leaves `flat` as it was.
  void gather(const std::vector<const float*>& grads, std::vector<float>& flat, const std::string& who) const {
    if (grads.size() != groups()) {
      throw CallError(ONEBIT_INVALID_ARGUMENT, who + ": " + std::to_string(grads.size()) + " gradient arrays for " +
                                                   std::to_string(groups()) + " groups");
    }
    for (std::size_t i = 0; i < groups(); ++i) {
      if (grads[i] == nullptr && counts_[i] != 0) {
        throw CallError(ONEBIT_INVALID_ARGUMENT, who + ": group " + std::to_string(i) + "'s gradient is NULL");
      }
    }
    for (std::size_t i = 0; i < groups(); ++i) {
      std::copy(grads[i], grads[i] + counts_[i], flat.begin() + static_cast<std::ptrdiff_t>(offsets_[i]));
    }
  }

  // Each group's part of the flat variance `v`, with its eps (the group's config's, or `eps_of(i)`
  // where the steps divide by another): what report_freeze reads.
  template <typename Group>
  std::vector<FrozenVariance> frozen_variance(const float* v, const std::vector<Group>& groups) const {
    return frozen_variance(v, groups.size(), [&](std::size_t i) { return groups[i].config.eps; });
  }
  template <typename Eps>
  std::vector<FrozenVariance> frozen_variance(const float* v, std::size_t groups, Eps eps_of) const {
    std::vector<FrozenVariance> frozen;
    for (std::size_t i = 0; i < groups; ++i) frozen.push_back({v + offsets_[i], counts_[i], eps_of(i)});
    return frozen;
  }

 private:
  std::vector<std::size_t> offsets_, counts_;
  std::size_t total_ = 0;
};

// The tagged buffer's error-feedback state on this rank, for a checkpoint: filled when the tag has
// state (a compressed call ran on it, or a loaded state waits for one); left empty otherwise, which
// is an error only where the caller says a compressed call must have run (`required`).
inline void save_tag_state(const std::string& tag, std::vector<float>& worker, std::vector<float>& server,
                           bool required) {
  std::size_t workers = 0, servers = 0;
  const onebit_result_t sized = onebit_tag_state_size(tag.c_str(), &workers, &servers);
  if (sized != ONEBIT_SUCCESS) {
    if (required) check_call(sized);
    return;
  }
  worker.resize(workers);
  server.resize(servers);
  check_call(onebit_tag_state_save(tag.c_str(), worker.data(), server.data()));
}

// The state save_tag_state gave, restored before the tag's next call; nothing when it was empty
// (saved before the first compressed call: a fresh tag's state).
inline void load_tag_state(const std::string& tag, const std::vector<float>& worker, const std::vector<float>& server) {
  if (worker.empty() && server.empty()) return;
  check_call(onebit_tag_state_load(tag.c_str(), worker.data(), worker.size(), server.data(), server.size()));
}

// One rank's checkpoint file (onebit.h, "Checkpoint files"), the format the Python shims write and
// read too: records put while saving, then write(); or a file read from a path (whole, or rank
// `rank`'s view: its own file, or its part of a job's file) and got while loading. A record that is absent reads
// as `absent` (scalars) or empty (arrays): a field not recorded.
class CheckpointFile {
 public:
  CheckpointFile() { check_call(onebit_checkpoint_create(&file_)); }
  explicit CheckpointFile(const std::string& path) { check_call(onebit_checkpoint_read(path.c_str(), &file_)); }
  CheckpointFile(const std::string& path, int rank) {
    check_call(onebit_checkpoint_read_rank(path.c_str(), rank, &file_));
  }
  ~CheckpointFile() { onebit_checkpoint_destroy(file_); }
  CheckpointFile(const CheckpointFile&) = delete;
  CheckpointFile& operator=(const CheckpointFile&) = delete;

  void put(const char* name, std::int64_t value) { check_call(onebit_checkpoint_put_int(file_, name, value)); }
  void put(const char* name, const std::string& text) {
    check_call(onebit_checkpoint_put_text(file_, name, text.c_str()));
  }
  void put(const char* name, const std::vector<float>& v) {
    check_call(onebit_checkpoint_put_floats(file_, name, v.data(), v.size()));
  }
  void put(const char* name, const std::vector<double>& v) {
    check_call(onebit_checkpoint_put_doubles(file_, name, v.data(), v.size()));
  }
  void put(const char* name, const std::vector<std::int64_t>& v) {
    check_call(onebit_checkpoint_put_ints(file_, name, v.data(), v.size()));
  }
  void write(const std::string& path) const { check_call(onebit_checkpoint_write(file_, path.c_str())); }

  std::int64_t get(const char* name, std::int64_t absent) const {
    if (count(name, ONEBIT_RECORD_INT) == kAbsent) return absent;
    std::int64_t value = 0;
    check_call(onebit_checkpoint_get_int(file_, name, &value));
    return value;
  }
  std::string text(const char* name) const {
    const std::size_t bytes = count(name, ONEBIT_RECORD_TEXT);
    if (bytes == kAbsent) return "";
    std::string text(bytes + 1, '\0');
    check_call(onebit_checkpoint_get_text(file_, name, text.data(), text.size(), nullptr));
    return text.c_str();
  }
  std::vector<float> floats(const char* name) const { return values<float>(name, ONEBIT_RECORD_FLOATS); }
  std::vector<double> doubles(const char* name) const { return values<double>(name, ONEBIT_RECORD_DOUBLES); }
  std::vector<std::int64_t> ints(const char* name) const { return values<std::int64_t>(name, ONEBIT_RECORD_INTS); }

 private:
  static constexpr std::size_t kAbsent = SIZE_MAX;

  // The record's count, kAbsent when there is none; another kind is an error naming it.
  std::size_t count(const char* name, onebit_record_kind_t want) const {
    onebit_record_kind_t kind = ONEBIT_RECORD_ABSENT;
    std::size_t n = 0;
    check_call(onebit_checkpoint_record(file_, name, &kind, &n));
    if (kind == ONEBIT_RECORD_ABSENT) return kAbsent;
    if (kind != want) {
      throw CallError(ONEBIT_INVALID_ARGUMENT,
                      std::string("the checkpoint's record '") + name + "' is of another kind");
    }
    return n;
  }
  template <typename T>
  std::vector<T> values(const char* name, onebit_record_kind_t kind) const {
    const std::size_t n = count(name, kind);
    std::vector<T> v(n == kAbsent ? 0 : n);
    if (n == kAbsent) return v;
    if constexpr (std::is_same_v<T, float>) check_call(onebit_checkpoint_get_floats(file_, name, v.data(), n));
    if constexpr (std::is_same_v<T, double>) check_call(onebit_checkpoint_get_doubles(file_, name, v.data(), n));
    if constexpr (std::is_same_v<T, std::int64_t>) check_call(onebit_checkpoint_get_ints(file_, name, v.data(), n));
    return v;
  }

  onebit_checkpoint_t file_ = nullptr;
};

// The records every optimizer's checkpoint file holds besides its own (docs/design/checkpoints.md,
// "Checkpoint files"): who wrote it and from which rank, m and v, this rank's error feedback and the
// layout it belongs to. `optimizer` is the class's name in both languages ("OnebitAdam").
template <typename Checkpoint>
void put_common_records(CheckpointFile& file, const char* optimizer, onebit_comm_t comm, const Checkpoint& c) {
  int rank = 0;
  check_call(onebit_comm_rank(comm, &rank));
  file.put("optimizer", std::string(optimizer));
  file.put("rank", static_cast<std::int64_t>(rank));
  file.put("world_size", c.world_size);
  file.put("local_size", c.local_size);
  file.put("m", c.m);
  file.put("v", c.v);
  file.put("worker_error", c.worker_error);
  file.put("server_error", c.server_error);
}

// Reads this rank's view of the checkpoint file at `path` (onebit_checkpoint_read_rank) with
// `fill(file)`: "" when it was read, else why not (the file missing, damaged, another
// optimizer's). load_file() hands that reason to the load's agreement, so a file one rank cannot
// read fails every rank's load at once, not that rank's alone while the others wait in the
// agreement until the timeout.
template <typename Fill>
std::string read_checkpoint_file(onebit_comm_t comm, const std::string& path, Fill fill) {
  try {
    int rank = 0;
    check_call(onebit_comm_rank(comm, &rank));
    fill(CheckpointFile(path, rank));
  } catch (const CallError& error) {
    return error.what();
  }
  return "";
}

// put_common_records' records read back into `c`, once the file is `optimizer`'s.
template <typename Checkpoint>
void get_common_records(const CheckpointFile& file, const std::string& path, const char* optimizer, Checkpoint& c) {
  const std::string kind = file.text("optimizer");
  if (kind != optimizer) {
    throw CallError(ONEBIT_INVALID_ARGUMENT, path + " is " + (kind.empty() ? "no optimizer" : kind) +
                                                 "'s checkpoint, not " + optimizer +
                                                 "'s: make the optimizer the run "
                                                 "was made with");
  }
  c.world_size = file.get("world_size", kNotRecorded);
  c.local_size = file.get("local_size", kNotRecorded);
  c.m = file.floats("m");
  c.v = file.floats("v");
  c.worker_error = file.floats("worker_error");
  c.server_error = file.floats("server_error");
}

}  // namespace onebit

#endif  // ONEBIT_FLAT_PARAMETERS_HPP_
