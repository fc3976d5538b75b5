// Logging, NCCL-style: ONEBIT_DEBUG=NONE|WARN|INFO|TRACE selects the level, ONEBIT_DEBUG_FILE the
// destination. One line per message: `host:pid:tid onebit LEVEL message`. Errors are logged once,
// where they happen, with their cause; callers add context to the Error they pass on.
#pragma once

#include <string>
#include <string_view>

#include "common/error.h"

namespace onebit {

enum class LogLevel : int { NONE = 0, WARN = 1, INFO = 2, TRACE = 3 };

// The level in force (read once from ONEBIT_DEBUG).
LogLevel log_level();

// Writes one line atomically with respect to other onebit log lines of this process.
void log_write(LogLevel level, const std::string& message);

// Text that came from the network (a peer's identity label, its error text), fit for a log line or
// an error's message: well-formed UTF-8 stays as it is, every other byte and every control
// character (newline, ESC, C1) becomes `\xNN`. A stranger can then neither forge log lines nor send
// escape sequences to a terminal. Anything a peer sends is shown through this.
std::string printable(std::string_view text);

// A file name pattern as ONEBIT_DEBUG_FILE takes it: `%h` becomes the host name, `%p` the process id.
std::string expand_file_pattern(const std::string& pattern);

}  // namespace onebit

#define ONEBIT_LOG(level, ...)                                                               \
  do {                                                                                       \
    if (::onebit::log_level() >= ::onebit::LogLevel::level)                                  \
      ::onebit::log_write(::onebit::LogLevel::level, ::onebit::detail::concat(__VA_ARGS__)); \
  } while (0)
