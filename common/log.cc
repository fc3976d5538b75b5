#include "common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <mutex>

#include "common/params.h"

namespace onebit {
namespace {

std::string host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

// The length of the well-formed UTF-8 sequence at text[at] of a printable character, or 0: a
// control character (C0, DEL, C1), a stray or overlong byte, a surrogate, past U+10FFFF.
std::size_t printable_sequence(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return lead >= 0x20 && lead != 0x7f ? 1 : 0;
  const std::size_t length = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc2 ? 2 : 0;
  if (length == 0 || lead > 0xf4 || at + length > text.size()) return 0;
  std::uint32_t code = lead & (0x7f >> length);
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xc0) != 0x80) return 0;
    code = code << 6 | (byte(at + i) & 0x3f);
  }
  const std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  const bool control = code <= 0x9f;  // C1: U+0080..U+009F
  const bool surrogate = code >= 0xd800 && code <= 0xdfff;
  return code < least[length] || control || surrogate || code > 0x10ffff ? 0 : length;
}

std::string upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

// The log's sink and level, set up on first use.
struct Logger {
  LogLevel level = LogLevel::WARN;
  std::FILE* out = stderr;
  std::string prefix;  // "host:pid"
  std::mutex mutex;
  std::string setup_warning;

  Logger() {
    prefix = host_name() + ":" + std::to_string(getpid());
    const std::string name = upper(param::Debug());
    if (name == "NONE") level = LogLevel::NONE;
    else if (name == "WARN") level = LogLevel::WARN;
    else if (name == "INFO") level = LogLevel::INFO;
    else if (name == "TRACE") level = LogLevel::TRACE;
    else setup_warning = "ONEBIT_DEBUG='" + param::Debug() + "' is not NONE, WARN, INFO or TRACE; using WARN";

    const std::string& pattern = param::DebugFile();
    if (!pattern.empty()) {
      const std::string path = expand_file_pattern(pattern);
      if (std::FILE* file = std::fopen(path.c_str(), "a")) {
        out = file;
      } else {
        setup_warning = "ONEBIT_DEBUG_FILE='" + pattern + "': cannot open '" + path + "'; logging to stderr";
      }
    }
  }
};

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length = printable_sequence(text, at);
    if (length > 0) {
      out.append(text.substr(at, length));
      at += length;
      continue;
    }
    char escaped[5];
    std::snprintf(escaped, sizeof(escaped), "\\x%02x", static_cast<unsigned char>(text[at++]));
    out += escaped;
  }
  return out;
}

namespace {

Logger& logger() {
  static Logger* instance = [] {
    // Leaked on purpose: onebit logs from destructors of static objects and atexit handlers.
    auto* made = new Logger();
    if (!made->setup_warning.empty() && made->level >= LogLevel::WARN) {
      std::fprintf(made->out, "%s onebit WARN %s\n", made->prefix.c_str(), made->setup_warning.c_str());
    }
    if (made->level >= LogLevel::INFO) {
      std::fprintf(made->out, "%s onebit INFO ONEBIT_DEBUG=%s, ONEBIT_DEBUG_FILE=%s\n", made->prefix.c_str(),
                   param::Debug().c_str(), param::DebugFile().c_str());
    }
    return made;
  }();
  return *instance;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::WARN: return "WARN";
    case LogLevel::INFO: return "INFO";
    case LogLevel::TRACE: return "TRACE";
    default: return "NONE";
  }
}

}  // namespace

LogLevel log_level() { return logger().level; }

void log_write(LogLevel level, const std::string& message) {
  Logger& log = logger();
  const long tid = syscall(SYS_gettid);
  std::string line = log.prefix + ":" + std::to_string(tid) + " onebit " + level_name(level) + " " + message + "\n";
  std::lock_guard<std::mutex> lock(log.mutex);
  std::fwrite(line.data(), 1, line.size(), log.out);
  std::fflush(log.out);
}

std::string expand_file_pattern(const std::string& pattern) {
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'h') {
      path += host_name(), ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      path += std::to_string(getpid()), ++i;
    } else {
      path += pattern[i];
    }
  }
  return path;
}

}  // namespace onebit
