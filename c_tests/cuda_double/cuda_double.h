/* TEST DOUBLE of the CUDA driver API: the extra functions tests use to see
 * what pdx did. Built only for the tests and the benchmark, never shipped.
 * Tests reach these through dlsym on the library named by PDX_CUDA_LIB. */
#ifndef PDX_CUDA_DOUBLE_H
#define PDX_CUDA_DOUBLE_H

#include <stdint.h>

#define CUDA_DOUBLE_MAX_DEVICES 8

/* Counters since the library was loaded. */
struct cuda_double_stats {
  uint64_t inits;                    /* cuInit calls */
  uint64_t contexts_live;            /* devices whose primary context is retained now */
  uint64_t contexts_retained_mask;   /* bit d: device d's primary context was ever retained */
  uint64_t retains;                  /* cuDevicePrimaryCtxRetain calls that succeeded */
  uint64_t pinned_bytes;             /* cuMemHostAlloc bytes live now */
  uint64_t pinned_peak;              /* highest pinned_bytes since the last reset */
  uint64_t pinned_allocs;            /* cuMemHostAlloc calls that succeeded */
  uint64_t h2d_copies;               /* cuMemcpyHtoDAsync_v2 calls queued */
  uint64_t d2h_copies;               /* cuMemcpyDtoHAsync_v2 calls queued */
  uint64_t copies_no_context;        /* copies refused: no context current */
  uint64_t copies_wrong_context;     /* copies refused: current context is another device's */
  uint64_t copies_pageable;          /* copies whose host side is not cuMemHostAlloc memory */
  uint64_t syncs;                    /* cuStreamSynchronize calls */
  uint64_t streams_live;             /* streams created and not destroyed */
  uint64_t device_bytes;             /* cuMemAlloc_v2 bytes live now */
  uint64_t copies_by_device[CUDA_DOUBLE_MAX_DEVICES]; /* copies made with device d's context current */
  uint64_t event_waits;              /* cuStreamWaitEvent calls queued on a recorded event */
  uint64_t d2d_copies;               /* cuMemcpyDtoDAsync_v2 calls queued */
  uint64_t ipc_exports;              /* cuIpcGetMemHandle calls that succeeded */
  uint64_t ipc_opens;                /* cuIpcOpenMemHandle_v2 calls that succeeded (a reopen counts) */
  uint64_t ipc_closes;               /* cuIpcCloseMemHandle calls that succeeded */
  uint64_t ipc_mapped;               /* allocations of other processes mapped here now */
};

/* The 64 bytes of a CUipcMemHandle as this double fills them (native byte
 * order). Device memory's shadow is a memfd mapped MAP_SHARED; another
 * process of the same user maps it again through /proc/<pid>/fd/<fd>
 * (which needs only the ptrace "read" access a same-user process has). */
struct cuda_double_ipc_handle {
  char magic[8];    /* CUDA_DOUBLE_IPC_MAGIC */
  uint32_t pid;     /* the exporting process */
  int32_t fd;       /* its memfd holding the allocation's bytes */
  uint64_t ino;     /* that memfd's inode: a reused fd number is detected */
  uint64_t len;     /* bytes asked for at cuMemAlloc_v2 */
  uint64_t mapped;  /* bytes of the memfd (len rounded up to pages) */
  int32_t device;   /* the exporter's device ordinal */
  uint32_t reserved; /* 0 */
  uint64_t base;    /* the allocation's address in the exporter */
  uint64_t zero;    /* 0 */
};
#define CUDA_DOUBLE_IPC_MAGIC "cudadbl1"


typedef void (*cuda_double_stats_fn)(struct cuda_double_stats *out);
typedef void (*cuda_double_reset_peak_fn)(void);
/* Make `count` calls of `what` fail with `code` after letting `after` of
 * them succeed. `what`: "copy" (the failure shows at cuStreamSynchronize,
 * as a real asynchronous fault does), "copy_call" (the copy call itself
 * fails, as for a bad pointer), "cuPointerGetAttribute",
 * "cuMemHostAlloc", "cuStreamCreate", "cuIpcGetMemHandle",
 * "cuIpcOpenMemHandle". */
typedef void (*cuda_double_inject_fn)(const char *what, int after, int count, int code);

#endif
