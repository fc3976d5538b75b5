// Failures through the shipped C ABI, ranks as real processes on loopback: bad arguments, NaN,
// mismatches, killed, stalled and stopped peers, cut connections, destroy during a call — each an
// error naming the problem, nothing changed, never a hang.

#include <dirent.h>
#include <sched.h>
#include <sys/resource.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/half.h"
#include "onebit/onebit.h"
#include "tests/engine/engine_jobs.h"
#include "tests/support/float32_oracle.h"
#include "tests/support/float64_reference.h"
#include "tests/support/multiprocess.h"
#include "tests/support/rank_record.h"

namespace onebit::testing {
namespace {

// ---- errors ----

// The test support itself: a failed child rank says why — the condition and where, the exception,
// the signal — not just an exit code.
TEST(RankOutcomes, AFailedRankSaysWhy) {
  const std::vector<RankOutcome> outcomes = run_ranks(4, [](int rank) -> int {
    const int answer = 41;
    if (rank == 1) RANK_FAILS_IF(answer != 42, 7);
    if (rank == 2) throw std::runtime_error("rank 2 gives up");
    if (rank == 3) std::abort();
    return 0;
  });
  EXPECT_EQ(outcomes[0].exit_code, 0);
  EXPECT_EQ(outcomes[0].reason, "");
  EXPECT_EQ(outcomes[1].exit_code, 7);
  EXPECT_NE(outcomes[1].reason.find("failures_test.cc:"), std::string::npos) << outcomes[1].reason;
  EXPECT_NE(outcomes[1].reason.find(": answer != 42"), std::string::npos) << outcomes[1].reason;
  EXPECT_EQ(outcomes[2].exit_code, 99);
  EXPECT_EQ(outcomes[2].reason, "threw: rank 2 gives up");
  EXPECT_EQ(outcomes[3].exit_code, 128 + SIGABRT);
  EXPECT_EQ(outcomes[3].reason, "killed by signal " + std::to_string(SIGABRT));
}

TEST(Errors, TagStateCheckpointCallsCheckTheirArguments) {
  std::vector<float> buffer(64, 1.0f), worker(64), server(64);
  std::size_t workers = 0, servers = 0;
  EXPECT_EQ(onebit_tag_state_size("nope", &workers, &servers), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("no tag named 'nope'"), std::string::npos);
  ASSERT_EQ(onebit_tag("ckpt", buffer.data(), 64, ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  ASSERT_EQ(onebit_tag_state_size("ckpt", &workers, &servers), ONEBIT_SUCCESS);
  EXPECT_EQ(workers, 64u);
  EXPECT_EQ(servers, 0u);  // before the first call
  EXPECT_EQ(onebit_tag_state_save("ckpt", worker.data(), server.data()), ONEBIT_SUCCESS);
  EXPECT_EQ(worker, std::vector<float>(64, 0.0f));
  EXPECT_EQ(onebit_tag_state_load("ckpt", worker.data(), 63, server.data(), 0), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("has 64 elements; the saved worker error has 63"), std::string::npos);
  EXPECT_EQ(onebit_tag_state_load("ckpt", worker.data(), 64, server.data(), 0), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_untag(buffer.data()), ONEBIT_SUCCESS);
}

TEST(Errors, AdamConfigOutOfRangeIsRefused) {
  onebit_adam_config_t config{0.01f, 1.5f, 0.999f, 1e-8f, 0.0f, 10};  // beta1 >= 1
  EXPECT_EQ(onebit_adam_compressing(&config, 0), -1);
  EXPECT_NE(std::string(onebit_last_error()).find("betas (1.5"), std::string::npos) << onebit_last_error();
  float p = 1, m = 0, v = 0, g = 1;
  EXPECT_EQ(onebit_adam_warmup_step(&config, &p, &m, &v, &g, 1), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(p, 1.0f);
  config.beta1 = 0.9f;
  EXPECT_EQ(onebit_adam_warmup_step(&config, nullptr, &m, &v, &g, 1), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_adam_compressing(&config, 10), 1);
  EXPECT_EQ(onebit_adam_compressing(nullptr, 10), -1);
}

TEST(Errors, BadArgumentsAreReportedAndChangeNothing) {
  onebit_comm_t comm = nullptr;
  EXPECT_EQ(onebit_comm_init(nullptr, 0, 1, "127.0.0.1:1"), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_comm_init(&comm, 3, 2, "127.0.0.1:1"), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("rank 3 is out of range for size 2"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(onebit_comm_init(&comm, 0, 2, "no-port-here"), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("not host:port"), std::string::npos) << onebit_last_error();
  // More ranks than the ring numbers: refused before any socket. (Read, not run: the ring's plan
  // doubled its segment until it wrapped to 0, a division by zero at the first untagged call.)
  EXPECT_EQ(onebit_comm_init(&comm, 0, 32769, "127.0.0.1:1"), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("a communicator of 32769 ranks: onebit takes at most 32768"),
            std::string::npos)
      << onebit_last_error();
  ASSERT_EQ(onebit_comm_init(&comm, 0, 1, nullptr), ONEBIT_SUCCESS) << onebit_last_error();

  std::vector<float> buffer = {1, 2, 3, 4};
  const std::vector<float> before = buffer;
  EXPECT_EQ(onebit_allreduce(nullptr, buffer.data(), 4, ONEBIT_FLOAT32, ONEBIT_SUM), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_allreduce(comm, nullptr, 4, ONEBIT_FLOAT32, ONEBIT_SUM), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_allreduce(comm, buffer.data(), 4, static_cast<onebit_dtype_t>(7), ONEBIT_SUM),
            ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("unknown dtype 7"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(onebit_allreduce(comm, buffer.data(), 4, ONEBIT_FLOAT32, static_cast<onebit_op_t>(9)),
            ONEBIT_INVALID_ARGUMENT);
  ASSERT_EQ(onebit_tag("t", buffer.data(), 4, ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_allreduce(comm, buffer.data(), 3, ONEBIT_FLOAT32, ONEBIT_SUM), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("tagged 't' with 4 elements of float32 but the call passes 3"),
            std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(onebit_tag("t", buffer.data(), 5, ONEBIT_FLOAT32), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_tag("other", buffer.data(), 4, ONEBIT_FLOAT32), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_tag(nullptr, buffer.data(), 4, ONEBIT_FLOAT32), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_untag(&buffer[1]), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("is not tagged"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(buffer, before);
  EXPECT_EQ(onebit_allreduce(comm, buffer.data(), 4, ONEBIT_FLOAT32, ONEBIT_AVG), ONEBIT_SUCCESS);
  EXPECT_EQ(buffer, before) << "one rank: the average is the buffer";
  EXPECT_STREQ(onebit_last_error(), "");
  EXPECT_EQ(onebit_untag(buffer.data()), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_comm_destroy(comm), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_comm_destroy(nullptr), ONEBIT_SUCCESS);
}

TEST(Errors, NaNInATaggedBufferFailsEveryRankAndChangesNothing) {
  const int world = 3;
  const std::size_t n = 2000;
  SharedMemory shared(world * (sizeof(Record) + 2 * n * sizeof(float)));
  auto* records = shared.as<Record>();
  auto* outputs = reinterpret_cast<float*>(records + world);
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::vector<float> buffer = input(rank, 0, n, 3);
    onebit_tag("p", buffer.data(), n, ONEBIT_FLOAT32);
    RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 2);
    // Call 1 with a NaN on rank 1: everyone fails, nothing changes.
    std::vector<float> poisoned = input(rank, 1, n, 3);
    if (rank == 1) poisoned[1234] = NAN;
    std::copy(poisoned.begin(), poisoned.end(), buffer.begin());
    records[rank].set(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG));
    for (std::size_t i = 0; i < n; ++i) {
      RANK_FAILS_IF(std::memcmp(&buffer[i], &poisoned[i], 4) != 0, 3);  // the buffer is untouched
    }
    // The same call with clean data then gives what a run without the failed call gives.
    const auto clean = input(rank, 1, n, 3);
    std::copy(clean.begin(), clean.end(), buffer.begin());
    RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 4);
    std::memcpy(outputs + rank * 2 * n, buffer.data(), n * 4);
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, ONEBIT_NUMERIC_ERROR) << records[r].message;
    EXPECT_NE(std::string(records[r].message).find("rank 1's input holds NaN or Inf"), std::string::npos)
        << records[r].message;
  }
  Reference reference(world, n);
  for (int call = 0; call < 2; ++call) {
    std::vector<std::vector<float>> x;
    for (int r = 0; r < world; ++r) x.push_back(input(r, call, n, 3));
    const auto ref = reference.step(x, false);
    if (call == 1) {
      for (int r = 0; r < world; ++r) expect_matches(outputs + r * 2 * n, ref, reference.ambiguous(), "after NaN");
    }
  }
}

// Ranks whose step settings differ (onebit_tag_set_step_settings: one rank's scheduler stepped)
// fail that call on every rank with ONEBIT_MISMATCH naming the rank and, on each rank, its own
// values, with every buffer and error state unchanged: the call retried with equal settings gives
// bit for bit what a job that never failed gives. `local_size` 2 runs it hierarchically (2 hosts of
// 2), where `differing` {1, 3} (local rank 1 on both hosts) agree within each rail and are caught
// only by comparing the rails.
struct SettingsCase {
  int world, local_size;
  std::vector<int> differing;
  std::string says;  // in every rank's error
};

std::vector<float> last_outputs_of_settings_job(const SettingsCase& c, bool differ, RankRecords* records) {
  const std::size_t n = 3000;
  SharedMemory shared(c.world * n * sizeof(float));
  auto* outputs = shared.as<float>();
  const int port = free_port();
  auto outcomes = run_ranks(
      c.world,
      [&](int rank) {
        ::setenv("ONEBIT_LOCAL_SIZE", std::to_string(c.local_size).c_str(), 1);
        onebit_comm_t comm = join_loopback(rank, c.world, port, 60000);
        std::vector<float> buffer = input(rank, 0, n, 3);
        RANK_FAILS_IF(onebit_tag("m", buffer.data(), n, ONEBIT_FLOAT32) != ONEBIT_SUCCESS, 2);
        const char* keys[] = {"group 0 lr", "step", "stage: compression"};
        double values[] = {0.001, 7, 0};
        RANK_FAILS_IF(onebit_tag_set_step_settings("m", keys, values, 3) != ONEBIT_SUCCESS, 3);
        RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 4);
        const std::vector<float> next = input(rank, 1, n, 3);
        std::copy(next.begin(), next.end(), buffer.begin());
        values[1] = 8;
        if (differ) {
          const bool odd_one = std::count(c.differing.begin(), c.differing.end(), rank) > 0;
          if (odd_one) values[0] = 0.5;
          onebit_tag_set_step_settings("m", keys, values, 3);
          (*records)[rank].set(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG));
          RANK_FAILS_IF(buffer != next, 5);  // untouched
          values[0] = 0.001;
        }
        RANK_FAILS_IF(onebit_tag_set_step_settings("m", keys, values, 3) != ONEBIT_SUCCESS, 6);
        RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 7);
        std::copy(buffer.begin(), buffer.end(), outputs + rank * n);
        onebit_comm_destroy(comm);
        return 0;
      },
      std::chrono::seconds(60));
  for (int r = 0; r < c.world; ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].reason;
  return std::vector<float>(outputs, outputs + c.world * n);
}

void expect_settings_mismatch_fails_every_rank(const SettingsCase& c) {
  RankRecords records(c.world), unused(c.world);
  const std::vector<float> after_failure = last_outputs_of_settings_job(c, true, &records);
  const std::vector<float> never_failed = last_outputs_of_settings_job(c, false, &unused);
  for (int r = 0; r < c.world; ++r) {
    const bool odd_one = std::count(c.differing.begin(), c.differing.end(), r) > 0;
    const std::string message = records[r].message;
    EXPECT_EQ(records[r].code, ONEBIT_MISMATCH) << "rank " << r << ": " << message;
    for (const std::string& part : {c.says,
                                    std::string(odd_one ? "This rank's: group 0 lr 0.5, step 8, stage: compression"
                                                        : "This rank's: group 0 lr 0.001, step 8, stage: compression"),
                                    std::string("No buffer or error state changed on any rank")}) {
      EXPECT_NE(message.find(part), std::string::npos) << "rank " << r << " misses '" << part << "': " << message;
    }
  }
  EXPECT_TRUE(after_failure == never_failed) << "the call retried after the refused one differs from a job's that "
                                                "never failed";
}

TEST(Errors, RanksWhoseStepSettingsDifferFailTheCallOnEveryRankAndChangeNothing) {
  expect_settings_mismatch_fails_every_rank({3, 1, {2}, "rank 2's settings for this call differ from rank 0's"});
  expect_settings_mismatch_fails_every_rank({4, 2, {3}, "rank 3's settings for this call differ from rank 1's"});
  expect_settings_mismatch_fails_every_rank({4, 2, {1, 3}, "rank 1's settings for this call differ from rank 0's"});
}

TEST(Errors, CountMismatchAcrossRanksNamesBothSides) {
  const int world = 2;
  RankRecords records(world);
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    onebit_comm_t comm = join_loopback(rank, world, port);
    const std::size_t n = rank == 0 ? 1000 : 1200;
    std::vector<float> buffer(n, 1.0f);
    onebit_tag("m", buffer.data(), n, ONEBIT_FLOAT32);
    records[rank].set(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG));
    for (float v : buffer) {
      RANK_FAILS_IF(v != 1.0f, 2);
    }
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    const std::string message = records[r].message;
    // The rank that sees the other's header reports a mismatch with both counts; the other may see
    // the connection close first (remote error naming its peer).
    if (records[r].code == ONEBIT_MISMATCH) {
      EXPECT_NE(message.find("1000 elements"), std::string::npos) << message;
      EXPECT_NE(message.find("1200 elements"), std::string::npos) << message;
    } else {
      EXPECT_EQ(records[r].code, ONEBIT_REMOTE_ERROR) << message;
      EXPECT_NE(message.find("rank " + std::to_string(1 - r)), std::string::npos) << message;
    }
  }
  EXPECT_TRUE(records[0].code == ONEBIT_MISMATCH || records[1].code == ONEBIT_MISMATCH);
}

TEST(Errors, KilledPeerFailsTheSurvivorsNamingIt) {
  const int world = 3;
  RankRecords records(world);
  const int port = free_port();
  auto outcomes = run_ranks(
      world,
      [&](int rank) {
        onebit_comm_t comm = join_loopback(rank, world, port);
        std::vector<float> buffer(100000, 1.0f);
        onebit_tag("k", buffer.data(), buffer.size(), ONEBIT_FLOAT32);
        if (rank == 2) ::raise(SIGKILL);  // dies with its connections open, as a crashed trainer does
        records[rank].set(onebit_allreduce(comm, buffer.data(), buffer.size(), ONEBIT_FLOAT32, ONEBIT_AVG));
        return onebit_comm_destroy(comm) == ONEBIT_SUCCESS ? 0 : 5;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(outcomes[2].exit_code, 128 + SIGKILL);
  int naming_rank_2 = 0;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, ONEBIT_REMOTE_ERROR) << records[r].message;
    // "rank 2 closed the connection", "lost the connection to rank 2: Connection reset by peer", or
    // the other survivor's abort naming rank 2. A survivor that had not yet entered the call can
    // instead see the other survivor leave mid-message, and then names that one.
    naming_rank_2 += std::string(records[r].message).find("rank 2") != std::string::npos;
  }
  EXPECT_GE(naming_rank_2, 1) << records[0].message << "\n" << records[1].message;
}

// ---- the open-files limit (transport/tcp/file_limit.h) ----

// Descriptors this process has open.
rlim_t open_descriptors() {
  rlim_t open = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (const dirent* entry = ::readdir(dir)) open += entry->d_name[0] != '.';
    ::closedir(dir);
  }
  return open - 1;  // the directory's own
}

// Every rank of `world` sets its open-files limit to `limit_of(rank, descriptors it has open)`, then
// joins with `sockets` per peer: the outcome of the join in `records`; a rank that joined checks an
// exact untagged sum and that its soft limit is `raised_to`. The job must end within `deadline`.
void join_under_open_files_limit(int world, int sockets, const std::function<rlimit(int, rlim_t)>& limit_of,
                                 RankRecords& records, rlim_t raised_to, std::chrono::seconds deadline) {
  const int port = free_port();
  auto outcomes = run_ranks(
      world,
      [&](int rank) {
        const rlimit limit = limit_of(rank, open_descriptors());
        RANK_FAILS_IF(::setrlimit(RLIMIT_NOFILE, &limit) != 0, 2);
        onebit_comm_t comm = nullptr;
        const onebit_config_t config{60000, sockets, nullptr, nullptr, nullptr, nullptr};
        records[rank].set(onebit_comm_init_config(&comm, rank, world, root_at(port).c_str(), &config));
        if (records[rank].code != ONEBIT_SUCCESS) return 0;
        std::vector<float> ones(5, 1.0f);
        RANK_FAILS_IF(onebit_allreduce(comm, ones.data(), ones.size(), ONEBIT_FLOAT32, ONEBIT_SUM) != ONEBIT_SUCCESS,
                      3);
        RANK_FAILS_IF(ones != std::vector<float>(5, static_cast<float>(world)), 4);
        rlimit now{};
        RANK_FAILS_IF(::getrlimit(RLIMIT_NOFILE, &now) != 0 || now.rlim_cur != raised_to, 5);
        return onebit_comm_destroy(comm) == ONEBIT_SUCCESS ? 0 : 6;
      },
      deadline);
  for (int r = 0; r < world; ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].reason;
}

// Every rank's join failed with ONEBIT_SYSTEM_ERROR, its message holding each of `words(rank)`.
void expect_system_errors_saying(RankRecords& records, int world,
                                 const std::function<std::vector<std::string>(int)>& words) {
  for (int r = 0; r < world; ++r) {
    const std::string message = records[r].message;
    EXPECT_EQ(records[r].code, ONEBIT_SYSTEM_ERROR) << "rank " << r << ": " << message;
    for (const std::string& word : words(r)) {
      EXPECT_NE(message.find(word), std::string::npos) << "rank " << r << ": " << message;
    }
  }
}

// Limits of 60 descriptors above what each rank has open — enough for 24 ranks' 1 socket per peer —
// except `short_rank`'s, `short_room` above.
std::function<rlimit(int, rlim_t)> one_rank_short(int short_rank, rlim_t short_room) {
  return [=](int rank, rlim_t open) {
    const rlim_t limit = open + (rank == short_rank ? short_room : 60);
    return rlimit{limit, limit};
  };
}

// A world too wide for the limit: every rank refuses at once, naming what it needs, the limit and
// the remedy. Before, the ranks that connect first got a bare "Too many open files" and the others
// waited for them until their timeout (the root retrying its accept meanwhile).
TEST(Errors, TooLowAnOpenFilesLimitFailsEveryRankAtOnceNamingIt) {
  const int world = 24;  // 23 peers x 2 sockets: more than 40 descriptors
  RankRecords records(world);
  join_under_open_files_limit(
      world, 2,
      [](int, rlim_t) {
        return rlimit{40, 40};
      },
      records, 40, std::chrono::seconds(30));
  expect_system_errors_saying(records, world, [](int r) {
    return std::vector<std::string>{"rank " + std::to_string(r) + " of 24 (2 socket(s) to each of 23 peers",
                                    "the open-files limit is 40 (ulimit -n; hard limit 40).", "ulimit -n 65536"};
  });
}

// Rank 0 alone short of descriptors (it is the bootstrap root and, under torch, the store's server):
// it still answers every rank with its reason, at once — not a root that never answers.
TEST(Errors, RankZeroAloneShortOfDescriptorsTellsEveryRankWhy) {
  const int world = 24;  // rank 0: 25 connections to the root + 8; the others: 23 peers + 8
  RankRecords records(world);
  join_under_open_files_limit(world, 1, one_rank_short(0, 20), records, 0,
                              std::chrono::seconds(30));  // well inside the 60 s timeout
  const std::string shortfall =
      "rank 0 of 24 (1 socket(s) to each of 23 peers; as the bootstrap root, one "
      "connection from each rank) needs 33 more file descriptors";
  expect_system_errors_saying(records, world, [&](int r) {
    if (r == 0) return std::vector<std::string>{shortfall};
    return std::vector<std::string>{shortfall, "bootstrap failed: rank 0 (the bootstrap root at 127.0.0.1:"};
  });
}

// Another rank alone short of descriptors tells the root, which fails the bootstrap for every rank
// naming it — not a root and peers waiting for a rank that never comes.
TEST(Errors, OneRankShortOfDescriptorsIsNamedToEveryRank) {
  const int world = 24;
  RankRecords records(world);
  join_under_open_files_limit(world, 1, one_rank_short(5, 10), records, 0, std::chrono::seconds(30));
  expect_system_errors_saying(records, world, [](int r) {
    return std::vector<std::string>{
        r == 5 ? "rank 5 of 24 (1 socket(s) to each of 23 peers) needs 31 more file descriptors"
               : "bootstrap failed: rank 5 cannot join: its open-files limit leaves too few"};
  });
}

// A soft limit under the hard one is raised to it, as NCCL's bootstrap raises it, and the job runs.
TEST(Errors, ALowSoftOpenFilesLimitIsRaisedToTheHardOne) {
  rlimit mine{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_max < 4096) GTEST_SKIP() << "the hard open-files limit here is " << mine.rlim_max << ", under 4096";
  const int world = 24;
  RankRecords records(world);
  join_under_open_files_limit(
      world, 2,
      [](int, rlim_t) {
        return rlimit{40, 4096};
      },
      records, 4096, std::chrono::seconds(120));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(records[r].code, ONEBIT_SUCCESS) << "rank " << r << ": " << records[r].message;
  }
}

TEST(Errors, StalledPeerTimesOutNamingIt) {
  const int world = 2;
  SharedMemory shared(world * sizeof(Record) + sizeof(int));
  auto* records = shared.as<Record>();
  const int port = free_port();
  int release[2];
  ASSERT_EQ(::pipe(release), 0);
  auto outcomes = run_ranks(
      world,
      [&](int rank) {
        onebit_comm_t comm = join_loopback(rank, world, port, 1500);
        std::vector<float> buffer(1000, 1.0f);
        if (rank == 1) {  // never calls: waits until rank 0 has given up
          char byte;
          return ::read(release[0], &byte, 1) == 1 ? 0 : 6;
        }
        records[rank].set(onebit_allreduce(comm, buffer.data(), buffer.size(), ONEBIT_FLOAT32, ONEBIT_SUM));
        [[maybe_unused]] ssize_t w = ::write(release[1], "x", 1);
        return onebit_comm_destroy(comm) == ONEBIT_SUCCESS ? 0 : 5;
      },
      std::chrono::seconds(60));
  ::close(release[0]);
  ::close(release[1]);
  ASSERT_EQ(outcomes[0].exit_code, 0);
  EXPECT_EQ(records[0].code, ONEBIT_TIMEOUT) << records[0].message;
  EXPECT_NE(std::string(records[0].message).find("timed out after 1500 ms"), std::string::npos) << records[0].message;
  EXPECT_NE(std::string(records[0].message).find("rank 1"), std::string::npos) << records[0].message;
}

TEST(Errors, RankKilledAtRandomPointsOfCollectives) {
  // Rank 2 dies with SIGKILL once it has sent a random number of bytes — anywhere inside one of a
  // run of compressed calls, mid-message included. The survivors' failing call returns an error
  // naming rank 2 (directly, or through the other survivor's abort), leaves their buffer exactly as
  // it was, and their communicators are destroyed cleanly.
  const int world = 3;
  const std::size_t n = 1 << 18;
  std::mt19937 rng(2026);
  for (int trial = 0; trial < 5; ++trial) {
    const std::uint64_t threshold = rng() % (30 * 50000);
    RankRecords records(world);
    const int port = free_port();
    auto outcomes = run_ranks(
        world,
        [&](int rank) {
          onebit_comm_t comm = join_loopback(rank, world, port);
          std::vector<float> buffer(n);
          onebit_tag("k", buffer.data(), n, ONEBIT_FLOAT32);
          std::thread watcher;
          if (rank == 2) {
            watcher = std::thread([&] {
              onebit_stats_t stats{};
              do {
                onebit_comm_stats(comm, &stats);
                std::this_thread::yield();
              } while (stats.bytes_sent < threshold);
              ::raise(SIGKILL);
            });
          }
          for (int call = 0; call < 1000; ++call) {
            const std::vector<float> x = input(rank, call, n, 11);
            std::copy(x.begin(), x.end(), buffer.begin());
            const onebit_result_t result = onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG);
            if (result != ONEBIT_SUCCESS) {
              records[rank].set(result);
              RANK_FAILS_IF(std::memcmp(buffer.data(), x.data(), n * sizeof(float)) != 0, 3);  // must be untouched
              break;
            }
          }
          if (watcher.joinable()) watcher.join();  // rank 2 never gets here
          return onebit_comm_destroy(comm) == ONEBIT_SUCCESS ? 0 : 5;
        },
        std::chrono::seconds(120));
    EXPECT_EQ(outcomes[2].exit_code, 128 + SIGKILL) << "trial " << trial;
    int naming_rank_2 = 0;
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(outcomes[r].exit_code, 0) << "trial " << trial << " rank " << r;
      EXPECT_EQ(records[r].code, ONEBIT_REMOTE_ERROR) << records[r].message;
      naming_rank_2 += std::string(records[r].message).find("rank 2") != std::string::npos;
    }
    EXPECT_GE(naming_rank_2, 1) << "trial " << trial << ": " << records[0].message << "\n" << records[1].message;
  }
}

TEST(Errors, StoppedPeerTimesOutAndTheCommunicatorIsDestroyedCleanly) {
  // SIGSTOP, as a hung process or a debugger would: its sockets stay open, so only the timeout can
  // tell. Survivors fail within ONEBIT_TIMEOUT_MS naming it (or the other survivor's abort does).
  const int world = 3;
  SharedMemory shared(world * sizeof(Record) + sizeof(pid_t));
  auto* records = shared.as<Record>();
  auto* stopped_pid = reinterpret_cast<pid_t*>(records + world);
  const int port = free_port();
  auto outcomes = run_ranks(
      world,
      [&](int rank) {
        onebit_comm_t comm = join_loopback(rank, world, port, 1500);
        std::vector<float> buffer(100000, 1.0f);
        onebit_tag("s", buffer.data(), buffer.size(), ONEBIT_FLOAT32);
        if (rank == 2) {
          *stopped_pid = ::getpid();
          ::raise(SIGSTOP);
          return 0;
        }
        records[rank].set(onebit_allreduce(comm, buffer.data(), buffer.size(), ONEBIT_FLOAT32, ONEBIT_AVG));
        for (float v : buffer) {
          RANK_FAILS_IF(v != 1.0f, 3);  // untouched
        }
        const bool destroyed = onebit_comm_destroy(comm) == ONEBIT_SUCCESS;
        if (rank == 0) ::kill(*stopped_pid, SIGKILL);  // the stopped rank has served its purpose
        return destroyed ? 0 : 5;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(outcomes[2].exit_code, 128 + SIGKILL);
  int naming_rank_2 = 0;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_TRUE(records[r].code == ONEBIT_TIMEOUT || records[r].code == ONEBIT_REMOTE_ERROR) << records[r].message;
    naming_rank_2 += std::string(records[r].message).find("rank 2") != std::string::npos;
  }
  EXPECT_GE(naming_rank_2, 1) << records[0].message << "\n" << records[1].message;
}

TEST(Errors, ConnectionCutMidCallFailsBothSides) {
  // The kernel aborts every TCP connection of rank 1 (ss -K: an RST to the peer) while rank 0 waits
  // inside an allreduce. Both sides fail at once, naming each other; nothing hangs.
  if (std::system("ss -V >/dev/null 2>&1") != 0) GTEST_SKIP() << "ss (iproute2) is not installed";
  const int world = 2;
  RankRecords records(world);
  int entering[2];
  ASSERT_EQ(::pipe(entering), 0);
  const int port = free_port();
  auto outcomes = run_ranks(
      world,
      [&](int rank) {
        onebit_comm_t comm = join_loopback(rank, world, port, 20000);
        std::vector<float> buffer(1 << 20, 1.0f);
        onebit_tag("c", buffer.data(), buffer.size(), ONEBIT_FLOAT32);
        if (rank == 0) {
          [[maybe_unused]] ssize_t w = ::write(entering[1], "x", 1);
        } else {
          char byte;
          RANK_FAILS_IF(::read(entering[0], &byte, 1) != 1, 6);
          // Abort every TCP socket this process holds, by its local port.
          for (int fd = 3; fd < 1024; ++fd) {
            sockaddr_in local{};
            socklen_t length = sizeof(local);
            int type = 0;
            socklen_t type_length = sizeof(type);
            if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_length) != 0 || type != SOCK_STREAM) continue;
            if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0 || local.sin_family != AF_INET)
              continue;
            const std::string command =
                "ss -K -t state established sport = :" + std::to_string(ntohs(local.sin_port)) + " >/dev/null 2>&1";
            RANK_FAILS_IF(std::system(command.c_str()) != 0, 7);
          }
        }
        records[rank].set(onebit_allreduce(comm, buffer.data(), buffer.size(), ONEBIT_FLOAT32, ONEBIT_AVG));
        return onebit_comm_destroy(comm) == ONEBIT_SUCCESS ? 0 : 5;
      },
      std::chrono::seconds(60));
  ::close(entering[0]);
  ::close(entering[1]);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, ONEBIT_REMOTE_ERROR) << records[r].message;
    EXPECT_NE(std::string(records[r].message).find("rank " + std::to_string(1 - r)), std::string::npos)
        << records[r].message;
  }
}

// Rank 0 destroys its communicator on its main thread while another thread of it waits inside an
// allreduce (untagged: the ring; tagged: the compressed call) that rank 1 never joins. The call
// fails naming the destroy — it does not crash, nor wait for the timeout (60 s here) — and the
// buffer is untouched.
void expect_destroy_fails_the_call_in_flight(bool tagged) {
  const int world = 2;
  SharedMemory shared(sizeof(Record));
  auto* record = shared.as<Record>();
  const int port = free_port();
  int release[2];
  ASSERT_EQ(::pipe(release), 0);
  auto outcomes = run_ranks(
      world,
      [&](int rank) {
        onebit_comm_t comm = join_loopback(rank, world, port, 60000);
        if (rank == 1) {  // never calls
          char byte;
          const bool released = ::read(release[0], &byte, 1) == 1;
          onebit_comm_destroy(comm);
          return released ? 0 : 6;
        }
        std::vector<float> buffer(1 << 20, 1.0f);
        if (tagged) onebit_tag("in-flight", buffer.data(), buffer.size(), ONEBIT_FLOAT32);
        std::thread call(
            [&] { record->set(onebit_allreduce(comm, buffer.data(), buffer.size(), ONEBIT_FLOAT32, ONEBIT_SUM)); });
        // Inside the call once it has sent something (polled, not slept).
        for (onebit_stats_t s{}; onebit_comm_stats(comm, &s) == ONEBIT_SUCCESS && s.bytes_sent == 0;) ::sched_yield();
        const onebit_result_t destroyed = onebit_comm_destroy(comm);
        call.join();
        [[maybe_unused]] ssize_t w = ::write(release[1], "x", 1);
        RANK_FAILS_IF(destroyed != ONEBIT_SUCCESS, 5);
        return std::all_of(buffer.begin(), buffer.end(), [](float v) { return v == 1.0f; }) ? 0 : 7;
      },
      std::chrono::seconds(60));
  ::close(release[0]);
  ::close(release[1]);
  ASSERT_EQ(outcomes[0].exit_code, 0) << "rank 0: 5 destroy failed, 7 the buffer changed, 128+n a signal";
  ASSERT_EQ(outcomes[1].exit_code, 0);
  EXPECT_EQ(record->code, ONEBIT_INVALID_ARGUMENT) << record->message;
  EXPECT_NE(std::string(record->message).find("the communicator was destroyed while this call ran"), std::string::npos)
      << record->message;
}

TEST(Errors, DestroyDuringAnUntaggedCallFailsThatCall) { expect_destroy_fails_the_call_in_flight(false); }
TEST(Errors, DestroyDuringATaggedCallFailsThatCall) { expect_destroy_fails_the_call_in_flight(true); }

TEST(Errors, AFlatRankAmongHierarchicalOnesIsNamedAtTheFirstTaggedCall) {
  // 4 ranks as 2 hosts of 2, but rank 0 was given ONEBIT_LOCAL_SIZE=1: every rank fails its first
  // tagged call at once with ONEBIT_MISMATCH naming both settings, instead of each waiting for
  // messages of the other algorithm until the timeout (60 s here).
  const int world = 4;
  RankRecords records(world);
  const int port = free_port();
  auto outcomes = run_ranks(
      world,
      [&](int rank) {
        ::setenv("ONEBIT_LOCAL_SIZE", rank == 0 ? "1" : "2", 1);
        ::unsetenv("LOCAL_WORLD_SIZE");
        ::unsetenv("LOCAL_RANK");
        onebit_comm_t comm = join_loopback(rank, world, port, 60000);
        std::vector<float> buffer(4096, 1.0f);
        onebit_tag("topology", buffer.data(), buffer.size(), ONEBIT_FLOAT32);
        records[rank].set(onebit_allreduce(comm, buffer.data(), buffer.size(), ONEBIT_FLOAT32, ONEBIT_SUM));
        const bool untouched = std::all_of(buffer.begin(), buffer.end(), [](float v) { return v == 1.0f; });
        onebit_comm_destroy(comm);
        return untouched ? 0 : 7;
      },
      std::chrono::seconds(60));
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, ONEBIT_MISMATCH) << "rank " << r << ": " << records[r].message;
  }
  EXPECT_NE(std::string(records[0].message).find("this rank runs 1 rank(s) per host (flat) but rank 1 runs 2"),
            std::string::npos)
      << records[0].message;
  EXPECT_NE(std::string(records[1].message).find("this rank runs 2 rank(s) per host but rank 0 runs 1 (flat)"),
            std::string::npos)
      << records[1].message;
}

// Before rank 1 joins, a stranger speaks `bytes` to the bootstrap root (rank 0, possibly not
// listening yet: retried, bounded). The job must go on: both ranks' allreduce succeeds.

}  // namespace
}  // namespace onebit::testing
