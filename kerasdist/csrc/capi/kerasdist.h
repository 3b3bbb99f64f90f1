/* kerasdist's engine library: the C API over the C++ core.
 *
 * One process loads libkerasdist.so once; every framework binding
 * (the TensorFlow op library, the PyTorch and JAX bindings, Python through
 * ctypes) reaches the same engine through these functions. Only C types
 * cross this boundary: integers, doubles, `const char*`, plain structs and
 * function pointers.
 *
 * Vocabulary:
 *   request   one tensor of a collective: buffers, dtype, shape, op.
 *   batch     the requests of one kerasdist_enqueue() call: they reach the
 *             engine together (so it can fuse them) and complete together.
 *   group     a batch of allreduces named as one (`group_name`): tensor i
 *             is "<group_name>.<i>"; a group of one dtype may run on the
 *             shared-memory direct board as a whole.
 *   handle    the completion of a batch, to poll or wait on, when the
 *             caller gives no callback.
 *
 * Cross-rank contract: every rank of the process set enqueues the same
 * names with matching dtypes, shapes (allgather and alltoall: all but the
 * first dimension), ops and roots; the order may differ between ranks. A
 * mismatch fails the collective on every rank (KERASDIST_MISMATCH); a rank
 * that never comes fails it after the engine's bounds (KERASDIST_TIMEOUT or
 * KERASDIST_ABORTED), with a message that names the ranks involved.
 *
 * Buffers: inputs and outputs must stay valid until the batch completes.
 * An output may be its input (in place).
 */
#ifndef KERASDIST_C_API_H_
#define KERASDIST_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct, a signature or a meaning below changes. A
 * binding compares kerasdist_api_version() with the value it was built
 * against and refuses to load on a mismatch. */
#define KERASDIST_API_VERSION 1

/* Data types. */
enum {
  KERASDIST_FLOAT16 = 0,
  KERASDIST_BFLOAT16 = 1,
  KERASDIST_FLOAT32 = 2,
  KERASDIST_FLOAT64 = 3,
  KERASDIST_INT32 = 4,
  KERASDIST_INT64 = 5,
  KERASDIST_UINT8 = 6,
  KERASDIST_INT8 = 7,
  KERASDIST_UINT16 = 8,
  KERASDIST_INT16 = 9,
  KERASDIST_BOOL = 10 /* one byte, 0 or 1; reduced with min and max only */
};

/* Reduce ops. */
enum {
  KERASDIST_AVERAGE = 0,
  KERASDIST_SUM = 1,
  KERASDIST_MIN = 2,
  KERASDIST_MAX = 3,
  KERASDIST_PRODUCT = 4,
  KERASDIST_ADASUM = 5 /* allreduce of floating types only */
};

/* Collectives. */
enum {
  KERASDIST_ALLREDUCE = 0,
  KERASDIST_ALLGATHER = 1,
  KERASDIST_BROADCAST = 2,
  KERASDIST_BARRIER = 3,
  KERASDIST_JOIN = 4,
  KERASDIST_REDUCESCATTER = 5,
  KERASDIST_ALLTOALL = 6
};

/* Status codes. */
enum {
  KERASDIST_OK = 0,
  KERASDIST_INVALID_ARGUMENT = 1, /* bad input on this rank */
  KERASDIST_MISMATCH = 2,         /* ranks disagree: dtype, shape, op, root */
  KERASDIST_TIMEOUT = 3,          /* a bounded wait ran out */
  KERASDIST_ABORTED = 4,          /* the engine stopped: a peer failed, a stall */
  KERASDIST_SHUTDOWN = 5,         /* the engine was shut down */
  KERASDIST_INTERNAL = 6,
  KERASDIST_PRECONDITION = 7,     /* not initialized; not in the process set */
  KERASDIST_PENDING = -1          /* kerasdist_handle_wait(): not yet */
};

/* Devices a buffer may live on. Only the CPU for now. */
enum { KERASDIST_DEVICE_CPU = 0 };

/* kerasdist_enqueue() flags. */
enum {
  /* The caller may complete on its own thread: when the engine was idle,
   * kerasdist_enqueue() waits (up to the engine's spin) and, if the batch
   * finished meanwhile, runs `done` itself before returning. */
  KERASDIST_INLINE = 1
};

/* Engine settings; kerasdist_config_defaults() fills every field. */
typedef struct kerasdist_config {
  int32_t struct_size; /* sizeof(kerasdist_config) */
  int64_t fusion_threshold_bytes;
  int64_t fusion_tensor_limit_bytes;
  int64_t cycle_time_us;
  int64_t stall_warning_us;
  int64_t stall_shutdown_us; /* 0: never */
  int64_t deadlock_us;
  int64_t timeout_ms;        /* every transfer */
  int64_t init_timeout_ms;   /* init() and adding a process set */
  int64_t segment_bytes;
  int64_t cache_capacity;
  int64_t small_allreduce_bytes;
  int64_t spin_us;           /* -1: by topology */
  int64_t direct_allreduce_bytes;
  int64_t direct_group_bytes;
  int32_t shared_memory;     /* 0/1 */
  int32_t hierarchical;      /* -1 auto, 0 off, 1 on */
  const char* timeline_path; /* "" or NULL: none */
  const char* version;       /* the package version, agreed by every rank */
} kerasdist_config;

/* One tensor of a collective. Fields an op does not use are ignored. */
typedef struct kerasdist_request {
  int32_t struct_size; /* sizeof(kerasdist_request) */
  int32_t op;          /* KERASDIST_ALLREDUCE, ... */
  const char* name;    /* the same on every rank; ignored in a group */
  int32_t process_set; /* 0: every rank */
  int32_t device;      /* KERASDIST_DEVICE_CPU */
  int32_t dtype;
  int32_t ndim;
  const int64_t* shape;
  const void* input;
  /* allreduce, broadcast: as large as the input; reducescatter: this
   * rank's rows (the first dim0 % size ranks get one row more). Unused by
   * allgather and alltoall, whose output size is negotiated: see allocate. */
  void* output;
  int32_t reduce_op;
  double prescale;
  double postscale;
  int32_t root; /* broadcast: the rank whose data wins, numbered within the
                 * process set (for set 0, the rank in the job) */
  /* alltoall: rows sent to each rank (nsplits == size), or 0 to split the
   * first dimension evenly. */
  int32_t nsplits;
  const int64_t* splits;
  /* alltoall: receives the rows from each rank (size entries), or NULL. */
  int32_t* received_splits;
  /* join: receives the last rank to join, or NULL. */
  int32_t* join_result;
  /* allgather, alltoall: called once the output shape is known, on an
   * engine thread; sets *data to `ndim`/`shape`'s buffer and returns 0. With
   * NULL, the handle holds the output (kerasdist_handle_copy_output). */
  int32_t (*allocate)(void* user, int32_t index, int32_t ndim, const int64_t* shape,
                      void** data);
  void* allocate_user;
} kerasdist_request;

/* Called exactly once per batch, with the first error of its requests. */
typedef void (*kerasdist_done_fn)(void* user, int32_t code, const char* message);

typedef struct kerasdist_handle kerasdist_handle;

/* ---- Library and process. ---- */

int32_t kerasdist_api_version(void);
void kerasdist_config_defaults(kerasdist_config* config);
/* Starts the engine over the MPI communicator `fortran_comm` (MPI_Comm_c2f).
 * Returns 0, or a status code with a message in err. Calling it again
 * while initialized does nothing. */
int32_t kerasdist_init(int32_t fortran_comm, const kerasdist_config* config, char* err,
                       int32_t err_len);
/* Stops every engine of this process, bounded; pending collectives fail. */
int32_t kerasdist_shutdown(void);
int32_t kerasdist_is_initialized(void);
int32_t kerasdist_rank(void); /* -1 before init */
int32_t kerasdist_size(void);
/* local_rank, local_size, cross_rank, cross_size, homogeneous, hierarchical. */
int32_t kerasdist_topology(int32_t* out6);
/* Registers process set `id` of `size` ranks on every rank; on its members
 * (`member` 1) also starts its engine over `fortran_comm`. */
int32_t kerasdist_add_process_set(int32_t id, int32_t size, int32_t member,
                                  int32_t fortran_comm, int64_t init_timeout_ms,
                                  const char* label, char* err, int32_t err_len);
int32_t kerasdist_remove_process_set(int32_t id); /* 1 if it existed */
/* This rank's rank in process set `id` and its size: KERASDIST_OK; or
 * KERASDIST_PRECONDITION (*size set, *rank -1) when this rank is not a
 * member; or KERASDIST_INVALID_ARGUMENT for an unknown set. */
int32_t kerasdist_process_set_info(int32_t id, int32_t* rank, int32_t* size);
/* Whether a collective can run on process set `id` here: KERASDIST_OK, or
 * KERASDIST_PRECONDITION with the reason (not initialized, not a member,
 * no such set) in err, as kerasdist_enqueue() would report it. */
int32_t kerasdist_check_process_set(int32_t id, char* err, int32_t err_len);
/* At exit: if a collective failed, end the process after `seconds`
 * should exiting (MPI_Finalize) hang. Returns 1 if the guard is armed. */
int32_t kerasdist_exit_guard(double seconds);
int32_t kerasdist_transport_name(char* buf, int32_t len);
long long kerasdist_cache_entries(void); /* -1 before init */
long long kerasdist_direct_ops(void);
long long kerasdist_spin_us(void);

/* ---- Collectives. ---- */

/* Enqueues `count` requests as one batch. `group_name` non-NULL makes them
 * a grouped allreduce (every request an allreduce with one reduce op,
 * scales and process set).
 *
 * With `done`: returns NULL, and `done(done_user, code, message)` runs
 * exactly once: on an engine thread, or on this thread (an error found
 * before enqueueing, or KERASDIST_INLINE). With `done` NULL: returns a
 * handle that completes exactly once; release it. Never blocks beyond the
 * engine's spin. */
kerasdist_handle* kerasdist_enqueue(const kerasdist_request* requests, int32_t count,
                                    const char* group_name, uint32_t flags,
                                    kerasdist_done_fn done, void* done_user);

/* 1 if the handle's batch has completed, else 0. */
int32_t kerasdist_handle_poll(kerasdist_handle* handle);
/* Waits up to timeout_ms (< 0: until it completes; the engine's own bounds
 * still end every collective). Returns its status code, or
 * KERASDIST_PENDING if it is still running. */
int32_t kerasdist_handle_wait(kerasdist_handle* handle, int64_t timeout_ms);
/* The status code; copies the message (possibly empty) into buf. */
int32_t kerasdist_handle_status(kerasdist_handle* handle, char* buf, int32_t len);
/* Request `index`'s output shape once completed: returns ndim and writes
 * up to `max` dimensions, or -1. */
int32_t kerasdist_handle_shape(kerasdist_handle* handle, int32_t index, int64_t* dims,
                               int32_t max);
/* Copies request `index`'s output held by the handle (allocate NULL) into
 * dst, which has `bytes` bytes: 0, or -1 if the sizes differ. */
int32_t kerasdist_handle_copy_output(kerasdist_handle* handle, int32_t index, void* dst,
                                     int64_t bytes);
/* alltoall: the rows received from each rank (request `index`); returns
 * the number written, or -1. */
int32_t kerasdist_handle_received_splits(kerasdist_handle* handle, int32_t index,
                                         int32_t* out, int32_t max);
/* join: the last rank to join, or -1. */
int32_t kerasdist_handle_join_result(kerasdist_handle* handle);
/* Frees the handle; a pending one is freed when it completes. */
void kerasdist_handle_release(kerasdist_handle* handle);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* KERASDIST_C_API_H_ */
