#include "common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
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
