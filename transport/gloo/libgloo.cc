#include "transport/gloo/libgloo.h"

#include <dlfcn.h>

namespace onebit::transport::gloo {
namespace {

template <typename Function>
bool resolve(void* handle, const char* symbol, Function* out, std::string* error) {
  *out = reinterpret_cast<Function>(::dlsym(handle, symbol));
  if (*out == nullptr) *error += std::string(error->empty() ? "" : "; ") + symbol + " not found";
  return *out != nullptr;
}

}  // namespace

const Libgloo& libgloo() {
  static const Libgloo loaded = [] {
    Libgloo l;
    void* handle = ::dlopen("libgloo.so.0", RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
      l.error = "libgloo.so.0 is not loaded in this process";
      return l;
    }
    Dl_info info{};
    bool all = resolve(handle, "_ZNK4gloo7Context10getTimeoutEv", &l.get_timeout, &l.error);
    all = resolve(handle, "_ZN4gloo7Context7getPairEi", &l.get_pair, &l.error) && all;
    all = resolve(handle, "_ZN4gloo7Context19createUnboundBufferEPvm", &l.create_unbound_buffer, &l.error) && all;
    Libgloo::Allreduce allreduce = nullptr;
    all = resolve(handle, "_ZN4gloo9allreduceERKNS_16AllreduceOptionsE", &allreduce, &l.error) && all;
    if (all) {
      l.allreduce = allreduce;
      if (::dladdr(reinterpret_cast<void*>(allreduce), &info) != 0 && info.dli_fname != nullptr)
        l.path = info.dli_fname;
    }
    return l;  // the handle stays open: the framework's library, for the process's life
  }();
  return loaded;
}

}  // namespace onebit::transport::gloo
