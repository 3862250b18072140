/* TEST DOUBLE of the CUDA driver API (libcuda.so.1), for pdx's tests and
 * benchmark only; never shipped. It implements exactly the entry points pdx
 * may use, plus cuMemAlloc_v2 / cuMemFree_v2, and makes the classic staging
 * mistakes visible:
 *  - "device memory" is an address range mapped PROT_NONE: a CPU access
 *    faults. Its bytes live in a shadow mapping only the double touches.
 *  - asynchronous copies are queued and applied at cuStreamSynchronize (or
 *    cuStreamDestroy_v2), never at the call, and read their source then: a
 *    missing synchronize, or a staging buffer reused too early, gives wrong
 *    bytes.
 *  - copies need a current context of the device they touch; the double
 *    counts per device, refuses and counts mismatches, counts copies from
 *    pageable memory, live contexts, streams and pinned bytes.
 *  - CUDA IPC works across processes: a device allocation's shadow is a
 *    memfd; cuIpcGetMemHandle names it (struct cuda_double_ipc_handle) and
 *    cuIpcOpenMemHandle_v2 in another process of the same user maps the
 *    same bytes behind a fresh PROT_NONE address range there.
 * The number of devices is CUDA_DOUBLE_DEVICES (default 4). */
#define _GNU_SOURCE
#include "cuda_double.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
struct dbl_ctx {
  int device;
};
typedef struct dbl_ctx *CUcontext;
typedef struct {
  char reserved[64];
} CUipcMemHandle;
_Static_assert(sizeof(struct cuda_double_ipc_handle) == sizeof(CUipcMemHandle), "a handle is 64 bytes");

enum {
  SUCCESS = 0,
  ERR_INVALID_VALUE = 1,
  ERR_OUT_OF_MEMORY = 2,
  ERR_NOT_INITIALIZED = 3,
  ERR_INVALID_DEVICE = 101,
  ERR_INVALID_CONTEXT = 201,
  ERR_MAP_FAILED = 205,
  ERR_INVALID_HANDLE = 400,
  ERR_NOT_FOUND = 500,
  ERR_ILLEGAL_ADDRESS = 700,
};

#define EXPORT __attribute__((visibility("default")))

struct alloc {
  uintptr_t base;
  size_t len, mapped;
  unsigned char *shadow; /* NULL for pinned host memory */
  int device;
  int memfd;             /* device memory of this process: the shadow's memfd; else -1 */
  uint64_t ino;          /* the memfd's inode (imported memory: the exporter's) */
  pid_t exporter;        /* imported memory: the exporting process; else 0 */
  int opens;             /* imported memory: cuIpcOpenMemHandle_v2 calls not yet closed */
  struct alloc *next;
};

struct dbl_event;

enum op_kind { OP_D2H, OP_H2D, OP_D2D, OP_WAIT };

struct op {
  enum op_kind kind;
  uintptr_t dev;       /* D2D: the destination */
  uintptr_t src_dev;   /* D2D: the source */
  unsigned char *host;
  size_t n;
  int fail; /* error code to report at synchronize, 0 if none */
  struct dbl_event *wait; /* OP_WAIT: wait for this event, copy nothing */
};

struct dbl_stream {
  struct dbl_ctx *ctx;
  struct op *ops;
  size_t n_ops, cap_ops;
  /* Operations ever queued and ever applied: an event waits for a count. */
  unsigned long long queued, applied;
};
typedef struct dbl_stream *CUstream;

/* An event: the work queued on `stream` up to `mark` when it was recorded. */
struct dbl_event {
  struct dbl_stream *stream;
  unsigned long long mark;
};
typedef struct dbl_event *CUevent;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int inited;
static int n_devices = -1;
static struct dbl_ctx ctxs[CUDA_DOUBLE_MAX_DEVICES];
static int retain_count[CUDA_DOUBLE_MAX_DEVICES];
static struct dbl_stream default_stream[CUDA_DOUBLE_MAX_DEVICES];
static struct alloc *allocs;
static struct cuda_double_stats st;
static _Thread_local struct dbl_ctx *current;

struct injection {
  char what[32];
  int after, count, code;
};
static struct injection inj[8];

static int devices(void) {
  if (n_devices < 0) {
    const char *e = getenv("CUDA_DOUBLE_DEVICES");
    int n = e ? atoi(e) : 4;
    n_devices = n < 0 ? 0 : n > CUDA_DOUBLE_MAX_DEVICES ? CUDA_DOUBLE_MAX_DEVICES : n;
    for (int i = 0; i < CUDA_DOUBLE_MAX_DEVICES; i++) {
      ctxs[i].device = i;
      default_stream[i].ctx = &ctxs[i];
    }
  }
  return n_devices;
}

/* An injected failure for `what`, or 0. Called with the lock held. */
static int injected(const char *what) {
  for (size_t i = 0; i < sizeof inj / sizeof inj[0]; i++) {
    if (inj[i].count > 0 && strcmp(inj[i].what, what) == 0) {
      if (inj[i].after > 0) {
        inj[i].after--;
        return 0;
      }
      inj[i].count--;
      return inj[i].code;
    }
  }
  return 0;
}

static struct alloc *find(uintptr_t p, size_t n, int device_memory) {
  for (struct alloc *a = allocs; a; a = a->next) {
    if ((a->shadow != NULL) == device_memory && p >= a->base && p - a->base <= a->len &&
        n <= a->len - (p - a->base))
      return a;
  }
  return NULL;
}

static int valid_ctx(struct dbl_ctx *c) {
  return c >= ctxs && c < ctxs + devices() && retain_count[c->device] > 0;
}

EXPORT CUresult cuInit(unsigned flags) {
  if (flags != 0) return ERR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  devices();
  inited = 1;
  st.inits++;
  pthread_mutex_unlock(&lock);
  return SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
  if (!v) return ERR_INVALID_VALUE;
  *v = 12040;
  return SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!n) return ERR_INVALID_VALUE;
  *n = devices();
  return SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!d) return ERR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= devices()) return ERR_INVALID_DEVICE;
  *d = ordinal;
  return SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!pctx) return ERR_INVALID_VALUE;
  if (d < 0 || d >= devices()) return ERR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  if (retain_count[d]++ == 0) st.contexts_live++;
  st.contexts_retained_mask |= 1ull << d;
  st.retains++;
  pthread_mutex_unlock(&lock);
  *pctx = &ctxs[d];
  return SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (d < 0 || d >= devices()) return ERR_INVALID_DEVICE;
  CUresult rc = SUCCESS;
  pthread_mutex_lock(&lock);
  if (retain_count[d] == 0)
    rc = ERR_INVALID_CONTEXT;
  else if (--retain_count[d] == 0)
    st.contexts_live--;
  pthread_mutex_unlock(&lock);
  return rc;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
  if (!inited) return ERR_NOT_INITIALIZED;
  pthread_mutex_lock(&lock);
  int ok = c == NULL || valid_ctx(c);
  pthread_mutex_unlock(&lock);
  if (!ok) return ERR_INVALID_CONTEXT;
  current = c;
  return SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!c) return ERR_INVALID_VALUE;
  *c = current;
  return SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!data) return ERR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  CUresult rc = injected("cuPointerGetAttribute");
  struct alloc *a = find((uintptr_t)ptr, 1, 1);
  struct alloc *h = a ? NULL : find((uintptr_t)ptr, 1, 0);
  pthread_mutex_unlock(&lock);
  if (rc) return rc;
  if (!a && !h) return ERR_INVALID_VALUE; /* as the driver says of pageable memory */
  if (attr == 2 /* MEMORY_TYPE */) {
    *(unsigned *)data = a ? 2u /* DEVICE */ : 1u /* HOST */;
  } else if (attr == 9 /* DEVICE_ORDINAL */) {
    *(int *)data = a ? a->device : 0;
  } else {
    return ERR_INVALID_VALUE;
  }
  return SUCCESS;
}

static void *map_rw(size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static size_t page_round(size_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return n == 0 ? pg : (n + pg - 1) / pg * pg;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags) {
  (void)flags;
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!pp || n == 0) return ERR_INVALID_VALUE;
  if (!current) return ERR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  CUresult rc = injected("cuMemHostAlloc");
  pthread_mutex_unlock(&lock);
  if (rc) return rc;
  struct alloc *a = calloc(1, sizeof *a);
  size_t mapped = page_round(n);
  void *p = a ? map_rw(mapped) : NULL;
  if (!p) {
    free(a);
    return ERR_OUT_OF_MEMORY;
  }
  a->base = (uintptr_t)p;
  a->len = n;
  a->mapped = mapped;
  a->memfd = -1;
  a->device = current->device;
  pthread_mutex_lock(&lock);
  a->next = allocs;
  allocs = a;
  st.pinned_bytes += n;
  st.pinned_allocs++;
  if (st.pinned_bytes > st.pinned_peak) st.pinned_peak = st.pinned_bytes;
  pthread_mutex_unlock(&lock);
  *pp = p;
  return SUCCESS;
}

static CUresult free_alloc(uintptr_t p, int device_memory) {
  pthread_mutex_lock(&lock);
  struct alloc **pa = &allocs;
  while (*pa && !((*pa)->base == p && ((*pa)->shadow != NULL) == device_memory)) pa = &(*pa)->next;
  struct alloc *a = *pa;
  if (a && a->exporter) a = NULL; /* another process's memory: cuIpcCloseMemHandle frees it */
  if (a) {
    *pa = a->next;
    if (device_memory)
      st.device_bytes -= a->len;
    else
      st.pinned_bytes -= a->len;
  }
  pthread_mutex_unlock(&lock);
  if (!a) return ERR_INVALID_VALUE;
  munmap((void *)a->base, a->mapped);
  if (a->shadow) munmap(a->shadow, a->mapped);
  if (a->memfd >= 0) close(a->memfd);
  free(a);
  return SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p) {
  if (!inited) return ERR_NOT_INITIALIZED;
  return free_alloc((uintptr_t)p, 0);
}

/* An address range for device memory: the CPU faults on any access. */
static void *reserve(size_t n) {
  void *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static unsigned char *map_shared(int fd, size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* Device memory: an address range the CPU cannot touch, and a shadow in a
 * memfd (so that another process can map the same bytes, see IPC below). */
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!dptr || n == 0) return ERR_INVALID_VALUE;
  if (!current) return ERR_INVALID_CONTEXT;
  struct alloc *a = calloc(1, sizeof *a);
  if (!a) return ERR_OUT_OF_MEMORY;
  a->mapped = page_round(n);
  a->memfd = memfd_create("cuda_double", MFD_CLOEXEC);
  struct stat sb;
  void *p = reserve(a->mapped);
  if (a->memfd >= 0 && ftruncate(a->memfd, (off_t)a->mapped) == 0 && fstat(a->memfd, &sb) == 0) {
    a->ino = (uint64_t)sb.st_ino;
    a->shadow = map_shared(a->memfd, a->mapped);
  }
  if (!p || !a->shadow) {
    if (p) munmap(p, a->mapped);
    if (a->shadow) munmap(a->shadow, a->mapped);
    if (a->memfd >= 0) close(a->memfd);
    free(a);
    return ERR_OUT_OF_MEMORY;
  }
  /* Fresh device memory holds garbage, not zeros. */
  memset(a->shadow, 0xA5, n);
  a->base = (uintptr_t)p;
  a->len = n;
  a->device = current->device;
  pthread_mutex_lock(&lock);
  a->next = allocs;
  allocs = a;
  st.device_bytes += n;
  pthread_mutex_unlock(&lock);
  *dptr = (CUdeviceptr)a->base;
  return SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  if (!inited) return ERR_NOT_INITIALIZED;
  return free_alloc((uintptr_t)p, 1);
}

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned flags) {
  (void)flags;
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!ps) return ERR_INVALID_VALUE;
  if (!current) return ERR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  CUresult rc = injected("cuStreamCreate");
  pthread_mutex_unlock(&lock);
  if (rc) return rc;
  struct dbl_stream *s = calloc(1, sizeof *s);
  if (!s) return ERR_OUT_OF_MEMORY;
  s->ctx = current;
  pthread_mutex_lock(&lock);
  st.streams_live++;
  pthread_mutex_unlock(&lock);
  *ps = s;
  return SUCCESS;
}

static struct dbl_stream *resolve_stream(CUstream s) {
  if (s) return s;
  return current ? &default_stream[current->device] : NULL;
}

/* Queue `o` on `s` (the lock held). */
static CUresult push_op(struct dbl_stream *s, struct op o) {
  if (s->n_ops == s->cap_ops) {
    size_t cap = s->cap_ops ? s->cap_ops * 2 : 16;
    struct op *ops = realloc(s->ops, cap * sizeof *ops);
    if (!ops) return ERR_OUT_OF_MEMORY;
    s->ops = ops;
    s->cap_ops = cap;
  }
  s->ops[s->n_ops++] = o;
  s->queued++;
  return SUCCESS;
}

/* What every copy checks first: a current context, and a stream of it
 * (counted when missing). Called with the lock held. */
static CUresult copy_context(const struct dbl_stream *stream) {
  if (!current) {
    st.copies_no_context++;
    return ERR_INVALID_CONTEXT;
  }
  if (!stream || stream->ctx != current) {
    st.copies_wrong_context++;
    return ERR_INVALID_HANDLE;
  }
  return SUCCESS;
}

static CUresult enqueue(int h2d, uintptr_t dev, void *host, size_t n, CUstream s) {
  if (!inited) return ERR_NOT_INITIALIZED;
  pthread_mutex_lock(&lock);
  struct dbl_stream *stream = resolve_stream(s);
  struct alloc *a = find(dev, n, 1);
  CUresult rc = copy_context(stream);
  if (rc != SUCCESS) {
    /* counted by copy_context */
  } else if (!a || !host || find((uintptr_t)host, n, 1)) {
    rc = ERR_INVALID_VALUE;
  } else if (a->device != current->device) {
    st.copies_wrong_context++;
    rc = ERR_INVALID_CONTEXT;
  } else {
    rc = injected("copy_call");
  }
  if (rc == SUCCESS) {
    if (!find((uintptr_t)host, n, 0)) st.copies_pageable++;
    if (h2d)
      st.h2d_copies++;
    else
      st.d2h_copies++;
    st.copies_by_device[current->device]++;
    rc = push_op(stream, (struct op){.kind = h2d ? OP_H2D : OP_D2H, .dev = dev, .host = host, .n = n,
                                     .fail = injected("copy")});
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  return enqueue(1, (uintptr_t)dst, (void *)src, n, s);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  return enqueue(0, (uintptr_t)src, dst, n, s);
}

/* Device to device, within this process or to and from memory another
 * process exported (IPC): queued like the other copies. One side must be
 * on the current context's device (the other is reached as a peer). */
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  if (!inited) return ERR_NOT_INITIALIZED;
  pthread_mutex_lock(&lock);
  struct dbl_stream *stream = resolve_stream(s);
  struct alloc *a = find((uintptr_t)dst, n, 1), *b = find((uintptr_t)src, n, 1);
  CUresult rc = copy_context(stream);
  if (rc != SUCCESS) {
    /* counted by copy_context */
  } else if (!a || !b) {
    rc = ERR_INVALID_VALUE;
  } else if (a->device != current->device && b->device != current->device) {
    st.copies_wrong_context++;
    rc = ERR_INVALID_CONTEXT;
  } else {
    rc = injected("copy_call");
  }
  if (rc == SUCCESS) {
    st.d2d_copies++;
    st.copies_by_device[current->device]++;
    rc = push_op(stream, (struct op){.kind = OP_D2D, .dev = (uintptr_t)dst, .src_dev = (uintptr_t)src, .n = n,
                                     .fail = injected("copy")});
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

/* The device allocation `p` lies in: its base and the bytes asked for. */
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p) {
  if (!inited) return ERR_NOT_INITIALIZED;
  pthread_mutex_lock(&lock);
  struct alloc *a = find((uintptr_t)p, 1, 1);
  uintptr_t base = a ? a->base : 0;
  size_t len = a ? a->len : 0;
  pthread_mutex_unlock(&lock);
  if (!a) return ERR_NOT_FOUND;
  if (pbase) *pbase = (CUdeviceptr)base;
  if (psize) *psize = len;
  return SUCCESS;
}

/* A handle for the allocation whose base is `p` (struct
 * cuda_double_ipc_handle). Like the driver, only the base of memory from
 * cuMemAlloc_v2 of this process: an address inside it, pinned host memory
 * or memory opened from another process is CUDA_ERROR_INVALID_VALUE. */
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!handle) return ERR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  CUresult rc = injected("cuIpcGetMemHandle");
  struct alloc *a = find((uintptr_t)p, 1, 1);
  struct cuda_double_ipc_handle h;
  memset(&h, 0, sizeof h);
  if (rc == SUCCESS && (!a || a->base != (uintptr_t)p || a->memfd < 0)) rc = ERR_INVALID_VALUE;
  if (rc == SUCCESS) {
    memcpy(h.magic, CUDA_DOUBLE_IPC_MAGIC, sizeof h.magic);
    h.pid = (uint32_t)getpid();
    h.fd = a->memfd;
    h.ino = a->ino;
    h.len = a->len;
    h.mapped = a->mapped;
    h.device = a->device;
    h.base = a->base;
    st.ipc_exports++;
  }
  pthread_mutex_unlock(&lock);
  if (rc == SUCCESS) memcpy(handle, &h, sizeof h);
  return rc;
}

/* Map another process's allocation into this one, on the current context's
 * device, behind a fresh PROT_NONE range. Opening it again in the same
 * context returns the same address and counts one more open; another
 * device's context gets a mapping of its own. Refusals, as the driver's: no current
 * context, or a handle of this very process, CUDA_ERROR_INVALID_CONTEXT;
 * flags other than 0 or CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, or bytes that
 * are no handle, CUDA_ERROR_INVALID_VALUE; a handle whose process or
 * allocation is gone, CUDA_ERROR_INVALID_HANDLE; mapping refused by the
 * system (another user: no access to /proc/<pid>/fd), CUDA_ERROR_MAP_FAILED. */
EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned flags) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!pdptr || (flags & ~1u) != 0) return ERR_INVALID_VALUE;
  if (!current) return ERR_INVALID_CONTEXT;
  struct cuda_double_ipc_handle h;
  memcpy(&h, &handle, sizeof h);
  if (memcmp(h.magic, CUDA_DOUBLE_IPC_MAGIC, sizeof h.magic) != 0 || h.pid == 0 || h.fd < 0 || h.len == 0 ||
      h.mapped != page_round(h.len) || h.reserved != 0 || h.zero != 0)
    return ERR_INVALID_VALUE;
  if ((pid_t)h.pid == getpid()) return ERR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  CUresult rc = injected("cuIpcOpenMemHandle");
  struct alloc *a = allocs;
  while (a && !(a->exporter == (pid_t)h.pid && a->ino == h.ino && a->device == current->device)) a = a->next;
  if (rc == SUCCESS && a) {
    a->opens++;
    st.ipc_opens++;
    *pdptr = (CUdeviceptr)a->base;
  }
  pthread_mutex_unlock(&lock);
  if (rc != SUCCESS || a) return rc;

  char path[64];
  snprintf(path, sizeof path, "/proc/%u/fd/%d", (unsigned)h.pid, (int)h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno == EACCES || errno == EPERM ? ERR_MAP_FAILED : ERR_INVALID_HANDLE;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_ino != h.ino || (uint64_t)sb.st_size < h.mapped) {
    close(fd);
    return ERR_INVALID_HANDLE; /* the fd number now names another file */
  }
  a = calloc(1, sizeof *a);
  void *p = a ? reserve(h.mapped) : NULL;
  unsigned char *shadow = p ? map_shared(fd, h.mapped) : NULL;
  close(fd);
  if (!shadow) {
    CUresult failed = p ? ERR_MAP_FAILED : ERR_OUT_OF_MEMORY;
    if (p) munmap(p, h.mapped);
    free(a);
    return failed;
  }
  a->base = (uintptr_t)p;
  a->len = h.len;
  a->mapped = h.mapped;
  a->shadow = shadow;
  a->memfd = -1;
  a->ino = h.ino;
  a->exporter = (pid_t)h.pid;
  a->opens = 1;
  a->device = current->device;
  pthread_mutex_lock(&lock);
  struct alloc *raced = allocs; /* another thread opened it meanwhile: keep that one */
  while (raced && !(raced->exporter == a->exporter && raced->ino == a->ino && raced->device == a->device))
    raced = raced->next;
  if (raced) {
    raced->opens++;
  } else {
    a->next = allocs;
    allocs = a;
    st.ipc_mapped++;
  }
  st.ipc_opens++;
  *pdptr = (CUdeviceptr)(raced ? raced->base : a->base);
  pthread_mutex_unlock(&lock);
  if (raced) {
    munmap(p, h.mapped);
    munmap(shadow, h.mapped);
    free(a);
  }
  return SUCCESS;
}

/* One close per open; the last unmaps. Needs a current context, as the
 * driver does; an address no open returned is CUDA_ERROR_INVALID_VALUE. */
EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!current) return ERR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  struct alloc **pa = &allocs;
  while (*pa && !((*pa)->base == (uintptr_t)p && (*pa)->exporter)) pa = &(*pa)->next;
  struct alloc *a = *pa;
  int last = 0;
  if (a) {
    st.ipc_closes++;
    last = --a->opens == 0;
    if (last) {
      *pa = a->next;
      st.ipc_mapped--;
    }
  }
  pthread_mutex_unlock(&lock);
  if (!a) return ERR_INVALID_VALUE;
  if (!last) return SUCCESS;
  munmap((void *)a->base, a->mapped);
  munmap(a->shadow, a->mapped);
  free(a);
  return SUCCESS;
}

/* Apply a stream's queued operations, in order, until `until` of them were
 * ever applied (all: ~0); the first failure ends it and drops the rest. A
 * wait applies the work its event recorded on the other stream first, so
 * copies queued after a wait see what that work wrote. */
static CUresult drain_until(struct dbl_stream *s, unsigned long long until) {
  CUresult rc = SUCCESS;
  for (;;) {
    pthread_mutex_lock(&lock);
    if (s->n_ops == 0 || rc != SUCCESS || s->applied >= until) {
      if (rc != SUCCESS) {
        s->applied += s->n_ops;
        s->n_ops = 0;
      }
      pthread_mutex_unlock(&lock);
      return rc;
    }
    struct op o = s->ops[0];
    memmove(s->ops, s->ops + 1, (s->n_ops - 1) * sizeof *s->ops);
    s->n_ops--;
    s->applied++;
    struct alloc *a = o.kind == OP_WAIT ? NULL : find(o.dev, o.n, 1);
    unsigned char *shadow = a ? a->shadow + (o.dev - a->base) : NULL;
    struct alloc *b = o.kind == OP_D2D ? find(o.src_dev, o.n, 1) : NULL;
    unsigned char *src_shadow = b ? b->shadow + (o.src_dev - b->base) : NULL;
    pthread_mutex_unlock(&lock);
    if (o.kind == OP_WAIT) {
      if (o.wait->stream != s) rc = drain_until(o.wait->stream, o.wait->mark);
    } else if (o.fail) {
      rc = o.fail;
    } else if (!shadow || (o.kind == OP_D2D && !src_shadow)) {
      rc = ERR_ILLEGAL_ADDRESS; /* freed (or closed) while the copy was queued */
    } else if (o.kind == OP_H2D) {
      memcpy(shadow, o.host, o.n);
    } else if (o.kind == OP_D2H) {
      memcpy(o.host, shadow, o.n);
    } else {
      memmove(shadow, src_shadow, o.n);
    }
  }
}

static CUresult drain(struct dbl_stream *s) { return drain_until(s, ~0ull); }

EXPORT CUresult cuEventCreate(CUevent *pe, unsigned flags) {
  (void)flags;
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!pe) return ERR_INVALID_VALUE;
  struct dbl_event *e = calloc(1, sizeof *e);
  if (!e) return ERR_OUT_OF_MEMORY;
  *pe = e;
  return SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  if (!e) return ERR_INVALID_HANDLE;
  free(e);
  return SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!e) return ERR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  struct dbl_stream *stream = resolve_stream(s);
  if (stream) {
    e->stream = stream;
    e->mark = stream->queued;
  }
  pthread_mutex_unlock(&lock);
  return stream ? SUCCESS : ERR_INVALID_CONTEXT;
}

/* Work queued on `s` after this waits for `e`'s work (on the device: never
 * the host). An event never recorded is complete. */
EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
  (void)flags;
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!e) return ERR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  struct dbl_stream *stream = resolve_stream(s);
  CUresult rc = stream ? SUCCESS : ERR_INVALID_CONTEXT;
  if (rc == SUCCESS && e->stream) {
    rc = push_op(stream, (struct op){.kind = OP_WAIT, .wait = e});
    if (rc == SUCCESS) st.event_waits++;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!e) return ERR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  struct dbl_stream *stream = e->stream;
  unsigned long long mark = e->mark;
  pthread_mutex_unlock(&lock);
  return stream ? drain_until(stream, mark) : SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) {
  if (!inited) return ERR_NOT_INITIALIZED;
  pthread_mutex_lock(&lock);
  struct dbl_stream *stream = resolve_stream(s);
  st.syncs++;
  pthread_mutex_unlock(&lock);
  if (!stream) return ERR_INVALID_CONTEXT;
  return drain(stream);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  if (!inited) return ERR_NOT_INITIALIZED;
  if (!s) return ERR_INVALID_HANDLE;
  (void)drain(s); /* queued work still completes, as on the driver */
  pthread_mutex_lock(&lock);
  st.streams_live--;
  pthread_mutex_unlock(&lock);
  free(s->ops);
  free(s);
  return SUCCESS;
}

static const struct {
  int code;
  const char *name, *text;
} errors[] = {
    {SUCCESS, "CUDA_SUCCESS", "no error"},
    {ERR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {ERR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {ERR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {ERR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {ERR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {ERR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {ERR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {ERR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {ERR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
};

EXPORT CUresult cuGetErrorName(CUresult code, const char **out) {
  if (!out) return ERR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == code) {
      *out = errors[i].name;
      return SUCCESS;
    }
  *out = NULL;
  return ERR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult code, const char **out) {
  if (!out) return ERR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == code) {
      *out = errors[i].text;
      return SUCCESS;
    }
  *out = NULL;
  return ERR_INVALID_VALUE;
}

EXPORT void cuda_double_stats(struct cuda_double_stats *out) {
  pthread_mutex_lock(&lock);
  *out = st;
  pthread_mutex_unlock(&lock);
}

EXPORT void cuda_double_reset_peak(void) {
  pthread_mutex_lock(&lock);
  st.pinned_peak = st.pinned_bytes;
  pthread_mutex_unlock(&lock);
}

EXPORT void cuda_double_inject(const char *what, int after, int count, int code) {
  pthread_mutex_lock(&lock);
  size_t slot = 0;
  for (size_t i = 0; i < sizeof inj / sizeof inj[0]; i++) {
    if (strcmp(inj[i].what, what) == 0 || inj[i].count == 0) {
      slot = i;
      if (strcmp(inj[i].what, what) == 0) break;
    }
  }
  strncpy(inj[slot].what, what, sizeof inj[slot].what - 1);
  inj[slot].after = after;
  inj[slot].count = count;
  inj[slot].code = code;
  pthread_mutex_unlock(&lock);
}
