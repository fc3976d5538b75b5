// What net_comm.cc (devices, handles, the data path, connecting) and net_listener.cc (the
// listening side) share, outside net_comm.h's interface: the handle's magic and version, the
// random numbers behind its secret and the connection ids, and errno's text.
#pragma once

#include <cstdint>
#include <string>

namespace onebit::tcp {

constexpr std::uint32_t kHandleMagic = 0x4F424E31;  // "OBN1"
constexpr std::uint16_t kHandleVersion = 1;

std::string errno_string(int error);
std::uint64_t random64();

}  // namespace onebit::tcp
