// Checkpoint files through the C ABI (onebit.h, "Checkpoint files"): what is written is read back
// exactly, whole or streamed, each rank reads its own view of a job's file, and a file that is
// damaged, cut short, foreign or of another version is refused naming the path and what is wrong.
// tests/python/shim_languages_check.py crosses real optimizers' files between the C++ and the Python shims.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <dirent.h>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/record_file.h"
#include "onebit/onebit.h"

namespace {

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/onebit-checkpoint-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/rank-0.ckpt";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  // A file of one record of each kind, written to path_.
  void write_example() {
    onebit_checkpoint_t c = nullptr;
    ASSERT_EQ(onebit_checkpoint_create(&c), ONEBIT_SUCCESS);
    put_example(c);
    ASSERT_EQ(onebit_checkpoint_write(c, path_.c_str()), ONEBIT_SUCCESS) << onebit_last_error();
    onebit_checkpoint_destroy(c);
  }

  // One record of each kind put into `c`, and a second record of one name refused.
  static void put_example(onebit_checkpoint_t c) {
    const std::int64_t ints[] = {-1, INT64_MAX};
    const float floats[] = {1.5f, -0.0f, 3e-38f};
    const double doubles[] = {0.25, -1e300};
    EXPECT_EQ(onebit_checkpoint_put_text(c, "optimizer", "OnebitAdam"), ONEBIT_SUCCESS);
    EXPECT_EQ(onebit_checkpoint_put_int(c, "step", 12), ONEBIT_SUCCESS);
    EXPECT_EQ(onebit_checkpoint_put_ints(c, "changes.step", ints, 2), ONEBIT_SUCCESS);
    EXPECT_EQ(onebit_checkpoint_put_floats(c, "m", floats, 3), ONEBIT_SUCCESS);
    EXPECT_EQ(onebit_checkpoint_put_floats(c, "server_error", nullptr, 0), ONEBIT_SUCCESS);
    EXPECT_EQ(onebit_checkpoint_put_doubles(c, "changes.change", doubles, 2), ONEBIT_SUCCESS);
    EXPECT_EQ(onebit_checkpoint_put_int(c, "step", 13), ONEBIT_INVALID_ARGUMENT);  // once a name
    EXPECT_NE(std::string(onebit_last_error()).find(": record 'step' is there twice"), std::string::npos);
  }

  std::vector<char> bytes(const std::string& path = "") const {
    std::ifstream in(path.empty() ? path_ : path, std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void rewrite(const std::vector<char>& data) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  // Reading path_ fails with `code` and a message holding `says`.
  void expect_refused(onebit_result_t code, const std::string& says) const {
    onebit_checkpoint_t c = nullptr;
    EXPECT_EQ(onebit_checkpoint_read(path_.c_str(), &c), code);
    EXPECT_EQ(c, nullptr);
    const std::string error = onebit_last_error();
    EXPECT_NE(error.find(says), std::string::npos) << error;
  }

  // write_example()'s file at path_, then a stream over it (stream_) holding one record, "step";
  // returns the file's bytes before the stream.
  std::vector<char> stream_over_example() {
    write_example();
    std::vector<char> before = bytes();
    EXPECT_EQ(onebit_checkpoint_stream(path_.c_str(), &stream_), ONEBIT_SUCCESS) << onebit_last_error();
    EXPECT_EQ(onebit_checkpoint_put_int(stream_, "step", 3), ONEBIT_SUCCESS);
    return before;
  }

  // The names of dir_'s files.
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    DIR* dir = ::opendir(dir_.c_str());
    if (dir == nullptr) return names;
    while (const dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] != '.') names.emplace_back(entry->d_name);
    }
    ::closedir(dir);
    return names;
  }

  // Every record name of `c` in order.
  static std::vector<std::string> names_of(onebit_checkpoint_t c) {
    std::size_t count = 0;
    EXPECT_EQ(onebit_checkpoint_names(c, nullptr, 0, &count), ONEBIT_SUCCESS);
    std::vector<const char*> names(count);
    EXPECT_EQ(onebit_checkpoint_names(c, names.data(), count, &count), ONEBIT_SUCCESS);
    return std::vector<std::string>(names.begin(), names.end());
  }

  std::string dir_, path_;
  onebit_checkpoint_t stream_ = nullptr;
};

TEST_F(CheckpointFileTest, WhatIsWrittenIsReadBackExactlyInOrder) {
  write_example();
  EXPECT_FALSE(std::ifstream(path_ + ".tmp." + std::to_string(::getpid())).good());  // renamed into place
  onebit_checkpoint_t c = nullptr;
  ASSERT_EQ(onebit_checkpoint_read(path_.c_str(), &c), ONEBIT_SUCCESS) << onebit_last_error();
  const char* names[8] = {};
  size_t count = 0;
  ASSERT_EQ(onebit_checkpoint_names(c, names, 8, &count), ONEBIT_SUCCESS);
  const std::vector<std::string> order(names, names + count);
  EXPECT_EQ(order,
            (std::vector<std::string>{"optimizer", "step", "changes.step", "m", "server_error", "changes.change"}));
  std::int64_t step = 0;
  EXPECT_EQ(onebit_checkpoint_get_int(c, "step", &step), ONEBIT_SUCCESS);
  EXPECT_EQ(step, 12);
  std::int64_t ints[2] = {};
  EXPECT_EQ(onebit_checkpoint_get_ints(c, "changes.step", ints, 2), ONEBIT_SUCCESS);
  EXPECT_EQ(ints[0], -1);
  EXPECT_EQ(ints[1], INT64_MAX);
  float floats[3] = {};
  EXPECT_EQ(onebit_checkpoint_get_floats(c, "m", floats, 3), ONEBIT_SUCCESS);
  EXPECT_EQ(floats[0], 1.5f);
  EXPECT_TRUE(std::signbit(floats[1]));  // the bits, not the value: -0 stays -0
  EXPECT_EQ(floats[2], 3e-38f);
  double doubles[2] = {};
  EXPECT_EQ(onebit_checkpoint_get_doubles(c, "changes.change", doubles, 2), ONEBIT_SUCCESS);
  EXPECT_EQ(doubles[1], -1e300);
  char text[32];
  size_t length = 0;
  EXPECT_EQ(onebit_checkpoint_get_text(c, "optimizer", text, sizeof text, &length), ONEBIT_SUCCESS);
  EXPECT_EQ(std::string(text), "OnebitAdam");
  onebit_record_kind_t kind = ONEBIT_RECORD_INT;
  EXPECT_EQ(onebit_checkpoint_record(c, "server_error", &kind, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(kind, ONEBIT_RECORD_FLOATS);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(onebit_checkpoint_record(c, "v_then", &kind, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(kind, ONEBIT_RECORD_ABSENT);
  onebit_checkpoint_destroy(c);
}

TEST_F(CheckpointFileTest, AGetOfAnAbsentOrOtherRecordIsRefusedAndWritesNothing) {
  write_example();
  onebit_checkpoint_t c = nullptr;
  ASSERT_EQ(onebit_checkpoint_read(path_.c_str(), &c), ONEBIT_SUCCESS);
  std::int64_t value = 7;
  EXPECT_EQ(onebit_checkpoint_get_int(c, "freeze_step", &value), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find(path_ + " has no record 'freeze_step'"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(onebit_checkpoint_get_int(c, "m", &value), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("record 'm' holds float32 values, not an int64"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(value, 7);
  float floats[4] = {9, 9, 9, 9};
  EXPECT_EQ(onebit_checkpoint_get_floats(c, "m", floats, 4), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("record 'm' holds 3 values, not 4"), std::string::npos);
  EXPECT_EQ(floats[0], 9.0f);
  onebit_checkpoint_destroy(c);
}

TEST_F(CheckpointFileTest, ADamagedShortForeignOrNewerFileIsRefusedNamingWhy) {
  write_example();
  const std::vector<char> good = bytes();
  std::vector<char> flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  rewrite(flipped);
  expect_refused(ONEBIT_INVALID_ARGUMENT, path_ + ": its CRC-32 does not match its bytes (the file is damaged)");
  rewrite(std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)));
  expect_refused(ONEBIT_INVALID_ARGUMENT, path_ + ": its CRC-32 does not match");  // cut short: the CRC is gone
  rewrite(std::vector<char>(good.begin(), good.begin() + 10));
  expect_refused(ONEBIT_INVALID_ARGUMENT, "not a onebit checkpoint file");
  const std::string pickle = "\x80\x04\x95this is torch.save's pickle";
  rewrite(std::vector<char>(pickle.begin(), pickle.end()));
  expect_refused(ONEBIT_INVALID_ARGUMENT, path_ + ": not a onebit checkpoint file (no \"ONEBITRF\" at its start)");
  std::vector<char> newer = good;
  newer[8] = 2;  // the version
  rewrite(newer);
  expect_refused(ONEBIT_INVALID_ARGUMENT, path_ + ": format version 2; this onebit reads 1");
  std::remove(path_.c_str());
  expect_refused(ONEBIT_SYSTEM_ERROR, "cannot read " + path_);
}

// A file crafted with a correct CRC (what fuzz_record_file feeds): `records` framed as version 1.
std::vector<char> crafted(const std::vector<unsigned char>& records) {
  std::vector<unsigned char> bytes = {'O', 'N', 'E', 'B', 'I', 'T', 'R', 'F', 1, 0, 0, 0};
  bytes.insert(bytes.end(), records.begin(), records.end());
  const std::uint32_t crc = onebit::RecordFile::crc32(bytes.data(), bytes.size());
  const auto* crc_bytes = reinterpret_cast<const unsigned char*>(&crc);
  bytes.insert(bytes.end(), crc_bytes, crc_bytes + sizeof crc);
  return std::vector<char>(bytes.begin(), bytes.end());
}

// One record: u16 name length, name, u8 kind, u64 count, `payload`.
void add_record(std::vector<unsigned char>& out, const std::string& name, std::uint8_t kind, std::uint64_t count,
                std::size_t payload) {
  const auto length = static_cast<std::uint16_t>(name.size());
  out.insert(out.end(), {static_cast<unsigned char>(length & 0xFF), static_cast<unsigned char>(length >> 8)});
  out.insert(out.end(), name.begin(), name.end());
  out.push_back(kind);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(count >> (8 * i)));
  out.insert(out.end(), payload, 0);
}

TEST_F(CheckpointFileTest, ACraftedFileWithARightCrcIsStillCheckedRecordByRecord) {
  std::vector<unsigned char> records = {1, 0, 0, 0};
  add_record(records, "step", 1, 0, 0);  // an int64 of no value: reading it would run off the record
  rewrite(crafted(records));
  expect_refused(ONEBIT_INVALID_ARGUMENT, path_ + ": record 'step' is an int64 of 0 values");
  records = {2, 0, 0, 0};
  add_record(records, "m", 3, 1, 4);
  add_record(records, "m", 3, 1, 4);
  rewrite(crafted(records));
  expect_refused(ONEBIT_INVALID_ARGUMENT, path_ + ": record 'm' is there twice");
  records = {1, 0, 0, 0};
  add_record(records, "m", 3, 1000, 4);
  rewrite(crafted(records));
  expect_refused(ONEBIT_INVALID_ARGUMENT, path_ + ": record 'm' claims 1000 values, more than the file holds");
  records = {1, 0, 0, 0};
  add_record(records, "m", 9, 1, 4);
  rewrite(crafted(records));
  expect_refused(ONEBIT_INVALID_ARGUMENT, path_ + ": record 'm' has unknown kind 9");
  onebit_checkpoint_t c = nullptr;
  EXPECT_EQ(onebit_checkpoint_read(dir_.c_str(), &c), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("cannot read " + dir_ + ": it is a folder"), std::string::npos)
      << onebit_last_error();
}

TEST_F(CheckpointFileTest, AStreamedFileIsTheFileWrittenWholeByteForByte) {
  write_example();
  const std::string streamed = dir_ + "/streamed.ckpt";
  onebit_checkpoint_t c = nullptr;
  ASSERT_EQ(onebit_checkpoint_stream(streamed.c_str(), &c), ONEBIT_SUCCESS) << onebit_last_error();
  put_example(c);                         // nothing written of the refused record
  EXPECT_EQ(bytes(streamed).size(), 0u);  // nothing at the path before the commit
  // Its names, kinds and counts are kept; its values are written, not held.
  onebit_record_kind_t kind = ONEBIT_RECORD_ABSENT;
  std::size_t count = 0;
  EXPECT_EQ(onebit_checkpoint_record(c, "m", &kind, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(kind, ONEBIT_RECORD_FLOATS);
  EXPECT_EQ(count, 3u);
  float got[3] = {};
  EXPECT_EQ(onebit_checkpoint_get_floats(c, "m", got, 3), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find(streamed + " is streamed: its records are written, not held"),
            std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(onebit_checkpoint_write(c, path_.c_str()), ONEBIT_INVALID_ARGUMENT);
  ASSERT_EQ(onebit_checkpoint_commit(c), ONEBIT_SUCCESS) << onebit_last_error();
  EXPECT_EQ(onebit_checkpoint_commit(c), ONEBIT_INVALID_ARGUMENT);  // once
  EXPECT_EQ(onebit_checkpoint_put_int(c, "late", 1), ONEBIT_INVALID_ARGUMENT);
  onebit_checkpoint_destroy(c);
  EXPECT_EQ(bytes(streamed), bytes());
  EXPECT_EQ(files().size(), 2u);  // the two files, no temporary one left
  std::remove(streamed.c_str());
}

TEST_F(CheckpointFileTest, AStreamNotCommittedLeavesThePathAsItWasAndNoTemporaryFile) {
  const std::vector<char> before = stream_over_example();
  onebit_checkpoint_t c = stream_;
  EXPECT_EQ(files().size(), 2u);  // the path and the stream's temporary file
  onebit_checkpoint_destroy(c);
  EXPECT_EQ(bytes(), before);
  EXPECT_EQ(files(), std::vector<std::string>{"rank-0.ckpt"});
  onebit_checkpoint_t whole = nullptr;
  ASSERT_EQ(onebit_checkpoint_create(&whole), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_checkpoint_commit(whole), ONEBIT_INVALID_ARGUMENT);  // not streamed: write() writes it
  onebit_checkpoint_destroy(whole);
  const std::string nowhere = dir_ + "/no/such/folder/job.ckpt";
  EXPECT_EQ(onebit_checkpoint_stream(nowhere.c_str(), &c), ONEBIT_SYSTEM_ERROR);
  EXPECT_NE(std::string(onebit_last_error()).find("cannot write " + nowhere), std::string::npos) << onebit_last_error();
}

// The process's file-size limit (RLIMIT_FSIZE) at `bytes` while this lives, SIGXFSZ ignored: a
// write past it fails with EFBIG, as on a full disk.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    previous_ = std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{bytes, old_.rlim_max};
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, previous_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  void (*previous_)(int) = nullptr;
};

TEST_F(CheckpointFileTest, AStreamWhoseWriteFailedTakesNothingMoreAndLeavesThePathAsItWas) {
  const std::vector<char> before = stream_over_example();
  onebit_checkpoint_t c = stream_;
  const std::vector<float> big(4096, 1.0f);
  {
    const FileSizeLimit limit(4096);
    EXPECT_EQ(onebit_checkpoint_put_floats(c, "m", big.data(), big.size()), ONEBIT_SYSTEM_ERROR);
    EXPECT_NE(std::string(onebit_last_error()).find("cannot write " + path_ + ": File too large"), std::string::npos)
        << onebit_last_error();
  }
  EXPECT_EQ(onebit_checkpoint_put_int(c, "after", 1), ONEBIT_INVALID_ARGUMENT);  // nothing more, even with room
  EXPECT_NE(std::string(onebit_last_error()).find("an earlier write to " + path_ + " failed"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(onebit_checkpoint_commit(c), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(names_of(c), std::vector<std::string>{"step"});  // the record that failed is not among them
  onebit_checkpoint_destroy(c);
  EXPECT_EQ(bytes(), before);
  EXPECT_EQ(files(), std::vector<std::string>{"rank-0.ckpt"});
  {
    const FileSizeLimit limit(8);  // not even the head fits: the stream is not made, nothing left behind
    EXPECT_EQ(onebit_checkpoint_stream(path_.c_str(), &c), ONEBIT_SYSTEM_ERROR);
  }
  EXPECT_EQ(files(), std::vector<std::string>{"rank-0.ckpt"});
}

TEST_F(CheckpointFileTest, EachRankReadsItsOwnViewOfAJobsFile) {
  // What every rank holds alike once, each rank's own under "rank<r>/".
  onebit_checkpoint_t c = nullptr;
  ASSERT_EQ(onebit_checkpoint_stream(path_.c_str(), &c), ONEBIT_SUCCESS) << onebit_last_error();
  const float m[] = {1.0f, 2.0f}, errors[3][2] = {{0.5f, -0.5f}, {1.5f, -1.5f}, {2.5f, -2.5f}};
  EXPECT_EQ(onebit_checkpoint_put_text(c, "optimizer", "OnebitAdam"), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_checkpoint_put_floats(c, "m", m, 2), ONEBIT_SUCCESS);
  for (int r = 0; r < 3; ++r) {
    const std::string own = "rank" + std::to_string(r) + "/";
    EXPECT_EQ(onebit_checkpoint_put_int(c, (own + "rank").c_str(), r), ONEBIT_SUCCESS);
    EXPECT_EQ(onebit_checkpoint_put_floats(c, (own + "worker_error").c_str(), errors[r], 2), ONEBIT_SUCCESS);
  }
  ASSERT_EQ(onebit_checkpoint_commit(c), ONEBIT_SUCCESS) << onebit_last_error();
  onebit_checkpoint_destroy(c);

  const auto view = [&](int rank, std::int64_t whose) {
    onebit_checkpoint_t v = nullptr;
    ASSERT_EQ(onebit_checkpoint_read_rank(path_.c_str(), rank, &v), ONEBIT_SUCCESS) << onebit_last_error();
    EXPECT_EQ(names_of(v), (std::vector<std::string>{"optimizer", "m", "rank", "worker_error"})) << "rank " << rank;
    std::int64_t said = -1;
    float got[2] = {}, shared[2] = {};
    EXPECT_EQ(onebit_checkpoint_get_int(v, "rank", &said), ONEBIT_SUCCESS);
    EXPECT_EQ(said, whose);
    EXPECT_EQ(onebit_checkpoint_get_floats(v, "worker_error", got, 2), ONEBIT_SUCCESS);
    EXPECT_EQ(got[0], errors[whose][0]);
    EXPECT_EQ(got[1], errors[whose][1]);
    EXPECT_EQ(onebit_checkpoint_get_floats(v, "m", shared, 2), ONEBIT_SUCCESS);
    EXPECT_EQ(shared[1], 2.0f);
    onebit_checkpoint_destroy(v);
  };
  view(0, 0);
  view(2, 2);
  view(7, 0);  // a job grown since: rank 0's view, which says whose it is
  onebit_checkpoint_t v = nullptr;
  ASSERT_EQ(onebit_checkpoint_read(path_.c_str(), &v), ONEBIT_SUCCESS);  // the whole file: every rank's
  EXPECT_EQ(names_of(v).size(), 8u);
  onebit_checkpoint_destroy(v);
  EXPECT_EQ(onebit_checkpoint_read_rank(path_.c_str(), -1, &v), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("rank -1 must not be negative"), std::string::npos);

  // A name with a slash that is not "rank<digits>/" is plain: every rank sees it.
  ASSERT_EQ(onebit_checkpoint_create(&c), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_checkpoint_put_int(c, "layer/x", 1), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_checkpoint_put_int(c, "rankings/y", 2), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_checkpoint_put_int(c, "rank1/z", 3), ONEBIT_SUCCESS);
  ASSERT_EQ(onebit_checkpoint_write(c, path_.c_str()), ONEBIT_SUCCESS);
  onebit_checkpoint_destroy(c);
  ASSERT_EQ(onebit_checkpoint_read_rank(path_.c_str(), 1, &v), ONEBIT_SUCCESS) << onebit_last_error();
  EXPECT_EQ(names_of(v), (std::vector<std::string>{"layer/x", "rankings/y", "z"}));
  onebit_checkpoint_destroy(v);

  write_example();  // a rank's own file, no prefixed records: every rank's view is the whole of it
  ASSERT_EQ(onebit_checkpoint_read_rank(path_.c_str(), 3, &v), ONEBIT_SUCCESS) << onebit_last_error();
  EXPECT_EQ(names_of(v).size(), 6u);
  onebit_checkpoint_destroy(v);
}

TEST_F(CheckpointFileTest, AJobsFileWhoseRankRecordShadowsASharedOneIsRefused) {
  onebit_checkpoint_t c = nullptr;
  ASSERT_EQ(onebit_checkpoint_create(&c), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_checkpoint_put_int(c, "step", 4), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_checkpoint_put_int(c, "rank1/step", 5), ONEBIT_SUCCESS);
  ASSERT_EQ(onebit_checkpoint_write(c, path_.c_str()), ONEBIT_SUCCESS);
  onebit_checkpoint_destroy(c);
  EXPECT_EQ(onebit_checkpoint_read_rank(path_.c_str(), 1, &c), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find(path_ + ": record 'step' is there twice"), std::string::npos)
      << onebit_last_error();
}

TEST_F(CheckpointFileTest, AFileThatCannotBeWrittenIsAnErrorNamingIt) {
  onebit_checkpoint_t c = nullptr;
  ASSERT_EQ(onebit_checkpoint_create(&c), ONEBIT_SUCCESS);
  const std::string nowhere = dir_ + "/no/such/folder/rank-0.ckpt";
  EXPECT_EQ(onebit_checkpoint_write(c, nowhere.c_str()), ONEBIT_SYSTEM_ERROR);
  EXPECT_NE(std::string(onebit_last_error()).find("cannot write " + nowhere), std::string::npos) << onebit_last_error();
  EXPECT_EQ(onebit_checkpoint_put_int(c, nullptr, 1), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_checkpoint_put_int(c, "", 1), ONEBIT_INVALID_ARGUMENT);
  onebit_checkpoint_destroy(c);
  onebit_checkpoint_destroy(nullptr);
}

}  // namespace
