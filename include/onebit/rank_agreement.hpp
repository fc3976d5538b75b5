// onebit::agree_across_ranks — how the C++ optimizer shims make sure, at construction, that every
// rank holds the same values of what decides when collectives happen (freeze step, schedule,
// parameter count). Ranks that differ would otherwise part at the first step that depends on it —
// one in a compressed allreduce, another in the ring — and wait there until the timeout. Here each
// rank learns every rank's values through one exact allreduce and, on a difference, throws
// CallError(ONEBIT_MISMATCH) naming the field and each rank's value. Construction and load() of a
// checkpoint (same step on every rank) are therefore collective: every rank makes them, in the
// same order.
#ifndef ONEBIT_RANK_AGREEMENT_HPP_
#define ONEBIT_RANK_AGREEMENT_HPP_

#include <cstdint>
#include <string>
#include <vector>

#include "onebit/call_error.hpp"
#include "onebit/onebit.h"

namespace onebit {

struct AgreedField {
  const char* name;
  std::int64_t value;
};

inline void agree_across_ranks(onebit_comm_t comm, const std::string& who, const std::vector<AgreedField>& fields,
                               const std::string& hint = "") {
  int rank = 0, size = 1;
  check_call(onebit_comm_rank(comm, &rank));
  check_call(onebit_comm_size(comm, &size));
  if (size == 1) return;
  // A W x F table of values, each as three 22-bit pieces (exact in a float); each rank fills its
  // own row, so the sum — untagged: the exact ring — is every rank's row.
  constexpr int kPieces = 3;
  const std::size_t row = fields.size() * kPieces;
  std::vector<float> table(static_cast<std::size_t>(size) * row, 0.0f);
  std::size_t at = static_cast<std::size_t>(rank) * row;
  for (const AgreedField& field : fields) {
    const auto bits = static_cast<std::uint64_t>(field.value);
    for (int piece = 0; piece < kPieces; ++piece) table[at++] = static_cast<float>((bits >> (22 * piece)) & 0x3FFFFF);
  }
  check_call(onebit_allreduce(comm, table.data(), table.size(), ONEBIT_FLOAT32, ONEBIT_SUM));
  auto value_of = [&](int r, std::size_t f) {
    std::uint64_t bits = 0;
    for (int piece = 0; piece < kPieces; ++piece) {
      bits |= static_cast<std::uint64_t>(table[r * row + f * kPieces + piece]) << (22 * piece);
    }
    return static_cast<std::int64_t>(bits);
  };
  std::size_t f = 0;
  for (const AgreedField& field : fields) {
    bool alike = true;
    for (int r = 1; r < size; ++r) alike = alike && value_of(r, f) == value_of(0, f);
    if (!alike) {
      std::string values;
      for (int r = 0; r < size; ++r) {
        values +=
            (r == 0 ? "" : ", ") + std::string("rank ") + std::to_string(r) + " has " + std::to_string(value_of(r, f));
      }
      throw CallError(ONEBIT_MISMATCH, who + ": the ranks disagree on " + field.name + ": " + values +
                                           "; every rank must be given the same value" + hint);
    }
    ++f;
  }
}

}  // namespace onebit

#endif  // ONEBIT_RANK_AGREEMENT_HPP_
