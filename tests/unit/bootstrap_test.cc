// The bootstrap's cryptography and records (transport/tcp/bootstrap.h): libcrypto's HMAC-SHA256
// against RFC 4231, what the identity and the key depend on, and a rank reading the root's reply
// over a real socket — accepted as sent, refused with any byte changed or for another hello.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include <string>
#include <vector>

#include "common/crypto.h"
#include "common/error.h"
#include "common/launcher.h"
#include "common/log.h"
#include "tests/support/child_output.h"
#include "transport/tcp/bootstrap.h"

namespace onebit::transport::tcp {
namespace {

TEST(Crypto, HmacSha256MatchesRfc4231) {
  // RFC 4231, test case 2.
  const auto mac = crypto::hmac_sha256(std::string_view("Jefe"),
                                       {std::string_view("what do ya want "), std::string_view("for nothing?")});
  EXPECT_EQ(crypto::hex(mac.data(), mac.size()), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Crypto, RandomBytesDiffer) {
  std::uint8_t a[16], b[16];
  crypto::random_bytes(a, sizeof(a));
  crypto::random_bytes(b, sizeof(b));
  EXPECT_FALSE(crypto::equal(a, b, sizeof(a)));
}

TEST(Bootstrap, IdentityAndKeyDependOnEverythingGiven) {
  const Credentials base(Membership{"job a", "", ""});
  const Credentials other_job(Membership{"job b", "", ""});
  const Credentials with_key(Membership{"job a", "k", ""});
  const Credentials with_secret(Membership{"job a", "", "s"});
  const Credentials other_secret(Membership{"job a", "", "t"});
  const Credentials key_as_secret(Membership{"job a", "", "k"});
  EXPECT_NE(base.identity.digest, other_job.identity.digest);
  EXPECT_EQ(base.identity.digest, with_secret.identity.digest) << "a secret keys, it does not name";
  EXPECT_EQ(base.flags, 0);
  EXPECT_EQ(with_key.flags, wire::kKeyedByAuthKey);
  EXPECT_EQ(with_secret.flags, wire::kKeyedBySecret);
  for (const Credentials* c : {&other_job, &with_key, &with_secret, &other_secret, &key_as_secret}) {
    EXPECT_NE(base.key, c->key);
  }
  EXPECT_NE(with_key.key, key_as_secret.key) << "an auth key and a secret of one text are different keys";
  EXPECT_NE(with_secret.key, other_secret.key);
  EXPECT_EQ(base.identity.label_text(), "job a");
  const Credentials long_name(Membership{std::string(100, 'x'), "", ""});
  EXPECT_EQ(long_name.identity.label_text(), std::string(60, 'x') + "...");
}

TEST(Bootstrap, TextFromTheNetworkIsShownPrintable) {
  // Controls (newline, ESC, DEL, C1's CSI), stray and overlong bytes and surrogates become \xNN;
  // well-formed UTF-8 stays.
  EXPECT_EQ(printable("job a \xe2\x80\x94 \xc3\xa9 \xf0\x9f\x99\x82"), "job a \xe2\x80\x94 \xc3\xa9 \xf0\x9f\x99\x82");
  EXPECT_EQ(printable("a\nb\r\x1b[2J\x7f"), "a\\x0ab\\x0d\\x1b[2J\\x7f");
  EXPECT_EQ(printable("\xc2\x9b"
                      "31m"),
            "\\xc2\\x9b31m");
  EXPECT_EQ(printable("\xc0\xaf \xed\xa0\x80 \xff \xe2\x80"), "\\xc0\\xaf \\xed\\xa0\\x80 \\xff \\xe2\\x80");
  EXPECT_EQ(printable(std::string("nul\0x", 5)), "nul\\x00x");
  Membership forged{"x\nhost:1:1 onebit WARN forged", "", ""};
  EXPECT_EQ(Credentials(forged).identity.label_text(), "x\\x0ahost:1:1 onebit WARN forged");
}

TEST(Bootstrap, RecordsRoundTrip) {
  wire::BootstrapChallenge challenge;
  challenge.flags = wire::kKeyedBySecret;
  challenge.nonce[3] = 7;
  challenge.identity = Credentials(Membership{"job a", "", ""}).identity;
  const auto c = wire::BootstrapChallenge::decode(challenge.encode().data(), "x");
  EXPECT_EQ(c.encode(), challenge.encode());
  EXPECT_EQ(c.identity.label_text(), "job a");
  wire::BootstrapHello hello;
  hello.flags = 3;
  hello.rank = 5;
  hello.size = 9;
  hello.sockets_per_peer = 2;
  hello.listener.family = 4;
  hello.nonce[0] = 1;
  hello.identity = c.identity;
  hello.mac[31] = 0xAB;
  EXPECT_EQ(wire::BootstrapHello::decode(hello.encode().data(), "x").encode(), hello.encode());
}

// The reply a root sends `hello` for a 2-rank table, MAC'd under `credentials`.
std::vector<std::uint8_t> reply_for(const wire::BootstrapHello& hello, const Credentials& credentials) {
  wire::BootstrapReplyHead head;
  head.size = 2;
  head.job_id = 42;
  std::vector<std::uint8_t> reply(wire::BootstrapReplyHead::kSize + 2 * wire::WireAddress::kSize);
  wire::Writer w(reply.data());
  w.bytes(head.encode().data(), wire::BootstrapReplyHead::kSize);
  for (int r = 0; r < 2; ++r) {
    const std::uint8_t ip[16] = {127, 0, 0, 1};
    w.put(std::uint16_t{4}).put(static_cast<std::uint16_t>(10000 + r)).bytes(ip, sizeof(ip));
  }
  const auto mac = crypto::hmac_sha256(
      credentials.key, {std::string_view("reply"), hello.encode(), crypto::Bytes(reply.data(), reply.size())});
  reply.insert(reply.end(), mac.begin(), mac.end());
  return reply;
}

// What read_root_reply makes of `bytes` sent by a root: "" when accepted, else the error.
std::string read_reply(const std::vector<std::uint8_t>& bytes, const wire::BootstrapHello& hello,
                       const Credentials& credentials) {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  EXPECT_EQ(::write(fds[0], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  std::string error;
  try {
    const auto result = read_root_reply(fds[1], 2, Clock::now() + std::chrono::seconds(5), hello, credentials);
    EXPECT_EQ(result.job_id, 42u);
    EXPECT_EQ(result.listeners.size(), 2u);
  } catch (const Error& e) {
    error = e.what();
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return error;
}

TEST(Bootstrap, ARankTakesOnlyTheReplyMadeForItsHello) {
  const Credentials credentials(Membership{"job a", "", "secret"});
  wire::BootstrapHello hello;
  hello.rank = 1;
  hello.size = 2;
  hello.nonce[0] = 9;
  const auto reply = reply_for(hello, credentials);
  EXPECT_EQ(read_reply(reply, hello, credentials), "");
  // Any byte changed, the head's, the table's or the MAC's: refused.
  for (std::size_t i = 0; i < reply.size(); ++i) {
    if (i >= 4 && i < 8) continue;  // magic and version: refused by the decoder, tested in wire_test
    auto changed = reply;
    changed[i] ^= 0x01;
    const std::string error = read_reply(changed, hello, credentials);
    EXPECT_NE(error, "") << "byte " << i;
  }
  // The reply to another hello (another nonce): a replay, refused.
  wire::BootstrapHello other = hello;
  other.nonce[0] = 10;
  EXPECT_NE(read_reply(reply_for(other, credentials), hello, credentials).find("fails its MAC"), std::string::npos);
  // A root that has not the secret.
  const Credentials guess(Membership{"job a", "", "guess"});
  EXPECT_NE(read_reply(reply_for(hello, guess), hello, credentials).find("fails its MAC"), std::string::npos);
}

// launcher_job_identity() in a child whose environment has `variables` (parameters are read once
// per process).
std::string identity_with(const std::vector<std::pair<const char*, const char*>>& variables) {
  return testing::child_output([&] {
    for (const char* name :
         {"ONEBIT_JOB_ID", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "SLURM_STEP_ID",
          "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "MASTER_ADDR", "MASTER_PORT"}) {
      ::unsetenv(name);
    }
    for (const auto& [name, value] : variables) ::setenv(name, value, 1);
    return launcher_job_identity();
  });
}

TEST(Launcher, JobIdentityNamesEachLaunchersJobAndAttempt) {
  EXPECT_EQ(identity_with({}), "");
  EXPECT_EQ(identity_with({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}}), "master 10.0.0.1:29500");
  EXPECT_EQ(identity_with({{"TORCHELASTIC_RUN_ID", "r7"},
                           {"TORCHELASTIC_RESTART_COUNT", "2"},
                           {"MASTER_ADDR", "h"},
                           {"MASTER_PORT", "1"}}),
            "torchrun run r7 restart 2, master h:1");
  EXPECT_EQ(identity_with({{"SLURM_JOB_ID", "88"}, {"SLURM_STEP_ID", "3"}}), "slurm job 88.3");
  EXPECT_EQ(identity_with({{"PMIX_NAMESPACE", "prterun-h-1234@1"}}), "mpi job prterun-h-1234@1");
  // ONEBIT_JOB_ID is the whole identity: for launchers whose variables differ between ranks.
  EXPECT_EQ(identity_with({{"ONEBIT_JOB_ID", "exp-42"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}), "job exp-42");
}

}  // namespace
}  // namespace onebit::transport::tcp
