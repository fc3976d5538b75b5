/*
 * What libonebit-preload.so adds to the C ABI of onebit.h: it is loaded with LD_PRELOAD into an
 * unmodified framework and takes over the allreduce of tagged buffers (see docs/usage/pytorch.md).
 */
#ifndef ONEBIT_PRELOAD_H_
#define ONEBIT_PRELOAD_H_

#include "onebit/onebit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the front doors did in this process. */
typedef struct {
  /* The calls onebit took, summed over every communicator the front doors created (one per
   * framework communicator that ran a tagged allreduce). bytes_* count what onebit's transport
   * moved: payload and onebit's own headers (tcp), or payload only (gloo pairs). */
  onebit_stats_t onebit;
  /* The calls passed on to the framework's own allreduce (untagged, or not compressible), and
   * their buffers' size: elements × element size, once per call. A ring allreduce sends about
   * 2·(W−1)/W times that per rank. */
  uint64_t forwarded_calls;
  uint64_t forwarded_bytes;
} onebit_preload_stats_t;

ONEBIT_API onebit_result_t onebit_preload_stats(onebit_preload_stats_t* stats);

#ifdef __cplusplus
}
#endif

#endif /* ONEBIT_PRELOAD_H_ */
