// Checkpoint files through the C ABI (onebit.h, "Checkpoint files"): what is written is read back
// exactly, and a file that is damaged, cut short, foreign or of another version is refused naming
// the path and what is wrong. tests/python/shim_languages_check.py crosses real optimizers' files
// between the C++ and the Python shims.
#include <gtest/gtest.h>
#include <unistd.h>

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
    EXPECT_NE(std::string(onebit_last_error()).find("this checkpoint: record 'step' is there twice"),
              std::string::npos);
    ASSERT_EQ(onebit_checkpoint_write(c, path_.c_str()), ONEBIT_SUCCESS) << onebit_last_error();
    onebit_checkpoint_destroy(c);
  }

  std::vector<char> bytes() const {
    std::ifstream in(path_, std::ios::binary);
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

  std::string dir_, path_;
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
