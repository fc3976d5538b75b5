#include "transport/factory.h"

#include "common/error.h"
#include "common/params.h"
#ifdef ONEBIT_HAVE_IBVERBS
#include "transport/ibverbs/ibverbs_transport.h"
#endif

namespace onebit {

std::unique_ptr<Transport> open_transport(int rank, int size, const std::string& root,
                                          const transport::tcp::TransportOptions& options) {
  const std::string& kind = param::Transport();
  ONEBIT_CHECK(kind == "gloo" || kind == "tcp" || kind == "ibverbs", ONEBIT_INVALID_ARGUMENT, "ONEBIT_TRANSPORT=", kind,
               " is not a transport: use tcp, ibverbs or (the Gloo front door's default) gloo");
  const transport::tcp::Address root_address =
      size == 1 ? transport::tcp::Address{} : transport::tcp::parse_host_port(root, "root");
  if (kind == "ibverbs") {
#ifdef ONEBIT_HAVE_IBVERBS
    transport::ibverbs::VerbsOptions verbs;
    verbs.tcp = options;
    verbs.tcp.transport = wire::kTransportIbverbs;
    verbs.hca = param::IbHca();
    verbs.gid_index = static_cast<int>(param::IbGidIndex());
    verbs.ack_timeout = static_cast<int>(param::IbTimeout());
    return std::make_unique<transport::ibverbs::IbverbsTransport>(rank, size, root_address, verbs);
#else
    fail(ONEBIT_INVALID_ARGUMENT,
         "ONEBIT_TRANSPORT=ibverbs: this onebit was built without the verbs transport "
         "(configure with -DONEBIT_WITH_IBVERBS=ON; it needs libibverbs-dev)");
#endif
  }
  return std::make_unique<transport::tcp::TcpTransport>(rank, size, root_address, options);
}

}  // namespace onebit
