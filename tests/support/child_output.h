// Runs a body in a forked child process and returns the text it produced. For code that reads the
// environment once per process (ONEBIT_* parameters, the launcher's job identity): each child
// reads it afresh, with the variables the body sets.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

namespace onebit::testing {

inline std::string child_output(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "child_output: pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string text = body();
    [[maybe_unused]] ssize_t w = ::write(fds[1], text.data(), text.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) text.append(buffer, n);
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return text;
}

}  // namespace onebit::testing
