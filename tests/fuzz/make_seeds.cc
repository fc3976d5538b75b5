// Writes the seed corpora of the fuzz targets (valid records of every kind) into DIR/<target>/.
// Run once when the wire format changes: make_seeds tests/fuzz/corpus
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/siphash.h"
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
  wire::SegmentHeader segment;
  segment.key = {5, 1, wire::Kind::kWorkerBits, 0};
  segment.total_bytes = 128;
  segment.segment_bytes = 128;
  write(dir + "/fuzz_wire/segment", with_selector(3, segment.encode()));

  // A good reply for 2 ranks (no key): selector bytes (world 2 → 1, no auth → 0), head, table, mac.
  std::vector<std::uint8_t> reply = {1, 0};
  const auto h = head.encode();
  reply.insert(reply.end(), h.begin(), h.end());
  for (int r = 0; r < 2; ++r) {
    std::uint8_t address[20] = {4, 0, static_cast<std::uint8_t>(0x10 + r), 0x27, 127, 0, 0, 1};
    reply.insert(reply.end(), address, address + 20);
  }
  for (int i = 0; i < 8; ++i) reply.push_back(0);
  write(dir + "/fuzz_bootstrap_reply/ok_two_ranks", reply);
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
