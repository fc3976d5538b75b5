// The libgloo functions the Gloo door calls, found at run time in the libgloo.so.0 that the
// framework has loaded, never linked. A link put libgloo.so.0 into the process's global scope,
// where its symbols shadowed the gloo that pip's PyTorch bundles, and init_process_group crashed
// there (docs/reliability.md). Opened with RTLD_NOLOAD, it is the framework's own copy or none.
//
// The three besides gloo::allreduce are non-virtual member functions of gloo::Context, called through their addresses
// the way the Itanium C++ ABI (x86-64, AArch64) passes every such call: the object as the first argument, a class
// returned in memory through the same hidden slot as a free function's.
#pragma once

#include <gloo/allreduce.h>
#include <gloo/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <memory>
#include <string>

namespace onebit::transport::gloo {

struct Libgloo {
  using Allreduce = void (*)(const ::gloo::AllreduceOptions&);
  using GetTimeout = std::chrono::milliseconds (*)(const ::gloo::Context*);
  using GetPair = std::unique_ptr<::gloo::transport::Pair>& (*)(::gloo::Context*, int);
  using CreateUnboundBuffer = std::unique_ptr<::gloo::transport::UnboundBuffer> (*)(::gloo::Context*, void*,
                                                                                    std::size_t);

  Allreduce allreduce = nullptr;  // libgloo's own gloo::allreduce, which the door forwards to
  GetTimeout get_timeout = nullptr;
  GetPair get_pair = nullptr;
  CreateUnboundBuffer create_unbound_buffer = nullptr;
  std::string path;   // where it was found
  std::string error;  // why not, when `allreduce` is null
};

// libgloo.so.0 as this process has it (loaded by the framework), resolved once.
const Libgloo& libgloo();

}  // namespace onebit::transport::gloo
