// How a compressed allreduce splits a buffer among ranks (docs/algorithm.md, "Chunking"): W contiguous
// chunks, chunk j served by rank j, each ceil(n / W) rounded up to a multiple of 8 elements so that
// every chunk's bits start on a byte; the last chunks may be shorter or empty. The CPU engine and
// the NCCL front door's device path both use this one definition, so their wire layouts agree.
#pragma once

#include <algorithm>
#include <cstddef>

namespace onebit {

struct ChunkGeometry {
  ChunkGeometry(std::size_t elements, int ranks)
      : n(elements), world(ranks), chunk(((elements + ranks - 1) / ranks + 7) / 8 * 8) {}

  std::size_t begin(int j) const { return std::min(n, static_cast<std::size_t>(j) * chunk); }
  std::size_t length(int j) const { return std::min(n, begin(j) + chunk) - begin(j); }
  std::size_t chunk_bytes() const { return chunk / 8; }  // a full chunk's bits

  std::size_t n;
  int world;
  std::size_t chunk;
};

}  // namespace onebit
