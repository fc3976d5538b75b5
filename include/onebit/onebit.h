/*
 * onebit — 1-bit compressed, error-compensated allreduce (1-bit Adam's communication stage).
 *
 * The C ABI. Every call returns an onebit_result_t; on failure the calling thread's
 * onebit_last_error() names the problem (rank, tag, sizes). No call throws, and a failed call
 * leaves the caller's buffers and the error-feedback state as they were.
 *
 * The plain types the calls take (result codes, element types, the communicator handle and its
 * counters, the optimizers' settings and states) are in onebit_types.h, included here; the rules
 * they follow are written out here, above the calls. onebit_config_t, which only the doors read,
 * is here beside its call.
 */
#ifndef ONEBIT_ONEBIT_H_
#define ONEBIT_ONEBIT_H_

#include <stddef.h>
#include <stdint.h>

/* Quoted, beside this file: found both installed (include/onebit/) and where the torch backend's
 * sources ship the two headers side by side (python/onebit/csrc/). */
#include "onebit_types.h"

#if defined(_WIN32)
#define ONEBIT_API
#else
#define ONEBIT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define ONEBIT_VERSION_MAJOR 0
#define ONEBIT_VERSION_MINOR 2
#define ONEBIT_VERSION_PATCH 0
/* 100 * 100 * major + 100 * minor + patch, like NCCL_VERSION_CODE. */
#define ONEBIT_VERSION_CODE (ONEBIT_VERSION_MAJOR * 10000 + ONEBIT_VERSION_MINOR * 100 + ONEBIT_VERSION_PATCH)

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

/* Joins a job of `size` ranks as `rank`. Rank 0 serves the bootstrap at `root` ("host:port",
 * "[v6]:port"); every rank connects there. Blocks until all ranks are connected, or fails after
 * ONEBIT_TIMEOUT_MS naming the ranks that never came. */
ONEBIT_API onebit_result_t onebit_comm_init(onebit_comm_t* comm, int rank, int size, const char* root);

/* Per-communicator settings; a zero (or NULL) field takes its ONEBIT_* variable's value.
 *
 * Who may join (docs/reliability.md, "Who is in a communicator"): the bootstrap binds every rank
 * to the communicator's identity, `job_id`, and to the key derived from it and the secrets given.
 * A rank of another identity or key is refused, named, and never joins. NULL job_id: the
 * launcher's job identity (ONEBIT_JOB_ID, torchrun's run id and restart count, Slurm's job and
 * step, Open MPI's job, MASTER_ADDR:MASTER_PORT). A framework with a rendezvous passes a random
 * id and a random `secret` through it (onebit's torch backend and Gloo door do): then nothing that
 * is not given both gets in. `job_id` and `secret` are new in 0.2: a caller built against 0.1's
 * header must be rebuilt (its struct ends at auth_key). */
typedef struct {
  int64_t timeout_ms;        /* ONEBIT_TIMEOUT_MS */
  int sockets_per_peer;      /* ONEBIT_SOCKETS_PER_PEER */
  const char* socket_ifname; /* ONEBIT_SOCKET_IFNAME */
  const char* auth_key;      /* ONEBIT_AUTH_KEY: a secret every rank shares (never logged) */
  const char* job_id;        /* this communicator's identity, the same text on its ranks only */
  const char* secret;        /* a secret its ranks share, e.g. random bytes from the job's store (never logged) */
} onebit_config_t;

/* As onebit_comm_init, with explicit settings (config may be NULL). */
ONEBIT_API onebit_result_t onebit_comm_init_config(onebit_comm_t* comm, int rank, int size, const char* root,
                                                   const onebit_config_t* config);

/* For a launcher that publishes the root's address itself (a store, a rendezvous, a fork): on rank
 * 0, before onebit_comm_init*, listens on `where` ("host:0" for a port the kernel picks, or
 * "host:port") and writes the address it listens on ("host:port", "[v6]:port") into `root`
 * (root_size bytes, NUL included). Publish it, then pass it as this rank's `root` to
 * onebit_comm_init*: the communicator serves the bootstrap on that listener, so no other process
 * can take the port between the choice and the bind (no probe that binds, closes and binds
 * again). A listener no communicator takes stays open until the process ends. */
ONEBIT_API onebit_result_t onebit_root_listen(const char* where, char* root, size_t root_size);

/* Whether this rank (of `size`) reaches the root rank 0 published (onebit_root_listen, then the
 * launcher's own channel): a connection within timeout_ms (0: 5 s, at most ONEBIT_TIMEOUT_MS),
 * closed at once. Fails naming `rank`, the address and the reason (ONEBIT_TIMEOUT: nothing
 * answered; a loopback address that rank 0 published to another host says so). Rank 0 listens
 * before it publishes, so an unreachable root is an error now, not a late rank 0: ask it on every
 * rank other than 0 and agree on the answers over the same channel before onebit_comm_init*, so
 * that every rank fails within seconds naming the address, instead of rank 0 waiting out the
 * timeout for ranks that never arrive (onebit's torch backend and Gloo door do; docs/reliability.md).
 * Every rank connects: while onebit_root_listen's listener is held, a thread of rank 0's process
 * accepts the checks and closes them, so they never fill the kernel's accept queue however many
 * ranks there are. `size` is checked against `rank` only. */
ONEBIT_API onebit_result_t onebit_root_check(int rank, int size, const char* root, int64_t timeout_ms);

/* Closes the listener onebit_root_listen opened at `root` (the address it wrote) when no
 * communicator will be made there after all (a rank could not reach it). ONEBIT_INVALID_ARGUMENT
 * when no listener is held at `root`. */
ONEBIT_API onebit_result_t onebit_root_close(const char* root);

/* As onebit_comm_init, with rank, size and root from the environment: ONEBIT_RANK,
 * ONEBIT_WORLD_SIZE, ONEBIT_ROOT; else the launcher's RANK / WORLD_SIZE / MASTER_ADDR (torchrun),
 * OMPI_COMM_WORLD_RANK / _SIZE (OpenMPI), SLURM_PROCID / SLURM_NTASKS (Slurm); the port with
 * MASTER_ADDR is ONEBIT_ROOT_PORT (29511), never MASTER_PORT. */
ONEBIT_API onebit_result_t onebit_comm_init_env(onebit_comm_t* comm);

/* Closes the connections and frees the communicator's error states. NULL is a no-op. Safe after a
 * failed call. Calls of this communicator still running on other threads fail with
 * ONEBIT_INVALID_ARGUMENT ("destroyed while this call ran"; their peers are told) and have
 * returned before this does — over the Gloo door's context pairs, which cannot be interrupted,
 * they end at their own timeout first. A call that starts after this returned, or races it at its
 * very entry, uses a freed communicator: as with ncclCommDestroy, the caller orders the two. */
ONEBIT_API onebit_result_t onebit_comm_destroy(onebit_comm_t comm);

ONEBIT_API onebit_result_t onebit_comm_rank(onebit_comm_t comm, int* rank);
ONEBIT_API onebit_result_t onebit_comm_size(onebit_comm_t comm, int* size);
/* Ranks per host the communicator's tagged calls use: above 1 (and below its size) they run
 * hierarchically — fp32 within each host, 1-bit between hosts. From ONEBIT_LOCAL_SIZE, else
 * torchrun's LOCAL_WORLD_SIZE, for a communicator of the job's whole world (docs/usage/c-cpp.md). */
ONEBIT_API onebit_result_t onebit_comm_local_size(onebit_comm_t comm, int* local_size);
/* The ranks per host of the hierarchical compression a communicator of `size` ranks, this process
 * its rank `rank`, would run when made from the environment by any door (C API, Gloo door, torch
 * backend) — 1 where it compresses flat — known before it exists. A checkpoint's error feedback
 * belongs to the chunks of its layout (size, ranks per host): what a shim records and compares. */
ONEBIT_API onebit_result_t onebit_local_size_from_env(int rank, int size, int* local_size);
ONEBIT_API onebit_result_t onebit_comm_stats(onebit_comm_t comm, onebit_stats_t* stats);

/* Tags the buffer at `ptr` (`count` elements of `dtype`) as `name`: allreduces of exactly this
 * buffer and count run compressed, with an error-feedback state that belongs to the name. Every
 * rank must tag the same names with the same count and dtype. Tagging a known name at a new
 * pointer moves the tag and keeps its state (the same count and dtype are required).
 *
 * Lifetime: a tag lives until onebit_untag(ptr). onebit cannot see C memory being freed, so the
 * contract stops there: free a tagged buffer without untagging it, and a later buffer that lands
 * at the same address with the same count and dtype is compressed as that tag, with its error
 * feedback. Untag (or onebit_tag_detach) before free; the C++ optimizer shims untag in their
 * destructors. The Python shim ties each tag to its tensor's storage and detaches it when the
 * memory is freed. */
ONEBIT_API onebit_result_t onebit_tag(const char* name, void* ptr, size_t count, onebit_dtype_t dtype);

/* Removes the tag of `ptr` and frees its error state: the next tag of that name starts from zero. */
ONEBIT_API onebit_result_t onebit_untag(void* ptr);

/* The tagged buffer at `ptr` is being freed: `ptr` is no longer tagged, but the name keeps its
 * error-feedback state, so tagging the name at another buffer later moves it with its state — the
 * same as re-tagging before the free. What a language binding calls when it sees memory freed. */
ONEBIT_API onebit_result_t onebit_tag_detach(void* ptr);

/* Whether onebit_allreduce of `count` elements of `dtype` at `ptr` would be compressed: *tagged is 1
 * when `ptr` is tagged with exactly that count and dtype, else 0. `name` (may be NULL; `name_size`
 * bytes) receives the name `ptr` is tagged under whatever its count and dtype, or "" (truncated to
 * fit, always NUL-terminated). What a door that forwards untagged calls elsewhere asks per call
 * (the torch backend: untagged calls are gloo's). */
ONEBIT_API onebit_result_t onebit_tag_find(const void* ptr, size_t count, onebit_dtype_t dtype, int* tagged, char* name,
                                           size_t name_size);

/* Calls and payload bytes sent by the compressed allreduces of tag `name`, over all communicators. */
ONEBIT_API onebit_result_t onebit_tag_stats(const char* name, uint64_t* calls, uint64_t* bytes_sent);

/* The settings every rank must share for tag `name`'s next compressed allreduces — an optimizer's
 * learning rate, betas, eps, weight decay, step and stage: `count` values named by `keys` (a key
 * may carry text, e.g. "stage: compression since step 20", with value 0). Their digest travels in
 * each call's worker messages, at no extra message: when the ranks' digests differ the call fails
 * on every rank with ONEBIT_MISMATCH naming the first rank that differs and, on each rank, its own
 * values, with no buffer or error state changed. On the NCCL door's device path, whose calls are
 * queued on a stream and cannot fail afterwards, a difference makes the call's output non-finite
 * on every rank instead, the error state kept, and the tag's next call logs why. Ranks that all set
 * none (count 0) agree. The settings stay until set again. */
ONEBIT_API onebit_result_t onebit_tag_set_step_settings(const char* name, const char* const* keys, const double* values,
                                                        size_t count);

/* Checkpoints of error feedback. A tag's state on this rank is its worker error (the tag's count
 * floats) and its server error (the floats of this rank's chunk, which depend on the world size).
 * Save writes the true errors (zeros before the first call); the tag must have been used on at most
 * one communicator. Load, before the tag's first call in a new job, makes that call continue exactly
 * where the saved job stopped — bit for bit — provided the world size and rank are the same (a
 * different server length is refused at that call). Every rank saves and loads its own state. */
ONEBIT_API onebit_result_t onebit_tag_state_size(const char* name, size_t* worker_count, size_t* server_count);
ONEBIT_API onebit_result_t onebit_tag_state_save(const char* name, float* worker, float* server);
ONEBIT_API onebit_result_t onebit_tag_state_load(const char* name, const float* worker, size_t worker_count,
                                                 const float* server, size_t server_count);
/* Whether onebit_tag_state_load would take a worker error of `worker_count` floats now, loading
 * nothing: ONEBIT_SUCCESS, or the refusal it would give (a tag that has already run, another
 * count), with its message. What a shim asks before it changes anything of a checkpoint's, so
 * that a refused load leaves the optimizer as it was. */
ONEBIT_API onebit_result_t onebit_tag_state_check(const char* name, size_t worker_count);
/* Whether error feedback saved by a job of `saved_size` ranks, `saved_local_size` per host (1:
 * flat; 0: not recorded, then the size alone is compared), may be loaded into one of `size` ranks,
 * `local_size` per host (onebit_local_size_from_env, onebit_comm_local_size): ONEBIT_SUCCESS, or
 * ONEBIT_INVALID_ARGUMENT naming both layouts. Each rank's error feedback belongs to the chunks
 * its layout gave it: loaded into another, it would be applied to other elements. A checkpoint
 * without error feedback (saved before the first compressed call) fits any layout. */
ONEBIT_API onebit_result_t onebit_tag_state_check_layout(int saved_size, int saved_local_size, int size,
                                                         int local_size);

/* In-place allreduce of `count` elements at `buf`. A tagged buffer (same pointer and count) runs the
 * compressed, error-compensated algorithm; any other runs an exact full-precision ring
 * (reduce-scatter + allgather). On failure the buffer and the error state are unchanged; after a
 * transport failure (timeout, peer gone, mismatch) the communicator is broken: destroy it. */
ONEBIT_API onebit_result_t onebit_allreduce(onebit_comm_t comm, void* buf, size_t count, onebit_dtype_t dtype,
                                            onebit_op_t op);

/* ---- 1-bit Adam's optimizer arithmetic over flat fp32 arrays (the shims' shared core) ----
 * Step t (0-based) < freeze_step: warmup, full-precision Adam on the gradient averaged over ranks
 * (onebit_adam_warmup_step). From freeze_step on: onebit_adam_momentum_step with the local
 * gradient, then the caller allreduces the momentum (tagged: compressed) and averages it, then
 * onebit_adam_apply_step with the frozen variance. No bias correction; decoupled weight decay.
 * The settings: onebit_adam_config_t (onebit_types.h). */

/* The freeze step to use: ONEBIT_FREEZE_STEP when it is set (>= 0), else `requested`. Every shim
 * asks here, so the variable tunes an existing script, Python or C++, without edits. */
ONEBIT_API int64_t onebit_adam_freeze_step(int64_t requested);

/* 1 if step t is in the compression stage, 0 if in warmup; -1 (and last error) for a bad config. */
ONEBIT_API int onebit_adam_compressing(const onebit_adam_config_t* config, int64_t step);
ONEBIT_API onebit_result_t onebit_adam_warmup_step(const onebit_adam_config_t* config, float* params, float* m,
                                                   float* v, const float* grad, size_t count);
ONEBIT_API onebit_result_t onebit_adam_momentum_step(const onebit_adam_config_t* config, float* m, const float* grad,
                                                     size_t count);
/* onebit_adam_momentum_step that also writes m as it was into m_before, in the same pass: what a
 * shim keeps to undo a failed all_reduce of the momentum, for one pass over the arrays fewer than a
 * copy and then the step. m_before must not overlap m. */
ONEBIT_API onebit_result_t onebit_adam_momentum_step_keeping(const onebit_adam_config_t* config, float* m,
                                                             float* m_before, const float* grad, size_t count);
/* After the average, the two rules below: m <- 0 for every dormant element, then
 * p <- p - lr*(clip(m/(sqrt(v)+eps), +-C) + wd*p). */
ONEBIT_API onebit_result_t onebit_adam_apply_step(const onebit_adam_config_t* config, float* params, float* m,
                                                  const float* v, size_t count);

/* ---- 1-bit Adam's steps over device memory (CUDA) ----
 * The three steps above with the same rule, element for element the same bits (the CPU calls
 * are their oracle), over device pointers (cudaMalloc'd, or a torch CUDA tensor's data_ptr) on
 * `stream` (a cudaStream_t; NULL: the legacy default stream): asynchronous — they return once the
 * kernels are queued, errors in the launch returned, the arrays' values ready in stream order —
 * allocating nothing, and capturable in a CUDA graph. m_before may be NULL (then nothing is kept).
 * They run in libonebit-nccl-preload.so (built with CUDA); libonebit.so and libonebit-preload.so,
 * built without CUDA, return ONEBIT_UNSUPPORTED saying so. onebit_device_steps() tells which. */
ONEBIT_API int onebit_device_steps(void); /* 1 where the device steps run, 0 where they are absent */
ONEBIT_API onebit_result_t onebit_adam_warmup_step_device(const onebit_adam_config_t* config, float* params, float* m,
                                                          float* v, const float* grad, size_t count, void* stream);
ONEBIT_API onebit_result_t onebit_adam_momentum_step_device(const onebit_adam_config_t* config, float* m,
                                                            float* m_before, const float* grad, size_t count,
                                                            void* stream);
ONEBIT_API onebit_result_t onebit_adam_apply_step_device(const onebit_adam_config_t* config, float* params, float* m,
                                                         const float* v, size_t count, void* stream);

/* ---- Steps under a frozen variance ----
 * Wherever v is no longer updated and the momentum (or 0/1 Adam's update) is averaged compressed
 * or taken locally — 1-bit Adam's and 1-bit LAMB's compression stage, 0/1 Adam's compressed, local
 * and sync steps — two rules bound the step (docs/design/optimizer-rules.md, "Steps under a frozen variance"; 1-bit
 * LAMB takes the first only):
 * 1. A *dormant* element, sqrt(v) <= eps (no gradient worth the name reached it while v was
 *    measured), takes no momentum step: its momentum is 0 after the average and it moves by weight
 *    decay alone. (Its compressed momentum is its chunk's scale; divided by ~eps it would move
 *    1e8 times too far.)
 * 2. Every other element's direction m/(sqrt(v)+eps) is clipped to +-C, C = onebit_adam_step_bound
 *    (beta1, beta2): the largest |m/sqrt(v)| Adam itself can produce, so no step is larger than
 *    Adam's own largest. (A stale v, or compression error on an element whose v is small, would
 *    otherwise move it without limit.) 0/1 Adam's sync moves an element at most lrs*(C + wd*|p_sync|).
 * v and the averaged momentum are the same on every rank, so both rules decide alike everywhere. */
/* C = (1-beta1) / sqrt((1-beta2)(1-beta1^2/beta2)) (7.27 for 0.9, 0.999); 1/sqrt(1-beta2) when
 * beta1 = 0; +infinity (no bound) when beta1^2 >= beta2. */
ONEBIT_API float onebit_adam_step_bound(float beta1, float beta2);
/* *dormant = the number of dormant elements among v[0, count) for this eps (the shims' log line). */
ONEBIT_API onebit_result_t onebit_dormant_count(const float* v, size_t count, float eps, size_t* dormant);

/* ---- Automatic freeze: when the warmup ends (the shims' freeze_step="auto") ----
 * After every `window`-th warmup step (steps window-1, 2*window-1, ...) each rank measures how far
 * its variance moved since the last measurement,
 *     change = sum |v - v_then| / sum |v|      (v_then: zeros at the first measurement, so 1),
 * every rank gathers every rank's change exactly (float64 bits through an exact exchange), and
 * onebit_adam_auto_freeze_decide_ranks takes the largest — so every rank decides alike, in every
 * shim, C++ and Python — and ends the warmup after the first measurement whose largest change is
 * < threshold, or after step max_step - 1 when max_step > 0. The compression stage starts at the
 * next step. (The largest, not the average: the warmup ends only once every rank's variance has
 * settled; docs/design/optimizer-rules.md, "Automatic freeze".) The settings:
 * onebit_adam_auto_freeze_t (onebit_types.h). */

/* 1 if the shim measures after warmup step `step`, 0 if not; -1 (and last error) for a bad config. */
ONEBIT_API int onebit_adam_auto_freeze_measures(const onebit_adam_auto_freeze_t* config, int64_t step);
/* The measurement over `count` elements: *change as above (0 when v and v_then are both all zero),
 * summed in fp64 in one tiled order (the device twin's, below). The shim copies v into v_then once
 * it has decided. */
ONEBIT_API onebit_result_t onebit_adam_variance_change(const float* v, const float* v_then, size_t count,
                                                       double* change);

/* The two measurements over device memory (CUDA): the dormant count and the variance change, the
 * host calls' answers bit for bit (the change is summed in one tiled order on both; the count is
 * exact: docs/design/optimizers.md, "The optimizers on the device"). Each reads its answer back, so it
 * synchronizes `stream` (a cudaStream_t; NULL: the legacy default stream) and is not capturable in
 * a CUDA graph: on a capturing stream it returns ONEBIT_UNSUPPORTED, queuing nothing and leaving
 * the capture valid. `workspace` holds the partial sums: device memory of the current device,
 * onebit_measure_workspace_size(count) bytes at least (one 24-byte sum per 2048 elements), 8-byte
 * aligned. Refused, naming the problem, before anything runs and with the answer unchanged: a
 * NULL array or answer, eps <= 0, arrays or a workspace that are not memory of the current device,
 * a workspace too small or misaligned. ONEBIT_UNSUPPORTED from the libraries built without CUDA
 * (onebit_device_steps()). */
ONEBIT_API size_t onebit_measure_workspace_size(size_t count);
ONEBIT_API onebit_result_t onebit_dormant_count_device(const float* v, size_t count, float eps, void* workspace,
                                                       size_t workspace_bytes, size_t* dormant, void* stream);
ONEBIT_API onebit_result_t onebit_adam_variance_change_device(const float* v, const float* v_then, size_t count,
                                                              void* workspace, size_t workspace_bytes, double* change,
                                                              void* stream);
/* After warmup step `step`, given its measured change (ignored when it measures nothing): the first
 * step of the compression stage (step + 1) if the warmup ends now, else -1; -2 (and last error)
 * for a bad config. A shim measures and decides after the step is complete (its count advanced),
 * before the next backward pass, so a DDP hook sees the stage it is in. */
ONEBIT_API int64_t onebit_adam_auto_freeze_decide(const onebit_adam_auto_freeze_t* config, int64_t step, double change);
/* The rule across ranks, what the shims call: onebit_adam_auto_freeze_decide on the largest of the
 * `ranks` changes at `changes` (every rank's measurement of this step, in any order; NaN if any is
 * NaN, which never ends the warmup; not read when the step measures nothing). *decided (may be
 * NULL) receives that change, for the shim's record. Same answers as above; -2 (and last error)
 * for a bad config, or no changes on a step that measures. */
ONEBIT_API int64_t onebit_adam_auto_freeze_decide_ranks(const onebit_adam_auto_freeze_t* config, int64_t step,
                                                        const double* changes, size_t ranks, double* decided);

/* ---- What the shims say ----
 * The words every optimizer shim (C++ and Python) uses, written once here. Each writes its text
 * into `text` (at most text_size bytes, NUL included; cut short if it does not fit, as snprintf
 * does) and its whole length, without the NUL, into *length (may be NULL).
 * onebit_freeze_report: the line rank 0 logs when the variance freezes, "<who>: variance frozen
 * from step S; D of N elements are dormant" and, when D > 0, why and in which groups — dormant[g]
 * of counts[g] elements of group g (onebit_dormant_count, or its device twin, per group).
 * onebit_step_failure_text: the message of a compressed step that failed with `code` and the
 * message `error`, "<who> step S (<stage>): <error>", and for ONEBIT_NUMERIC_ERROR the likely
 * causes (docs/usage/optimizers.md, "A step fails on NaN or Inf"). Like every call, a successful one clears
 * onebit_last_error(): take the failed call's message (`error`) before asking for the text. */
ONEBIT_API onebit_result_t onebit_freeze_report(const char* who, int64_t step, const size_t* dormant,
                                                const size_t* counts, size_t groups, char* text, size_t text_size,
                                                size_t* length);
ONEBIT_API onebit_result_t onebit_step_failure_text(const char* who, int64_t step, const char* stage,
                                                    onebit_result_t code, const char* error, char* text,
                                                    size_t text_size, size_t* length);

/* ---- What the shims hold their ranks and checkpoints to ----
 * The shims exchange the values over their own channel and ask these for the verdict, in the words
 * above's way: the refusal's text, or "" (length 0) where there is none.
 * onebit_ranks_disagreement: whether every rank's row of `table` (`ranks` rows of `field_count`
 * values, row r rank r's, each value named by `fields`) is alike; else "<who>: the ranks disagree on
 * <field>: rank 0 has X, rank 1 has Y; every rank must be given the same value (<hint>)" for the
 * first field that differs (INT64_MAX said "auto (undecided)"), which a shim raises as
 * ONEBIT_MISMATCH; `at` (onebit_agreed_at_t) picks the hint: a disagreement met when the optimizers
 * are made, or when a checkpoint is loaded.
 * onebit_resume_refusal: whether a checkpoint saved after `step` steps can go on under this
 * optimizer's schedule: `count` settings named by `names`, as saved (INT64_MIN: not recorded,
 * taken as this optimizer's) and this optimizer's (`mine`). Setting 0 is the freeze step, which may
 * differ where the checkpoint is before the freeze under both (step < both, or step <= both where
 * `freeze_inclusive`: 0/1 Adam's var_freeze_step is the last step of its variance stage); every
 * other must be the same. The text names each setting that cannot go on (docs/usage/restarting.md,
 * "Restarting a job"); a shim raises it as ONEBIT_INVALID_ARGUMENT. */
ONEBIT_API onebit_result_t onebit_ranks_disagreement(const char* who, const char* const* fields, size_t field_count,
                                                     const int64_t* table, size_t ranks, onebit_agreed_at_t at,
                                                     char* text, size_t text_size, size_t* length);
ONEBIT_API onebit_result_t onebit_resume_refusal(int64_t step, const char* const* names, const int64_t* saved,
                                                 const int64_t* mine, size_t count, int freeze_inclusive, char* text,
                                                 size_t text_size, size_t* length);

/* What each optimizer's ranks agree on and what its checkpoints may resume, for 0/1 Adam and
 * 1-bit LAMB (OnebitAdam's: its driver, below): the fields, named (static names; up to
 * `capacity` written, the count in *count), that onebit_ranks_disagreement judges — at a load, with
 * the checkpoint's schedule state (`schedule`, `step`) for this optimizer's; and the refusal text
 * ("" where it can go on). 0/1 Adam's refuses a schedule state no run reaches ("the checkpoint's
 * schedule is malformed") and, from `saved_knobs` (NULL, or a field INT64_MIN: not recorded), a
 * moved var_freeze_step past the variance stage or any other knob changed; 1-bit LAMB's a moved
 * freeze step past the warmup (onebit_resume_refusal's rule). */
ONEBIT_API onebit_result_t onebit_zero_one_adam_agreed_fields(const onebit_zero_one_adam_config_t* config,
                                                              const onebit_zero_one_adam_schedule_t* schedule,
                                                              size_t parameters, size_t groups, const char** names,
                                                              int64_t* values, size_t capacity, size_t* count);
ONEBIT_API onebit_result_t onebit_zero_one_adam_resume_refusal(const onebit_zero_one_adam_config_t* config,
                                                               const onebit_zero_one_adam_schedule_t* saved,
                                                               const onebit_zero_one_adam_config_t* saved_knobs,
                                                               char* text, size_t text_size, size_t* length);
/* Why 0/1 Adam's sync at schedule step `step` cannot run, or "" (the text convention above): a
 * group whose learning-rate sum since the last sync, lr_sums[g], is 0 — lr 0 at every local step —
 * has no accumulated update to divide by it. The shims ask before the sync changes anything. */
ONEBIT_API onebit_result_t onebit_zero_one_adam_sync_refusal(const float* lr_sums, size_t groups, int64_t step,
                                                             char* text, size_t text_size, size_t* length);
ONEBIT_API onebit_result_t onebit_lamb_agreed_fields(const onebit_lamb_config_t* config, int64_t step,
                                                     size_t parameters, size_t layers, const char** names,
                                                     int64_t* values, size_t capacity, size_t* count);
ONEBIT_API onebit_result_t onebit_lamb_resume_refusal(const onebit_lamb_config_t* config, int64_t step,
                                                      int64_t saved_freeze_step, char* text, size_t text_size,
                                                      size_t* length);

/* ---- OnebitAdam's driver: its schedule, written once for every shim ----
 * Everything of OnebitAdam that is neither arithmetic nor I/O: the step count and what each step
 * is, the freeze step and the automatic decision with its history, each group's step settings
 * (bias correction folded in), the fields the ranks must agree on, and what a checkpoint of the
 * schedule holds and when it may go on. The shim (C++ onebit::OnebitAdam, Python onebit.OnebitAdam)
 * holds the arrays, runs the collectives over its own channel and the steps above, and asks:
 *
 *   status → next: COUNTING (nothing moves) | WARMUP | COMPRESSED (freezes_now: log the freeze report)
 *   for each group: onebit_adam_driver_config → the step's onebit_adam_config_t, then the steps
 *   onebit_adam_driver_taken(&measure): measure → the shim measures the variance change
 *     (onebit_adam_variance_change or its device twin), gathers every rank's exactly, copies v into
 *     v_then and calls onebit_adam_driver_decide with them
 *   onebit_adam_driver_news: the line rank 0 logs of that step (the automatic freeze fired), or ""
 *
 * A step that fails before onebit_adam_driver_taken leaves the driver where it was; decide takes
 * one measurement a time it was asked for (another is refused). A handle is one optimizer's, used
 * by one thread at a time.
 * onebit_adam_driver_create: ONEBIT_INVALID_ARGUMENT naming `who` and the setting for a schedule
 * that cannot run (freeze_step < -1; deepspeed_schedule with an automatic freeze or bias
 * correction; the automatic rule out of range); ONEBIT_FREEZE_STEP, when set, overrides the
 * schedule's freeze step ("auto" too). `parameters` and `groups` are agreed on with the schedule.
 * onebit_adam_driver_agreed_fields: what every rank must hold alike (onebit_ranks_disagreement
 * judges the table), names static; up to `capacity` written, the count in *count; `state` (may be
 * NULL) gives a checkpoint's step and decided freeze step for the agreement at load.
 * onebit_adam_driver_resume_refusal: why a checkpoint of `saved` cannot go on under this schedule
 * (the texts' way, "" where it can; a schedule no run makes — a negative step, a freeze step
 * below -1 — is "malformed"); onebit_adam_driver_resume goes on from it (refusing as
 * above), with the automatic freeze's recorded measurements (steps and changes, `count` of them).
 * onebit_adam_driver_changes: the recorded measurements, up to `capacity`, the count in *count. */
ONEBIT_API onebit_result_t onebit_adam_driver_create(const char* who, const onebit_adam_schedule_t* schedule,
                                                     size_t parameters, size_t groups, onebit_adam_driver_t* driver);
ONEBIT_API void onebit_adam_driver_destroy(onebit_adam_driver_t driver);
ONEBIT_API onebit_result_t onebit_adam_driver_status(onebit_adam_driver_t driver, onebit_adam_driver_status_t* status);
ONEBIT_API onebit_result_t onebit_adam_driver_config(onebit_adam_driver_t driver, const onebit_adam_hyper_t* group,
                                                     onebit_adam_config_t* config);
ONEBIT_API onebit_result_t onebit_adam_driver_taken(onebit_adam_driver_t driver, int* measure);
ONEBIT_API onebit_result_t onebit_adam_driver_decide(onebit_adam_driver_t driver, const double* changes, size_t ranks);
ONEBIT_API onebit_result_t onebit_adam_driver_news(onebit_adam_driver_t driver, char* text, size_t text_size,
                                                   size_t* length);
ONEBIT_API onebit_result_t onebit_adam_driver_changes(onebit_adam_driver_t driver, int64_t* steps, double* changes,
                                                      size_t capacity, size_t* count);
ONEBIT_API onebit_result_t onebit_adam_driver_agreed_fields(onebit_adam_driver_t driver,
                                                            const onebit_adam_driver_state_t* state, const char** names,
                                                            int64_t* values, size_t capacity, size_t* count);
ONEBIT_API onebit_result_t onebit_adam_driver_state(onebit_adam_driver_t driver, onebit_adam_driver_state_t* state);
ONEBIT_API onebit_result_t onebit_adam_driver_resume_refusal(onebit_adam_driver_t driver,
                                                             const onebit_adam_driver_state_t* saved, char* text,
                                                             size_t text_size, size_t* length);
ONEBIT_API onebit_result_t onebit_adam_driver_resume(onebit_adam_driver_t driver,
                                                     const onebit_adam_driver_state_t* saved, const int64_t* steps,
                                                     const double* changes, size_t count);

/* ---- Checkpoint files: an optimizer's state, one format for every shim ----
 * A file of named records (int64, arrays of int64, float32 or float64, text) that the C++ shims'
 * save_file()/load_file() and the Python optimizers' save_file()/load_file() write and read, so a
 * checkpoint saved by one language resumes in the other (the records each optimizer writes:
 * docs/design/checkpoints.md, "Checkpoint files"). A rank's own file holds its part; a job's file
 * (Python's save_file(path, consolidated=True)) holds what every rank holds alike under its plain
 * name, once, and each rank r's own records (its error feedback, and any field that differs
 * between ranks) under "rank<r>/<name>", r in decimal digits.
 * The writer puts records and writes the file whole; or (onebit_checkpoint_stream) writes each
 * record as it is put, holding none, and onebit_checkpoint_commit completes the file. Either way
 * it goes to a temporary file in the same folder, flushed and renamed over `path`: a stream
 * destroyed uncommitted, or one whose write failed (it then takes no record and no commit),
 * leaves `path` as it was and no temporary file.
 * onebit_checkpoint_read checks the format (magic, version, lengths, a CRC-32 of the bytes),
 * refusing a damaged or foreign file with ONEBIT_INVALID_ARGUMENT naming the path and what is
 * wrong. onebit_checkpoint_read_rank reads rank `rank`'s view of it: the plain records and rank
 * `rank`'s with the prefix taken off, holding no other rank's (all are read, for the CRC). A rank
 * the file has no part of (a job grown since) sees rank 0's view, whose "rank" record says so, for
 * the load's rules to take or refuse.
 * A get of a record that is absent or of another kind, or with another count, or of a streamed
 * file, is ONEBIT_INVALID_ARGUMENT naming it and changes nothing; onebit_checkpoint_record says a
 * record's kind (ONEBIT_RECORD_ABSENT when there is none) and count (bytes, for a text).
 * onebit_checkpoint_names gives the names in the order written (static while the handle lives), up
 * to `capacity`, their number in *count. */
ONEBIT_API onebit_result_t onebit_checkpoint_create(onebit_checkpoint_t* checkpoint);
ONEBIT_API void onebit_checkpoint_destroy(onebit_checkpoint_t checkpoint);
ONEBIT_API onebit_result_t onebit_checkpoint_put_int(onebit_checkpoint_t checkpoint, const char* name, int64_t value);
ONEBIT_API onebit_result_t onebit_checkpoint_put_ints(onebit_checkpoint_t checkpoint, const char* name,
                                                      const int64_t* values, size_t count);
ONEBIT_API onebit_result_t onebit_checkpoint_put_floats(onebit_checkpoint_t checkpoint, const char* name,
                                                        const float* values, size_t count);
ONEBIT_API onebit_result_t onebit_checkpoint_put_doubles(onebit_checkpoint_t checkpoint, const char* name,
                                                         const double* values, size_t count);
ONEBIT_API onebit_result_t onebit_checkpoint_put_text(onebit_checkpoint_t checkpoint, const char* name,
                                                      const char* text);
ONEBIT_API onebit_result_t onebit_checkpoint_write(onebit_checkpoint_t checkpoint, const char* path);
ONEBIT_API onebit_result_t onebit_checkpoint_stream(const char* path, onebit_checkpoint_t* checkpoint);
ONEBIT_API onebit_result_t onebit_checkpoint_commit(onebit_checkpoint_t checkpoint);
ONEBIT_API onebit_result_t onebit_checkpoint_read(const char* path, onebit_checkpoint_t* checkpoint);
ONEBIT_API onebit_result_t onebit_checkpoint_read_rank(const char* path, int rank, onebit_checkpoint_t* checkpoint);
ONEBIT_API onebit_result_t onebit_checkpoint_record(onebit_checkpoint_t checkpoint, const char* name,
                                                    onebit_record_kind_t* kind, size_t* count);
ONEBIT_API onebit_result_t onebit_checkpoint_names(onebit_checkpoint_t checkpoint, const char** names, size_t capacity,
                                                   size_t* count);
ONEBIT_API onebit_result_t onebit_checkpoint_get_int(onebit_checkpoint_t checkpoint, const char* name, int64_t* value);
ONEBIT_API onebit_result_t onebit_checkpoint_get_ints(onebit_checkpoint_t checkpoint, const char* name, int64_t* values,
                                                      size_t count);
ONEBIT_API onebit_result_t onebit_checkpoint_get_floats(onebit_checkpoint_t checkpoint, const char* name, float* values,
                                                        size_t count);
ONEBIT_API onebit_result_t onebit_checkpoint_get_doubles(onebit_checkpoint_t checkpoint, const char* name,
                                                         double* values, size_t count);
ONEBIT_API onebit_result_t onebit_checkpoint_get_text(onebit_checkpoint_t checkpoint, const char* name, char* text,
                                                      size_t text_size, size_t* length);

/* ---- 0/1 Adam (Lu et al., 2022; DeepSpeed's ZeroOneAdam), over flat fp32 arrays ----
 * DeepSpeed's names and defaults. Steps t count from 0; DeepSpeed's state['step'] is t + 1 (its
 * first step() call is an initialisation that moves nothing, so its schedule runs one call behind).
 * - Variance stage, t <= var_freeze_step. Step t is a *variance step* when (t + 1) % var_interval
 *   == 0: the gradient is averaged over ranks in full precision and
 *   onebit_zero_one_adam_gradient_step(update_variance = 1) runs. Otherwise the gradient is
 *   averaged 1-bit compressed (a tagged allreduce, with error feedback) and v is kept
 *   (update_variance = 0). After every variance step var_counter += 1; when it reaches
 *   var_update_scaler it returns to 0 and var_interval doubles: v is updated at exponentially
 *   spaced steps.
 * - Local-step stage, t > var_freeze_step: v is frozen. Every step is a local step (no
 *   communication: onebit_zero_one_adam_local_step, with the local gradient), and step t is also a
 *   *sync step* when (t + 1) % local_step_interval == 0: then onebit_zero_one_adam_sync_begin, the
 *   accumulated update u averaged compressed, onebit_zero_one_adam_sync_end. After every step of
 *   this stage local_step_counter += 1; when it reaches local_step_scaler it returns to 0 and
 *   local_step_interval doubles, up to local_step_clipper.
 * When the local-step stage begins the compressed buffer's error feedback restarts from zero (it
 * then compresses u, not gradients), u and lrs are 0, and p_sync is set to p. No bias correction; decoupled weight
 * decay; every step ends with onebit_zero_one_adam_advance. The settings, the schedule's counters and
 * the kinds of step: onebit_zero_one_adam_config_t, _schedule_t, _step_t (onebit_types.h). */
/* The schedule before step 0: step 0, intervals 1, counters 0. */
ONEBIT_API onebit_result_t onebit_zero_one_adam_schedule_init(onebit_zero_one_adam_schedule_t* schedule);
/* What step schedule->step is. */
ONEBIT_API onebit_result_t onebit_zero_one_adam_next(const onebit_zero_one_adam_config_t* config,
                                                     const onebit_zero_one_adam_schedule_t* schedule,
                                                     onebit_zero_one_adam_step_t* kind);
/* After the step: its stage's counters, then step + 1. */
ONEBIT_API onebit_result_t onebit_zero_one_adam_advance(const onebit_zero_one_adam_config_t* config,
                                                        onebit_zero_one_adam_schedule_t* schedule);
/* Variance stage, g averaged over ranks: [v <- b2*v + (1-b2)*g*g if update_variance];
 * m <- b1*m + (1-b1)*g; p <- p - lr*(m/(sqrt(v)+eps) + wd*p). When v was kept, the frozen-variance
 * rules above apply: a dormant element's m is 0, and m/(sqrt(v)+eps) is clipped to +-C. */
ONEBIT_API onebit_result_t onebit_zero_one_adam_gradient_step(const onebit_zero_one_adam_config_t* config,
                                                              float* params, float* m, float* v, const float* grad,
                                                              size_t count, int update_variance);
/* Local step, g this rank's: m <- b1*m + (1-b1)*g (0 if dormant); d = lr*(clip(m/(sqrt(v)+eps), +-C) + wd*p);
 * p <- p - d;
 * u <- u - d; *lrs <- *lrs + lr (lrs: one float per parameter group, the lr summed since the last sync). */
ONEBIT_API onebit_result_t onebit_zero_one_adam_local_step(const onebit_zero_one_adam_config_t* config, float* params,
                                                           float* m, const float* v, float* u, float* lrs,
                                                           const float* grad, size_t count);
/* Sync step, after its local step: u <- u*(sqrt(v)+eps) (refuses lrs <= 0 first). Then the caller
 * averages u over ranks (compressed), and sync_end: m <- -(u/lrs); p <- p_sync + u/(sqrt(v)+eps), that
 * move clipped to +-lrs*(C + wd*|p_sync|) (a dormant element: m <- 0 and p kept, having moved by
 * weight decay alone since the last sync);
 * p_sync <- p; u <- 0; *lrs <- 0. p_sync holds the parameters as of the last sync: the caller sets
 * it to p when the local-step stage begins. (DeepSpeed writes p <- (p - u) + u/(...); p - u is
 * p_sync only up to rounding, which differs by rank, and the replicas would drift apart.) */
ONEBIT_API onebit_result_t onebit_zero_one_adam_sync_begin(const onebit_zero_one_adam_config_t* config, float* u,
                                                           const float* v, float lrs, size_t count);
ONEBIT_API onebit_result_t onebit_zero_one_adam_sync_end(const onebit_zero_one_adam_config_t* config, float* params,
                                                         float* params_at_sync, float* m, float* u, const float* v,
                                                         float* lrs, size_t count);

/* 0/1 Adam's four steps over device memory (CUDA), as 1-bit Adam's _device steps above: the same
 * rule, element for element the same bits as the host calls (their oracle), asynchronous on
 * `stream`, allocating nothing; ONEBIT_UNSUPPORTED from the libraries built without CUDA. `lrs`
 * stays a host float: local_step adds lr to it and sync_end reads it and sets it to 0 when their
 * kernels are queued, so these steps do not belong in a captured CUDA graph (replays would reuse
 * the learning-rate sum of the capture). */
ONEBIT_API onebit_result_t onebit_zero_one_adam_gradient_step_device(const onebit_zero_one_adam_config_t* config,
                                                                     float* params, float* m, float* v,
                                                                     const float* grad, size_t count,
                                                                     int update_variance, void* stream);
ONEBIT_API onebit_result_t onebit_zero_one_adam_local_step_device(const onebit_zero_one_adam_config_t* config,
                                                                  float* params, float* m, const float* v, float* u,
                                                                  float* lrs, const float* grad, size_t count,
                                                                  void* stream);
ONEBIT_API onebit_result_t onebit_zero_one_adam_sync_begin_device(const onebit_zero_one_adam_config_t* config, float* u,
                                                                  const float* v, float lrs, size_t count,
                                                                  void* stream);
ONEBIT_API onebit_result_t onebit_zero_one_adam_sync_end_device(const onebit_zero_one_adam_config_t* config,
                                                                float* params, float* params_at_sync, float* m,
                                                                float* u, const float* v, float* lrs, size_t count,
                                                                void* stream);

/* ---- 1-bit LAMB (Li et al., 2021; DeepSpeed's OnebitLamb), one layer at a time ----
 * DeepSpeed's names and defaults. A layer is a contiguous range with its own trust ratio.
 * - Warmup, t < freeze_step (t from 0): g averaged over ranks in full precision, then
 *   onebit_lamb_warmup_step: LAMB with the trust ratio clip(|p|/|d|, min_coeff, max_coeff) (1 when a
 *   norm is 0), d = m/(sqrt(v)+eps) + wd*p, whose running average (coeff_beta; ratios exactly 1 left
 *   out) becomes the layer's frozen coefficient; at step freeze_step - 1, v_fresh <- v.
 * - Compression, t >= freeze_step: at its first step onebit_lamb_scaling_coeffs (from the warmup's
 *   last momentum) evens out the layers' momentum scales; then every step onebit_lamb_momentum_step
 *   with the local gradient, one compressed average of the whole momentum over ranks (tagged), and
 *   onebit_lamb_apply_step: v stays frozen (a dormant element's momentum is 0; Adam's step bound is
 *   not applied — the trust ratio and factor set LAMB's steps), a fresh variance v_fresh follows the gradient
 *   rebuilt from the averaged momentum, and the coefficient is coeff_freeze times a factor
 *   max((sqrt(v)+eps) / (sqrt(v_fresh)+eps)) over the layer's elements that are not dormant (1 if
 *   all are), kept within [factor_min, factor_max] and within factor_threshold of the last step's.
 *   Norms and coefficients are fp64 (sums in a fixed tiled order, optim/tiled_sums.h); arrays fp32.
 * docs/design/optimizer-rules.md ("1-bit LAMB") writes out every operation. The settings and a
 * layer's scalars: onebit_lamb_config_t, onebit_lamb_layer_t (onebit_types.h). */
ONEBIT_API onebit_result_t onebit_lamb_layer_init(onebit_lamb_layer_t* layer);
/* 1 if step t is in the compression stage, 0 if in warmup; -1 (and last error) for a bad config. */
ONEBIT_API int onebit_lamb_compressing(const onebit_lamb_config_t* config, int64_t step);
ONEBIT_API onebit_result_t onebit_lamb_warmup_step(const onebit_lamb_config_t* config, onebit_lamb_layer_t* layer,
                                                   int64_t step, float* params, float* m, float* v, float* v_fresh,
                                                   const float* grad, size_t count);
/* `layers` layers whose momenta lie one after another at m, counts[j] floats each. */
ONEBIT_API onebit_result_t onebit_lamb_scaling_coeffs(const float* m, const size_t* counts, size_t layers,
                                                      onebit_lamb_layer_t* states);
ONEBIT_API onebit_result_t onebit_lamb_momentum_step(const onebit_lamb_config_t* config,
                                                     const onebit_lamb_layer_t* layer, float* m, float* m_last,
                                                     const float* grad, size_t count);
ONEBIT_API onebit_result_t onebit_lamb_apply_step(const onebit_lamb_config_t* config, onebit_lamb_layer_t* layer,
                                                  float* params, float* m, const float* m_last, const float* v,
                                                  float* v_fresh, size_t count);

/* 1-bit LAMB's steps over device memory (CUDA): the host calls' rule with the same bits — the fp64
 * sums of the norms too, which host and device take in one order (a tiled tree, written out in
 * docs/design/optimizers.md, "The optimizers on the device") — so the host calls are their oracle;
 * ONEBIT_UNSUPPORTED from the libraries built without CUDA. The steps that need norms take every
 * layer at once — `layers` layers one after another in the flat arrays, counts[j] elements,
 * configs[j] and states[j] each (the states stay on the host) — and synchronize `stream` once per
 * call to read all the layers' sums back (as DeepSpeed's .item() of its norms does), then return
 * with the states updated and the passes that move the parameters queued. momentum_step, one layer,
 * is asynchronous. The steps that sum are not capturable in a CUDA graph: on a capturing stream
 * they return ONEBIT_UNSUPPORTED, queuing nothing and leaving the capture valid (momentum_step is
 * kernels only; captured, its scalars are baked in). `workspace` holds the partial sums: device
 * memory of the current device, onebit_lamb_workspace_size(counts, layers) bytes at least (one
 * 24-byte sum per 2048 elements of each layer), 8-byte aligned as any cudaMalloc'd or torch buffer
 * is; a workspace too small or misaligned, a bad config or state of any layer, and arrays that are
 * not memory of the current device are refused, naming them, before anything runs. */
ONEBIT_API size_t onebit_lamb_workspace_size(const size_t* counts, size_t layers);
ONEBIT_API onebit_result_t onebit_lamb_warmup_steps_device(const onebit_lamb_config_t* configs,
                                                           onebit_lamb_layer_t* states, const size_t* counts,
                                                           size_t layers, int64_t step, float* params, float* m,
                                                           float* v, float* v_fresh, const float* grad, void* workspace,
                                                           size_t workspace_bytes, void* stream);
ONEBIT_API onebit_result_t onebit_lamb_scaling_coeffs_device(const float* m, const size_t* counts, size_t layers,
                                                             onebit_lamb_layer_t* states, void* workspace,
                                                             size_t workspace_bytes, void* stream);
ONEBIT_API onebit_result_t onebit_lamb_momentum_step_device(const onebit_lamb_config_t* config,
                                                            const onebit_lamb_layer_t* layer, float* m, float* m_last,
                                                            const float* grad, size_t count, void* stream);
ONEBIT_API onebit_result_t onebit_lamb_apply_steps_device(const onebit_lamb_config_t* configs,
                                                          onebit_lamb_layer_t* states, const size_t* counts,
                                                          size_t layers, float* params, float* m, const float* m_last,
                                                          const float* v, float* v_fresh, void* workspace,
                                                          size_t workspace_bytes, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ONEBIT_ONEBIT_H_ */
