// onebit::agree_across_ranks — how the C++ optimizer shims make sure, at construction, that every
// rank holds the same values of what decides when collectives happen (freeze step, schedule,
// parameter count). Ranks that differ would otherwise part at the first step that depends on it —
// one in a compressed allreduce, another in the ring — and wait there until the timeout. Here each
// rank learns every rank's values through one exact allreduce and, on a difference, throws
// CallError(ONEBIT_MISMATCH) naming the field and each rank's value, in the C core's words
// (onebit_ranks_disagreement, as the Python shims). Construction and load() of a checkpoint (same
// step on every rank) are therefore collective: every rank makes them, in the same order.
#ifndef ONEBIT_RANK_AGREEMENT_HPP_
#define ONEBIT_RANK_AGREEMENT_HPP_

#include <cstdint>
#include <string>
#include <vector>

#include "onebit/call_error.hpp"
#include "onebit/onebit.h"
#include "onebit/optimizer_report.hpp"

namespace onebit {

struct AgreedField {
  const char* name;
  std::int64_t value;
};

// The fields a C call of the core names (onebit.h: `fill(names, values, capacity, &count)`, e.g.
// onebit_lamb_agreed_fields with its first arguments bound): what every rank must hold alike.
template <typename Fill>
std::vector<AgreedField> core_fields(Fill fill) {
  std::size_t count = 0;
  check_call(fill(nullptr, nullptr, 0, &count));
  std::vector<const char*> names(count);
  std::vector<std::int64_t> values(count);
  check_call(fill(names.data(), values.data(), count, &count));
  std::vector<AgreedField> fields;
  for (std::size_t i = 0; i < count; ++i) fields.push_back({names[i], values[i]});
  return fields;
}

// Every rank's row of `values` (this rank's), exactly: row r of the answer is rank r's. A W x F
// table of values, each as three 22-bit pieces (exact in a float); each rank fills its own row,
// so the sum — untagged: the exact ring — is every rank's row. Collective.
inline std::vector<std::vector<std::int64_t>> every_rank(onebit_comm_t comm, const std::vector<std::int64_t>& values) {
  int rank = 0, size = 1;
  check_call(onebit_comm_rank(comm, &rank));
  check_call(onebit_comm_size(comm, &size));
  if (size == 1) return {values};
  constexpr int kPieces = 3;
  const std::size_t row = values.size() * kPieces;
  std::vector<float> table(static_cast<std::size_t>(size) * row, 0.0f);
  std::size_t at = static_cast<std::size_t>(rank) * row;
  for (const std::int64_t value : values) {
    const auto bits = static_cast<std::uint64_t>(value);
    for (int piece = 0; piece < kPieces; ++piece) table[at++] = static_cast<float>((bits >> (22 * piece)) & 0x3FFFFF);
  }
  check_call(onebit_allreduce(comm, table.data(), table.size(), ONEBIT_FLOAT32, ONEBIT_SUM));
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(size), std::vector<std::int64_t>(values.size()));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (std::size_t f = 0; f < values.size(); ++f) {
      std::uint64_t bits = 0;
      for (int piece = 0; piece < kPieces; ++piece) {
        bits |= static_cast<std::uint64_t>(table[r * row + f * kPieces + piece]) << (22 * piece);
      }
      rows[r][f] = static_cast<std::int64_t>(bits);
    }
  }
  return rows;
}

// Every rank's `fields` compared (every_rank); a difference throws CallError(ONEBIT_MISMATCH) on every
// rank, in the C core's words (onebit_ranks_disagreement; `at`: when the ranks are compared).
inline void agree_across_ranks(onebit_comm_t comm, const std::string& who, const std::vector<AgreedField>& fields,
                               onebit_agreed_at_t at = ONEBIT_AGREED_AT_CONSTRUCTION) {
  std::vector<std::int64_t> mine;
  std::vector<const char*> names;
  for (const AgreedField& field : fields) {
    mine.push_back(field.value);
    names.push_back(field.name);
  }
  std::vector<std::int64_t> table;
  const auto rows = every_rank(comm, mine);
  for (const auto& row : rows) table.insert(table.end(), row.begin(), row.end());
  const std::string refusal = core_text([&](char* text, std::size_t size, std::size_t* length) {
    return onebit_ranks_disagreement(who.c_str(), names.data(), names.size(), table.data(), rows.size(), at, text, size,
                                     length);
  });
  if (!refusal.empty()) throw CallError(ONEBIT_MISMATCH, refusal);
}

// What every rank must share for a compressed step — each group's lr, betas, eps and weight decay
// (the three optimizers' configs begin alike), the step and the stage — given to the tag
// (onebit_tag_set_step_settings), which compares them across ranks inside the call at no extra
// message: ranks that differ fail it on every rank with ONEBIT_MISMATCH, nothing changed.
template <typename Group>
void share_step_settings(const std::string& tag, const std::vector<Group>& groups, std::int64_t step,
                         const std::string& stage) {
  std::vector<std::string> keys;
  std::vector<double> values;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& c = groups[i].config;
    const std::string group = "group " + std::to_string(i) + " ";
    const float settings[] = {c.lr, c.beta1, c.beta2, c.eps, c.weight_decay};
    const char* names[] = {"lr", "betas[0]", "betas[1]", "eps", "weight_decay"};
    for (int k = 0; k < 5; ++k) {
      keys.push_back(group + names[k]);
      values.push_back(settings[k]);
    }
  }
  keys.push_back("step");
  values.push_back(static_cast<double>(step));
  keys.push_back("stage: " + stage);
  values.push_back(0.0);
  std::vector<const char*> texts;
  for (const std::string& key : keys) texts.push_back(key.c_str());
  check_call(onebit_tag_set_step_settings(tag.c_str(), texts.data(), values.data(), values.size()));
}

}  // namespace onebit

#endif  // ONEBIT_RANK_AGREEMENT_HPP_
