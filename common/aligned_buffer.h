// A zero-initialised, 64-byte aligned array: scratch and error-state storage. 64 bytes so that the
// kernels' non-temporal stores apply to every chunk (see kernels/cpu/avx512.cc). From 2 MiB up it
// is 2 MiB-aligned and asks for transparent huge pages (docs/design/engine.md, "Huge pages for the
// state"). Every allocation is announced to common/buffer_registry.h until it is freed, so that a
// transport can keep it registered with a device for exactly that long.
#pragma once

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "common/buffer_registry.h"

namespace onebit {

template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t n) { resize(n); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~AlignedBuffer() { release(); }

  // Grows (never shrinks) and zeroes the whole buffer when it grows.
  void resize(std::size_t n) {
    if (n <= size_ && data_ != nullptr) return;
    release();
    std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64 + 64;
    const bool huge = bytes >= kHugePage;
    if (huge) bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    data_ = static_cast<T*>(std::aligned_alloc(huge ? kHugePage : 64, bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    if (huge) ::madvise(data_, bytes, MADV_HUGEPAGE);
    std::memset(static_cast<void*>(data_), 0, bytes);
    size_ = n;
    bytes_ = bytes;
    buffers::announce(data_, bytes_);  // a transport may keep it registered with a device until release()
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;
  void release() {
    if (data_ == nullptr) return;
    buffers::retire(data_, bytes_);
    std::free(data_);
    data_ = nullptr;
    size_ = bytes_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t bytes_ = 0;  // allocated, announced
};

}  // namespace onebit
