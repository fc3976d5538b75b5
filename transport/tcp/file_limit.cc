#include "transport/tcp/file_limit.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "common/error.h"
#include "common/log.h"

namespace onebit::transport::tcp {
namespace {

// Descriptors this process has open (entries of /proc/self/fd, less the one reading it): `all`
// where there is none left to read it with, 0 where /proc is not mounted (the check then counts on
// the limit alone).
std::size_t open_descriptors(std::size_t all) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return errno == EMFILE ? all : 0;
  std::size_t entries = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++entries;
  }
  ::closedir(dir);
  return entries > 0 ? entries - 1 : 0;
}

std::string limit_text(rlim_t limit) { return limit == RLIM_INFINITY ? "unlimited" : std::to_string(limit); }

}  // namespace

void make_room_for_descriptors(std::size_t needed, const std::string& what) {
  static std::mutex mutex;  // two communicators formed at once raise the limit once
  const std::lock_guard<std::mutex> lock(mutex);
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;  // nothing to go by: the sockets will say
  const std::size_t open = open_descriptors(limit.rlim_cur);
  const auto fits = [&](rlim_t soft) { return soft == RLIM_INFINITY || open + needed <= soft; };
  if (fits(limit.rlim_cur)) return;
  const rlim_t before = limit.rlim_cur;
  std::string raise_failed;
  if (limit.rlim_max != limit.rlim_cur) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      raise_failed = std::string(" (raising it to the hard limit failed: ") + std::strerror(errno) + ")";
    } else {
      limit = raised;
      ONEBIT_LOG(INFO, what, " needs ", needed, " more file descriptors (", open,
                 " open): raised the open-files limit (ulimit -n) from ", limit_text(before), " to its hard limit ",
                 limit_text(limit.rlim_max));
    }
  }
  ONEBIT_CHECK(fits(limit.rlim_cur), ONEBIT_SYSTEM_ERROR, what, " needs ", needed, " more file descriptors; ", open,
               " are open and the open-files limit is ", limit_text(limit.rlim_cur), " (ulimit -n; hard limit ",
               limit_text(limit.rlim_max), ")", raise_failed,
               ". Raise it where the job starts: ulimit -n 65536, LimitNOFILE= for a systemd unit, "
               "docker run --ulimit nofile=65536");
}

std::string descriptor_note(int err) {
  if (err == ENFILE) return " (the system's limit of open files, fs.file-max, is reached)";
  rlimit limit{};
  if (err != EMFILE || ::getrlimit(RLIMIT_NOFILE, &limit) != 0) return "";
  return " (" + std::to_string(open_descriptors(limit.rlim_cur)) + " files open; the open-files limit, ulimit -n, is " +
         limit_text(limit.rlim_cur) + ")";
}

}  // namespace onebit::transport::tcp
