// The boundary between onebit's C++ (which throws onebit::Error) and a C ABI (which returns codes).
// Every extern "C" entry point runs its body through abi_guard: nothing throws across the ABI, the
// error is logged once here with the entry point's name, and the thread's last-error message is set.
#pragma once

#include <new>
#include <string>

#include "common/error.h"
#include "common/log.h"

namespace onebit {

// The calling thread's last error message ("" after a successful call).
std::string& thread_last_error();

template <typename Body>
onebit_result_t abi_guard(const char* entry_point, Body&& body) noexcept {
  try {
    body();
    thread_last_error().clear();
    return ONEBIT_SUCCESS;
  } catch (const Error& error) {
    thread_last_error() = std::string(entry_point) + ": " + error.what();
    ONEBIT_LOG(WARN, thread_last_error());
    return error.code();
  } catch (const std::bad_alloc&) {
    thread_last_error() = std::string(entry_point) + ": out of memory";
    ONEBIT_LOG(WARN, thread_last_error());
    return ONEBIT_SYSTEM_ERROR;
  } catch (const std::exception& error) {
    thread_last_error() = std::string(entry_point) + ": internal error: " + error.what();
    ONEBIT_LOG(WARN, thread_last_error());
    return ONEBIT_INTERNAL_ERROR;
  } catch (...) {
    thread_last_error() = std::string(entry_point) + ": internal error: unknown exception";
    ONEBIT_LOG(WARN, thread_last_error());
    return ONEBIT_INTERNAL_ERROR;
  }
}

}  // namespace onebit
