#include "tools/bench/gloo_baseline.h"

#include "common/error.h"

#ifdef ONEBIT_HAVE_GLOO
#include "transport/gloo/gloo_transport.h"
#endif

#ifdef ONEBIT_HAVE_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace onebit::bench {

#ifdef ONEBIT_HAVE_GLOO
struct GlooAllreduce::Impl {
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::uint32_t tag = 0;
};

GlooAllreduce::GlooAllreduce(int rank, int size, const std::string& store_dir, const std::string& host)
    : impl_(std::make_unique<Impl>()) {
  gloo::transport::tcp::attr attr;
  attr.hostname = host;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  impl_->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  impl_->context->connectFullMesh(store, device);
}

GlooAllreduce::~GlooAllreduce() = default;

void GlooAllreduce::sum(float* data, std::size_t count) {
  gloo::AllreduceOptions options(impl_->context);
  options.setOutput<float>(data, count);
  options.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
  options.setTag(impl_->tag++);
  gloo::allreduce(options);
}

std::unique_ptr<Transport> GlooAllreduce::pairs_transport() {
  return std::make_unique<transport::gloo::GlooTransport>(impl_->context.get());
}

bool GlooAllreduce::available() { return true; }
#else
struct GlooAllreduce::Impl {};
GlooAllreduce::GlooAllreduce(int, int, const std::string&, const std::string&) {
  fail(ONEBIT_INVALID_ARGUMENT, "this build has no Gloo (ONEBIT_WITH_GLOO resolved off); use --algo compressed,ring");
}
GlooAllreduce::~GlooAllreduce() = default;
void GlooAllreduce::sum(float*, std::size_t) {}
std::unique_ptr<Transport> GlooAllreduce::pairs_transport() { return nullptr; }
bool GlooAllreduce::available() { return false; }
#endif

}  // namespace onebit::bench
