// What net_comm.cc (devices, handles, the data path), net_listener.cc (the listening side) and
// net_connect.cc (the connecting side) share, outside net_comm.h's interface: the handle's magic,
// version and address, the random numbers behind its secret and the connection ids, and errno's text.
#pragma once

#include <cstdint>
#include <string>

#include "transport/tcp/net_comm.h"

namespace onebit::transport::tcp {

constexpr std::uint32_t kHandleMagic = 0x4F424E31;  // "OBN1"
constexpr std::uint16_t kHandleVersion = 1;

std::string errno_string(int error);
std::uint64_t random64();
// The address a handle names.
Address address_of(const NetHandle& handle);

}  // namespace onebit::transport::tcp
