// What the optimizer entry points of the C ABI check before calling into optim/: the host ones
// (optimizer_abi.cc) and the device ones (device_steps.cc) alike.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "onebit/onebit.h"
#include "optim/onebit_adam.h"
#include "optim/onebit_lamb.h"
#include "optim/zero_one_adam.h"

namespace onebit::capi {

// `made` into text[0, text_size) as snprintf would write it, its whole length into *length.
inline void copy_text(const std::string& made, char* text, size_t text_size, size_t* length) {
  ONEBIT_CHECK(text != nullptr || text_size == 0, ONEBIT_INVALID_ARGUMENT, "text is NULL (text_size ", text_size, ")");
  if (text_size > 0) {
    const std::size_t kept = std::min(made.size(), text_size - 1);
    std::copy_n(made.data(), kept, text);
    text[kept] = '\0';
  }
  if (length != nullptr) *length = made.size();
}

// `fields` into names/values (up to `capacity`), their number into *count.
inline void copy_fields(const std::vector<std::pair<const char*, std::int64_t>>& fields, const char** names,
                        int64_t* values, size_t capacity, size_t* count) {
  ONEBIT_CHECK(count != nullptr && (capacity == 0 || (names != nullptr && values != nullptr)), ONEBIT_INVALID_ARGUMENT,
               "names, values or count is NULL");
  for (std::size_t i = 0; i < fields.size() && i < capacity; ++i) {
    names[i] = fields[i].first;
    values[i] = fields[i].second;
  }
  *count = fields.size();
}

inline onebit::optim::AdamConfig to_adam(const onebit_adam_config_t* c) {
  ONEBIT_CHECK(c != nullptr, ONEBIT_INVALID_ARGUMENT, "config is NULL");
  ONEBIT_CHECK(c->lr >= 0 && c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1 && c->eps > 0 &&
                   c->weight_decay >= 0 && c->freeze_step >= 0,
               ONEBIT_INVALID_ARGUMENT, "adam config out of range: lr ", c->lr, ", betas (", c->beta1, ", ", c->beta2,
               "), eps ", c->eps, ", weight_decay ", c->weight_decay, ", freeze_step ", c->freeze_step,
               " (need lr, wd >= 0; 0 <= beta < 1; eps > 0; freeze_step >= 0)");
  return onebit::optim::AdamConfig{c->lr, c->beta1, c->beta2, c->eps, c->weight_decay, c->freeze_step};
}

inline const onebit_zero_one_adam_config_t& to_zero_one_adam(const onebit_zero_one_adam_config_t* c) {
  ONEBIT_CHECK(c != nullptr, ONEBIT_INVALID_ARGUMENT, "config is NULL");
  onebit::optim::zero_one_adam::check(*c);
  return *c;
}

inline const onebit_lamb_config_t& to_lamb(const onebit_lamb_config_t* c) {
  ONEBIT_CHECK(c != nullptr, ONEBIT_INVALID_ARGUMENT, "config is NULL");
  onebit::optim::lamb::check(*c);
  return *c;
}

template <typename T>
T& non_null(T* pointer, const char* what) {
  ONEBIT_CHECK(pointer != nullptr, ONEBIT_INVALID_ARGUMENT, what, " is NULL");
  return *pointer;
}

// m_before, where one is given, lies apart from m (the step reads m while writing m_before).
inline void check_apart(const float* m, const float* m_before, std::size_t count) {
  const auto at = reinterpret_cast<std::uintptr_t>(m), kept_at = reinterpret_cast<std::uintptr_t>(m_before);
  const std::uintptr_t bytes = count * sizeof(float);
  ONEBIT_CHECK(m_before == nullptr || kept_at + bytes <= at || at + bytes <= kept_at, ONEBIT_INVALID_ARGUMENT,
               "m_before overlaps m (", count, " elements): it must be a separate array");
}

inline void check_arrays(std::size_t count, std::initializer_list<const void*> arrays) {
  for (const void* a : arrays) {
    ONEBIT_CHECK(a != nullptr || count == 0, ONEBIT_INVALID_ARGUMENT, "an array is NULL with count ", count);
  }
}

}  // namespace onebit::capi
