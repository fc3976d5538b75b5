// What the three C++ optimizer shims (onebit_adam.hpp, zero_one_adam.hpp, onebit_lamb.hpp) share:
// their parameter groups laid end to end in flat arrays — m, v, the gathered gradients and the one
// tagged buffer the compressed allreduce averages — and that buffer's error-feedback state in a
// checkpoint. Header-only over the C ABI, as the shims are.
#ifndef ONEBIT_FLAT_PARAMETERS_HPP_
#define ONEBIT_FLAT_PARAMETERS_HPP_

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "onebit/call_error.hpp"
#include "onebit/onebit.h"
#include "onebit/optimizer_report.hpp"

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

  // Each group's part of the flat variance `v`, with its eps: what report_freeze reads.
  template <typename Group>
  std::vector<FrozenVariance> frozen_variance(const float* v, const std::vector<Group>& groups) const {
    std::vector<FrozenVariance> frozen;
    for (std::size_t i = 0; i < groups.size(); ++i)
      frozen.push_back({v + offsets_[i], counts_[i], groups[i].config.eps});
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

}  // namespace onebit

#endif  // ONEBIT_FLAT_PARAMETERS_HPP_
