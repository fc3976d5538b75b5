// Every ONEBIT_* environment variable, in one place. Each is typed, has a default, is read once
// (on first use, thread-safely) and is logged at INFO when the environment sets it. docs/env.md is
// generated from this list (`onebit-info --env-markdown`) and a test keeps the two in sync.
//
// X(Name, type, "SUFFIX", default, "documentation")  — the variable is ONEBIT_<SUFFIX>, read with
// onebit::param::Name(). Types: Int (int64_t) or Str (std::string).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#define ONEBIT_PARAMS(X)                                                                        \
  X(Debug, Str, "DEBUG", "WARN",                                                                \
    "Log level: NONE, WARN, INFO or TRACE (case-insensitive). Lines go to stderr as "           \
    "`host:pid:tid onebit LEVEL message`.")                                                     \
  X(DebugFile, Str, "DEBUG_FILE", "",                                                           \
    "Write the log to this file instead of stderr. `%h` is replaced by the host name and `%p` " \
    "by the process id, so each rank can have its own file.")                                   \
  X(Simd, Str, "SIMD", "",                                                                      \
    "CPU kernel set: `scalar`, `avx2` or `avx512`. Empty: the best one this CPU runs. Naming a " \
    "set the CPU cannot run is an error (ONEBIT_INVALID_ARGUMENT), not a crash.")

namespace onebit::param {

using Int = std::int64_t;
using Str = std::string;

#define ONEBIT_DECLARE_PARAM(name, type, suffix, def, doc) const type& name();
ONEBIT_PARAMS(ONEBIT_DECLARE_PARAM)
#undef ONEBIT_DECLARE_PARAM

struct Description {
  const char* env;           // "ONEBIT_DEBUG"
  const char* type;          // "int" or "string"
  const char* default_text;  // the default as text
  const char* doc;
};
// The documented list, in declaration order.
const std::vector<Description>& descriptions();

// A Markdown table of descriptions(): the body of docs/env.md.
std::string markdown_table();

}  // namespace onebit::param
