/*
 * onebit's plain C types: the result codes, the element types and ops, the communicator handle,
 * the counters, and the optimizers' settings and states. No functions: the calls that take these
 * are in onebit.h, which includes this header, and so is the rule text each optimizer's settings
 * follow (pointed to below).
 *
 * Part of the C ABI (the same values and layouts whichever header a caller includes), and the one
 * public header the library's core may include (docs/design/layers.md): an onebit::Error carries an
 * onebit_result_t, the communicator fills an onebit_stats_t, the optimizer core computes on 0/1
 * Adam's and 1-bit LAMB's structs. The communicator settings, onebit_config_t, stay in onebit.h
 * beside their call (the doors translate them), and the preload's counters in preload.h.
 */
#ifndef ONEBIT_ONEBIT_TYPES_H_
#define ONEBIT_ONEBIT_TYPES_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ONEBIT_SUCCESS = 0,
  ONEBIT_INVALID_ARGUMENT = 1, /* the caller passed something wrong (null, bad dtype, size) */
  ONEBIT_SYSTEM_ERROR = 2,     /* the OS said no: socket, bind, memory */
  ONEBIT_TIMEOUT = 3,          /* a peer did not answer within ONEBIT_TIMEOUT_MS */
  ONEBIT_REMOTE_ERROR = 4,     /* a peer closed the connection or reported a failure */
  ONEBIT_MISMATCH = 5,         /* ranks disagree: tag, element count, dtype, op or call order */
  ONEBIT_NUMERIC_ERROR = 6,    /* a scale came out NaN or Inf: the input holds NaN/Inf */
  ONEBIT_INTERNAL_ERROR = 7,   /* a bug in onebit; please report it with the log */
  ONEBIT_UNSUPPORTED = 8,      /* not here: the library was built without what the call needs (CUDA), or
                                  a call that synchronizes was made on a stream capturing a CUDA graph */
  ONEBIT_RESULT_ENUM_MAX_ = 0x7fffffff
} onebit_result_t;

/* The *_ENUM_MAX_ members keep each enum int-sized and make every int a valid value of it in C++,
 * so a library compiled as C++ can check a caller's out-of-range value instead of meeting
 * undefined behaviour. They are not values to pass. */
typedef enum {
  ONEBIT_FLOAT32 = 0,
  ONEBIT_FLOAT16 = 1,
  ONEBIT_BFLOAT16 = 2,
  ONEBIT_DTYPE_ENUM_MAX_ = 0x7fffffff
} onebit_dtype_t;

/* SUM: the sum over ranks. AVG: the average. A compressed call returns W x its average for SUM. */
typedef enum { ONEBIT_SUM = 0, ONEBIT_AVG = 1, ONEBIT_OP_ENUM_MAX_ = 0x7fffffff } onebit_op_t;

/* A communicator: W ranks joined over onebit's TCP transport. */
typedef struct onebit_comm* onebit_comm_t;

/* Counters of one communicator since it was created. Bytes count payload and message headers. */
typedef struct {
  uint64_t compressed_calls;     /* allreduces of tagged buffers */
  uint64_t full_precision_calls; /* allreduces of untagged buffers (exact ring) */
  uint64_t bytes_sent;
  uint64_t bytes_received;
  uint64_t compressed_bytes_sent;     /* payload sent by compressed calls */
  uint64_t full_precision_bytes_sent; /* payload sent by ring calls */
} onebit_stats_t;

/* 1-bit Adam's settings; the rule: onebit.h, "1-bit Adam's optimizer arithmetic". */
typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t freeze_step; /* the first step of the compression stage (steps count from 0) */
} onebit_adam_config_t;

/* When the warmup ends by itself; the rule: onebit.h, "Automatic freeze". */
typedef struct {
  int64_t window;   /* >= 1: the variance change is measured after every window-th warmup step */
  double threshold; /* > 0: the warmup ends after the first measurement whose largest change is below */
  int64_t max_step; /* 0: no limit; else the warmup ends after step max_step - 1 at the latest */
} onebit_adam_auto_freeze_t;

/* OnebitAdam's driver (onebit.h, "OnebitAdam's driver"): the schedule it runs. */
typedef struct {
  int64_t freeze_step;                 /* the first step of the compression stage, >= 0; -1: automatic */
  onebit_adam_auto_freeze_t automatic; /* the rule when freeze_step is -1 */
  int32_t deepspeed_schedule;          /* 1: DeepSpeed's schedule call for call (the first call only counts) */
  int32_t bias_correction;             /* 1: torch.optim.Adam's bias-corrected steps */
} onebit_adam_schedule_t;

/* A group's hyper-parameters as given (float64: the step settings are made from them). */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
} onebit_adam_hyper_t;

/* What the next step of OnebitAdam is (onebit_adam_driver_status). */
typedef enum {
  ONEBIT_ADAM_COUNTING_STEP = 0,   /* DeepSpeed's initialising call: nothing moves, the gradient is dropped */
  ONEBIT_ADAM_WARMUP_STEP = 1,     /* exact gradient average; onebit_adam_warmup_step */
  ONEBIT_ADAM_COMPRESSED_STEP = 2, /* momentum step, compressed average of m, apply step */
  ONEBIT_ADAM_STEP_ENUM_MAX_ = 0x7fffffff
} onebit_adam_step_kind_t;

/* Where OnebitAdam's driver stands. */
typedef struct {
  int64_t step;        /* the next step, t (0-based, every call counted) */
  int64_t freeze_step; /* the first step of the compression stage; -1 while the automatic freeze is undecided */
  int64_t steps_taken; /* the updates made (DeepSpeed's counting call made none) */
  int32_t next;        /* onebit_adam_step_kind_t */
  int32_t freezes_now; /* 1: the next step is the first of the compression stage (the freeze report) */
} onebit_adam_driver_status_t;

/* A checkpoint of OnebitAdam's schedule; INT64_MIN in a field: not recorded (taken as this optimizer's). */
typedef struct {
  int64_t step;
  int64_t freeze_step; /* as decided; -1 or INT64_MAX: automatic and undecided */
  int64_t automatic;   /* 1: saved under freeze_step "auto" (the checkpoint holds a variance snapshot) */
  int64_t bias_correction;
  int64_t deepspeed_schedule;
} onebit_adam_driver_state_t;

typedef struct onebit_adam_driver* onebit_adam_driver_t;

/* A checkpoint file's records (onebit.h, "Checkpoint files"). */
typedef enum {
  ONEBIT_RECORD_ABSENT = 0,
  ONEBIT_RECORD_INT = 1,     /* one int64 */
  ONEBIT_RECORD_INTS = 2,    /* int64 values */
  ONEBIT_RECORD_FLOATS = 3,  /* float32 values */
  ONEBIT_RECORD_DOUBLES = 4, /* float64 values */
  ONEBIT_RECORD_TEXT = 5,    /* bytes of UTF-8 */
  ONEBIT_RECORD_KIND_ENUM_MAX_ = 0x7fffffff
} onebit_record_kind_t;

typedef struct onebit_checkpoint* onebit_checkpoint_t;

/* Where a shim compares its ranks, which picks the hint of onebit_ranks_disagreement's text
 * (onebit.h, "What the shims hold their ranks and checkpoints to"). */
typedef enum {
  ONEBIT_AGREED_AT_CONSTRUCTION = 0,
  ONEBIT_AGREED_AT_CHECKPOINT_LOAD = 1,
  ONEBIT_AGREED_AT_ENUM_MAX_ = 0x7fffffff
} onebit_agreed_at_t;

/* 0/1 Adam's settings, DeepSpeed's names and defaults; the rule: onebit.h, "0/1 Adam". */
typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t var_freeze_step;    /* DeepSpeed's default 100000 */
  int64_t var_update_scaler;  /* 16 */
  int64_t local_step_scaler;  /* 32678 */
  int64_t local_step_clipper; /* 16 */
} onebit_zero_one_adam_config_t;

/* The schedule's counters: the same on every rank; a checkpoint keeps them. */
typedef struct {
  int64_t step; /* the next step, t */
  int64_t var_interval, var_counter;
  int64_t local_step_interval, local_step_counter;
} onebit_zero_one_adam_schedule_t;

/* What a step of 0/1 Adam is (onebit_zero_one_adam_next). */
typedef enum {
  ONEBIT_ZERO_ONE_ADAM_VARIANCE_STEP = 0,   /* exact gradient average; gradient_step(update_variance = 1) */
  ONEBIT_ZERO_ONE_ADAM_COMPRESSED_STEP = 1, /* compressed gradient average; gradient_step(update_variance = 0) */
  ONEBIT_ZERO_ONE_ADAM_LOCAL_STEP = 2,      /* local_step; no communication */
  ONEBIT_ZERO_ONE_ADAM_SYNC_STEP = 3,       /* local_step, sync_begin, compressed average of u, sync_end */
  ONEBIT_ZERO_ONE_ADAM_STEP_ENUM_MAX_ = 0x7fffffff
} onebit_zero_one_adam_step_t;

/* 1-bit LAMB's settings, DeepSpeed's names and defaults; the rule: onebit.h, "1-bit LAMB". */
typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t freeze_step;           /* DeepSpeed's default 100000 */
  double max_coeff, min_coeff;   /* 10.0, 0.01 */
  double coeff_beta;             /* 0.9 */
  double factor_max, factor_min; /* 4.0, 0.5 */
  double factor_threshold;       /* 0.1 */
} onebit_lamb_config_t;

/* A layer's scalars: the same on every rank; a checkpoint keeps them. */
typedef struct {
  double coeff_freeze;  /* lamb_coeff_freeze: 0 at the start */
  double last_factor;   /* 1 at the start */
  double scaling_coeff; /* 0 until the first compression step sets it */
  double lamb_coeff;    /* the coefficient of the layer's last step (to log) */
} onebit_lamb_layer_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ONEBIT_ONEBIT_TYPES_H_ */
