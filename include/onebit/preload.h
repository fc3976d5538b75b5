/*
 * What libonebit-preload.so adds to the C ABI of onebit.h: it is loaded with LD_PRELOAD into an
 * unmodified framework and takes over the allreduce of tagged buffers (see docs/usage.md).
 */
#ifndef ONEBIT_PRELOAD_H_
#define ONEBIT_PRELOAD_H_

#include "onebit/onebit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Counters summed over every communicator the front doors created (one per framework
 * communicator that ran a tagged allreduce). */
ONEBIT_API onebit_result_t onebit_preload_stats(onebit_stats_t* stats);

#ifdef __cplusplus
}
#endif

#endif /* ONEBIT_PRELOAD_H_ */
