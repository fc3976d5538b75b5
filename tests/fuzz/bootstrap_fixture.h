// The rank side that fuzz_bootstrap_reply reads a reply as, and make_seeds writes valid replies
// for: a fixed identity, secret and hello, so that a seed's MAC is right and the fuzzer starts past it.
#pragma once

#include "transport/tcp/bootstrap.h"

namespace onebit::fuzzing {

inline transport::tcp::Credentials reply_credentials(bool keyed) {
  return transport::tcp::Credentials(transport::tcp::Membership{"fuzz job", "", keyed ? "fuzz secret" : ""});
}

inline wire::BootstrapHello reply_hello() {
  wire::BootstrapHello hello;
  hello.rank = 1;
  hello.size = 2;
  hello.nonce = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  return hello;
}

}  // namespace onebit::fuzzing
