// The external anchor: Gloo's own allreduce (libgloo, tcp device, FileStore rendezvous), the path
// PyTorch's gloo backend takes. Built when ONEBIT_WITH_GLOO resolves on.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace onebit::bench {

class GlooAllreduce {
 public:
  // Joins Gloo's full mesh through a FileStore in `store_dir` (shared by all ranks); the device binds
  // `host`. `prefix` separates runs that share a directory.
  GlooAllreduce(int rank, int size, const std::string& store_dir, const std::string& host);
  ~GlooAllreduce();
  // In-place sum over all ranks.
  void sum(float* data, std::size_t count);
  // onebit's transport over this context's pairs (transport/gloo), for --algo compressed-gloo.
  std::unique_ptr<Transport> pairs_transport();
  static bool available();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace onebit::bench
