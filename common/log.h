// Logging, NCCL-style: ONEBIT_DEBUG=NONE|WARN|INFO|TRACE selects the level, ONEBIT_DEBUG_FILE the
// destination. One line per message: `host:pid:tid onebit LEVEL message`. Errors are logged once,
// where they happen, with their cause; callers add context to the Error they pass on.
#pragma once

#include <string>

#include "common/error.h"

namespace onebit {

enum class LogLevel : int { NONE = 0, WARN = 1, INFO = 2, TRACE = 3 };

// The level in force (read once from ONEBIT_DEBUG).
LogLevel log_level();

// Writes one line atomically with respect to other onebit log lines of this process.
void log_write(LogLevel level, const std::string& message);

// A file name pattern as ONEBIT_DEBUG_FILE takes it: `%h` becomes the host name, `%p` the process id.
std::string expand_file_pattern(const std::string& pattern);

}  // namespace onebit

#define ONEBIT_LOG(level, ...)                                                               \
  do {                                                                                       \
    if (::onebit::log_level() >= ::onebit::LogLevel::level)                                  \
      ::onebit::log_write(::onebit::LogLevel::level, ::onebit::detail::concat(__VA_ARGS__)); \
  } while (0)
