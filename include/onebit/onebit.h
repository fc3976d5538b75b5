/*
 * onebit — 1-bit compressed, error-compensated allreduce (1-bit Adam's communication stage).
 *
 * The C ABI. Every call returns an onebit_result_t; on failure the calling thread's
 * onebit_last_error() names the problem (rank, tag, sizes). No call throws, and a failed call
 * leaves the caller's buffers and the error-feedback state as they were.
 */
#ifndef ONEBIT_ONEBIT_H_
#define ONEBIT_ONEBIT_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define ONEBIT_API
#else
#define ONEBIT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define ONEBIT_VERSION_MAJOR 0
#define ONEBIT_VERSION_MINOR 1
#define ONEBIT_VERSION_PATCH 0
/* 100 * 100 * major + 100 * minor + patch, like NCCL_VERSION_CODE. */
#define ONEBIT_VERSION_CODE \
  (ONEBIT_VERSION_MAJOR * 10000 + ONEBIT_VERSION_MINOR * 100 + ONEBIT_VERSION_PATCH)

typedef enum {
  ONEBIT_SUCCESS = 0,
  ONEBIT_INVALID_ARGUMENT = 1, /* the caller passed something wrong (null, bad dtype, size) */
  ONEBIT_SYSTEM_ERROR = 2,     /* the OS said no: socket, bind, memory */
  ONEBIT_TIMEOUT = 3,          /* a peer did not answer within ONEBIT_TIMEOUT_MS */
  ONEBIT_REMOTE_ERROR = 4,     /* a peer closed the connection or reported a failure */
  ONEBIT_MISMATCH = 5,         /* ranks disagree: tag, element count, dtype, op or call order */
  ONEBIT_NUMERIC_ERROR = 6,    /* a scale came out NaN or Inf: the input holds NaN/Inf */
  ONEBIT_INTERNAL_ERROR = 7    /* a bug in onebit; please report it with the log */
} onebit_result_t;

typedef enum { ONEBIT_FLOAT32 = 0, ONEBIT_FLOAT16 = 1, ONEBIT_BFLOAT16 = 2 } onebit_dtype_t;

/* The library's version code (ONEBIT_VERSION_CODE of the build that is loaded). */
ONEBIT_API int onebit_version(void);

/* Human-readable name of a result code ("ONEBIT_TIMEOUT", ...). Never NULL. */
ONEBIT_API const char* onebit_result_string(onebit_result_t result);

/* The calling thread's last error message, or "" if its last call succeeded. The pointer stays
 * valid until this thread's next onebit call. */
ONEBIT_API const char* onebit_last_error(void);

/* The CPU kernel set in use: "scalar", "avx2" or "avx512" (ONEBIT_SIMD, else the best this CPU
 * runs). Fails with ONEBIT_INVALID_ARGUMENT if ONEBIT_SIMD names a set this CPU cannot run. */
ONEBIT_API onebit_result_t onebit_cpu_kernels(const char** name);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ONEBIT_ONEBIT_H_ */
