// Writes the seed corpora of the fuzz targets (valid records of every kind) into DIR/<target>/.
// Run once when the wire format changes: make_seeds tests/fuzz/corpus
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/fuzz/bootstrap_fixture.h"
#include "transport/wire.h"

using namespace onebit;

static void write(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

template <typename A>
static std::vector<std::uint8_t> with_selector(std::uint8_t selector, const A& record) {
  std::vector<std::uint8_t> out{selector};
  out.insert(out.end(), record.begin(), record.end());
  return out;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  ::mkdir((dir + "/fuzz_wire").c_str(), 0755);
  ::mkdir((dir + "/fuzz_bootstrap_reply").c_str(), 0755);
  wire::Hello hello;
  hello.job_id = 7;
  hello.from_rank = 1;
  hello.sockets_per_peer = 2;
  write(dir + "/fuzz_wire/hello", with_selector(0, hello.encode()));
  wire::BootstrapHello bootstrap;
  bootstrap.rank = 3;
  bootstrap.size = 4;
  bootstrap.listener.family = 4;
  write(dir + "/fuzz_wire/bootstrap_hello", with_selector(1, bootstrap.encode()));
  wire::BootstrapReplyHead head;
  head.size = 2;
  write(dir + "/fuzz_wire/reply_head", with_selector(2, head.encode()));
  wire::BootstrapChallenge challenge;
  challenge.flags = wire::kKeyedBySecret;
  challenge.identity = fuzzing::reply_credentials(true).identity;
  write(dir + "/fuzz_wire/bootstrap_challenge", with_selector(4, challenge.encode()));
  wire::SegmentHeader segment;
  segment.key = {5, 1, wire::Kind::kWorkerBits, 0};
  segment.total_bytes = 128;
  segment.segment_bytes = 128;
  write(dir + "/fuzz_wire/segment", with_selector(3, segment.encode()));

  // Good replies for 2 ranks, without and with a secret: selector bytes (world 2 → 1, keyed → 1),
  // head, table, and the MAC the fixture's rank expects.
  for (const bool keyed : {false, true}) {
    const auto head_bytes = head.encode();
    std::vector<std::uint8_t> body(head_bytes.begin(), head_bytes.end());
    for (int r = 0; r < 2; ++r) {
      std::uint8_t address[20] = {4, 0, static_cast<std::uint8_t>(0x10 + r), 0x27, 127, 0, 0, 1};
      body.insert(body.end(), address, address + 20);
    }
    const auto mac = crypto::hmac_sha256(
        fuzzing::reply_credentials(keyed).key,
        {std::string_view("reply"), fuzzing::reply_hello().encode(), crypto::Bytes(body.data(), body.size())});
    std::vector<std::uint8_t> reply = {1, static_cast<std::uint8_t>(keyed)};
    reply.insert(reply.end(), body.begin(), body.end());
    reply.insert(reply.end(), mac.begin(), mac.end());
    write(dir + "/fuzz_bootstrap_reply/" + (keyed ? "ok_two_ranks_keyed" : "ok_two_ranks"), reply);
  }
  // An error reply: status 3 and its text.
  wire::BootstrapReplyHead error;
  error.status = 3;
  std::vector<std::uint8_t> failed = {0, 0};
  const auto e = error.encode();
  failed.insert(failed.end(), e.begin(), e.end());
  const std::string text = "bootstrap timed out: rank(s) 1 never reached the root";
  failed.push_back(static_cast<std::uint8_t>(text.size()));
  failed.push_back(0);
  failed.insert(failed.end(), text.begin(), text.end());
  write(dir + "/fuzz_bootstrap_reply/error_text", failed);
  return 0;
}
