// Software prefetch for the SIMD passes that stream arrays larger than the caches.
//
// Why: on the machines this project runs on, one core's hardware prefetchers do not keep enough
// lines in flight for a pass that reads two or more streams and computes on them — measured with
// ONEBIT_SIMD=avx2 on an Intel Xeon with AVX-512 at 64 Mi elements, the server pass (W = 4) read at
// 8.6 GB/s and the norm pass at 11.5 GB/s; asking for each line 2 KiB ahead gave 14.5 and 14.2 GB/s
// (docs/benchmarks/kernels.md, "CPU kernels against memcpy"). Prefetches change no result: the passes'
// arithmetic and order are as before.
//
// `static inline` as in half.h: the SIMD translation units are built with their instruction sets,
// and nothing defined here may be linked into a caller compiled without them.
#pragma once

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

namespace onebit::kernels {

// How far ahead of the element being read a pass asks for lines: 2 KiB, 32 lines per stream.
// 1 to 4 KiB measured alike; 512 bytes lost a third of the gain.
constexpr std::size_t kPrefetchBytes = 2048;

// Asks for the cache line kPrefetchBytes past `p`. A prefetch never faults, so reading past the
// end of an array here is harmless (the address is formed as an integer: no pointer leaves its array).
static inline void prefetch_ahead(const void* p) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + kPrefetchBytes), _MM_HINT_T0);
}

}  // namespace onebit::kernels
