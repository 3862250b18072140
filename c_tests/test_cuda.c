/* Device (CUDA) memory on the native TCP engine, through the C ABI.
 *
 *   test_cuda          against the driver stand-in (c_tests/cuda_double),
 *                      with its counters: contexts, pinned bytes, the context
 *                      current for every copy.
 *   test_cuda --real   the same cases against the real driver
 *                      (libcuda.so.1, or PDX_TEST_CUDA_REAL_LIB); prints a
 *                      SKIP line and exits 77 when there is none. Needs only
 *                      a C compiler and a prebuilt libpdx.so:
 *   cc -Iinclude -Ic_tests c_tests/test_cuda.c -Ltarget/release -lpdx -ldl -lpthread \
 *      -Wl,-rpath,$PWD/target/release -o test_cuda && ./test_cuda --real
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_double/cuda_double.h"
#include "harness.h"

typedef int CUresult;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

static struct {
  CUresult (*init)(unsigned);
  CUresult (*get_count)(int *);
  CUresult (*retain)(CUcontext *, int);
  CUresult (*set_current)(CUcontext);
  CUresult (*get_current)(CUcontext *);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*free)(CUdeviceptr);
  CUresult (*h2d)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*d2h)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*sync)(CUstream);
  cuda_double_stats_fn stats;     /* NULL on a real driver */
  cuda_double_reset_peak_fn reset_peak;
  cuda_double_inject_fn inject;
} cu;

static int real;          /* running against a real driver */
static int dev_hi = 3;    /* the second device: cuda:3 (or the last one) */
static uint64_t own_pageable; /* copies this test made from pageable memory */

static void *sym(void *lib, const char *name, int required) {
  void *p = dlsym(lib, name);
  if (!p && required) {
    fprintf(stderr, "driver lacks %s\n", name);
    exit(1);
  }
  return p;
}

/* dlsym into a function pointer without an object-to-function cast. */
#define LOAD(field, name, required)                \
  do {                                             \
    void *p_ = sym(lib, name, required);           \
    memcpy(&cu.field, &p_, sizeof cu.field);       \
  } while (0)

/* 1 if the driver at `path` loaded and has a device. */
static int load_driver(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  LOAD(init, "cuInit", 1);
  LOAD(get_count, "cuDeviceGetCount", 1);
  LOAD(retain, "cuDevicePrimaryCtxRetain", 1);
  LOAD(set_current, "cuCtxSetCurrent", 1);
  LOAD(get_current, "cuCtxGetCurrent", 1);
  LOAD(alloc, "cuMemAlloc_v2", 1);
  LOAD(free, "cuMemFree_v2", 1);
  LOAD(h2d, "cuMemcpyHtoDAsync_v2", 1);
  LOAD(d2h, "cuMemcpyDtoHAsync_v2", 1);
  LOAD(sync, "cuStreamSynchronize", 1);
  LOAD(stats, "cuda_double_stats", 0);
  LOAD(reset_peak, "cuda_double_reset_peak", 0);
  LOAD(inject, "cuda_double_inject", 0);
  int n = 0;
  if (cu.init(0) != 0 || cu.get_count(&n) != 0 || n < 1) return 0;
  if (n <= dev_hi) dev_hi = n - 1;
  return 1;
}

static void use_device(int d) {
  CUcontext c = NULL;
  if (cu.retain(&c, d) != 0 || cu.set_current(c) != 0) {
    fprintf(stderr, "cannot use device %d\n", d);
    exit(1);
  }
}

static CUdeviceptr dev_alloc(int d, size_t n) {
  CUdeviceptr p = 0;
  use_device(d);
  if (cu.alloc(&p, n) != 0) {
    fprintf(stderr, "cuMemAlloc_v2(%zu) failed on device %d\n", n, d);
    exit(1);
  }
  return p;
}

static void dev_write(int d, CUdeviceptr p, const void *src, size_t n) {
  use_device(d);
  CHECK(cu.h2d(p, src, n, NULL) == 0 && cu.sync(NULL) == 0);
  own_pageable++;
}

static void dev_read(int d, void *dst, CUdeviceptr p, size_t n) {
  use_device(d);
  CHECK(cu.d2h(dst, p, n, NULL) == 0 && cu.sync(NULL) == 0);
  own_pageable++;
}

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}
static void fill(unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(rng() >> 24);
}

static void get_stats(struct cuda_double_stats *s) {
  memset(s, 0, sizeof *s);
  if (cu.stats) cu.stats(s);
}

/* ------------------------------------------- the stand-in itself */

/* The mistakes staging must avoid are visible: the CPU cannot touch device
 * memory, and an asynchronous copy lands only at its stream's synchronize. */
static void test_stand_in(void) {
  if (real) return;
  CUdeviceptr d = dev_alloc(0, 4096);
  unsigned char a[4096], b[4096], got[4096];
  memset(a, 'a', sizeof a);
  memset(b, 'b', sizeof b);
  dev_write(0, d, a, sizeof a);
  /* A copy queued and not synchronized has not happened yet. */
  CUresult (*create)(CUstream *, unsigned) = NULL;
  CUresult (*destroy)(CUstream) = NULL;
  void *lib = dlopen(CUDA_DOUBLE_LIB, RTLD_NOW | RTLD_LOCAL);
  void *p = lib ? dlsym(lib, "cuStreamCreate") : NULL;
  memcpy(&create, &p, sizeof create);
  p = lib ? dlsym(lib, "cuStreamDestroy_v2") : NULL;
  memcpy(&destroy, &p, sizeof destroy);
  CUstream s = NULL;
  CHECK(create && destroy && create(&s, 1) == 0);
  CHECK(cu.h2d(d, b, sizeof b, s) == 0);
  own_pageable++;
  dev_read(0, got, d, sizeof got);
  CHECK(memcmp(got, a, sizeof a) == 0);
  CHECK(cu.sync(s) == 0);
  dev_read(0, got, d, sizeof got);
  CHECK(memcmp(got, b, sizeof b) == 0);
  CHECK(destroy(s) == 0);
  /* A CPU read of device memory faults (in a child process). */
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) {
    /* Quiet: ASan (or the kernel) reports the expected fault on stderr. */
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
    volatile unsigned char *bad = (volatile unsigned char *)(uintptr_t)d;
    _exit(bad[0] == 0x42 ? 0 : 0); /* never reached: the read faults */
  }
  int status = 0;
  CHECK(child > 0 && waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0));
  CHECK(cu.free(d) == 0);
  if (lib) dlclose(lib);
}

/* ------------------------------------------------ registration refusals */

static void test_no_driver(void) {
  if (real) return;
  setenv("PDX_CUDA_LIB", "/nonexistent/libcuda.so.1", 1);
  pdx_engine *e = start_engine();
  static unsigned char host[4096];
  CHECK_STATUS(pdx_register_memory_at(e, host, sizeof host, "cuda:0"), PDX_ERR_DEVICE_UNAVAILABLE);
  CHECK(strstr(pdx_last_error_message(), "cannot register 0x") != NULL);
  CHECK(strstr(pdx_last_error_message(), "as cuda:0") != NULL);
  CHECK(strstr(pdx_last_error_message(), "/nonexistent/libcuda.so.1") != NULL);
  /* Without a driver, "*" and NULL are host memory. */
  CHECK_OK(pdx_register_memory_at(e, host, 2048, "*"));
  CHECK_OK(pdx_register_memory_at(e, host + 2048, 1024, NULL));
  CHECK_OK(pdx_register_memory_at(e, host + 3072, 1024, "cpu:1"));
  CHECK_STATUS(pdx_register_memory_at(e, host, 1, "gpu:0"), PDX_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(pdx_register_memory_at(e, NULL, 1, "*"), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_register_memory_at(NULL, host, 1, "*"), pdx_register_memory(NULL, host, 1));
  pdx_engine_free(e);
}

static void test_refusals(pdx_engine *e) {
  CUdeviceptr d0 = dev_alloc(0, 1 << 20);
  static unsigned char host[8192];
  CHECK_STATUS(pdx_register_memory_at(e, (void *)(uintptr_t)d0, 1 << 20, "cuda:7"), PDX_ERR_INVALID_ARGUMENT);
  if (dev_hi > 0) {
    CHECK_STATUS(pdx_register_memory_at(e, (void *)(uintptr_t)d0, 1 << 20, "cuda:1"), PDX_ERR_INVALID_ARGUMENT);
    CHECK(strstr(pdx_last_error_message(), "on cuda:0") != NULL);
  }
  /* Host memory is not cuda:N: the driver says so (an error for pageable memory). */
  pdx_status s = pdx_register_memory_at(e, host, sizeof host, "cuda:0");
  CHECK(s == PDX_ERR_DEVICE || s == PDX_ERR_INVALID_ARGUMENT);
  CHECK(strstr(pdx_last_error_message(), "cannot register 0x") != NULL);
  if (!real) {
    CHECK(strstr(pdx_last_error_message(), "CUDA_ERROR_INVALID_VALUE") != NULL);
    /* A device pointer whose driver call fails is refused, not guessed. */
    cu.inject("cuPointerGetAttribute", 1, 1, 700);
    CHECK_STATUS(pdx_register_memory_at(e, (void *)(uintptr_t)d0, 1 << 20, "*"), PDX_ERR_DEVICE);
    CHECK(strstr(pdx_last_error_message(), "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access") != NULL);
    struct cuda_double_stats st;
    get_stats(&st);
    CHECK((st.contexts_retained_mask & 0x6) == 0 || dev_hi < 3); /* cuda:1, cuda:2 untouched */
  }
  /* "*" finds device memory; the same range cannot be registered twice. */
  CHECK_OK(pdx_register_memory_at(e, (void *)(uintptr_t)d0, 1 << 20, "*"));
  CHECK_STATUS(pdx_register_memory_at(e, (void *)(uintptr_t)d0, 4096, "cuda:0"), PDX_ERR_ADDRESS_OVERLAP);
  CHECK_OK(pdx_unregister_memory(e, (void *)(uintptr_t)d0));
  CHECK(cu.free(d0) == 0);
}

/* ------------------------------------------------------------ transfers */

struct side {
  pdx_engine *e;
  int dev;          /* -1: host memory */
  size_t len;
  unsigned char *host; /* host region (dev < 0) */
  CUdeviceptr dptr;
};

static void side_init(struct side *s, pdx_engine *e, int dev, size_t len) {
  s->e = e;
  s->dev = dev;
  s->len = len;
  s->host = NULL;
  s->dptr = 0;
  char loc[16];
  if (dev < 0) {
    s->host = malloc(len);
    CHECK_OK(pdx_register_memory_at(e, s->host, len, "cpu:0"));
  } else {
    s->dptr = dev_alloc(dev, len);
    snprintf(loc, sizeof loc, "cuda:%d", dev);
    CHECK_OK(pdx_register_memory_at(e, (void *)(uintptr_t)s->dptr, len, loc));
  }
}

static void side_free(struct side *s) {
  void *a = s->dev < 0 ? (void *)s->host : (void *)(uintptr_t)s->dptr;
  CHECK_OK(pdx_unregister_memory(s->e, a));
  if (s->dev < 0)
    free(s->host);
  else
    CHECK(cu.free(s->dptr) == 0);
}

static uint64_t side_addr(const struct side *s) { return s->dev < 0 ? (uint64_t)(uintptr_t)s->host : s->dptr; }

static void side_put(struct side *s, size_t off, const void *src, size_t n) {
  if (s->dev < 0)
    memcpy(s->host + off, src, n);
  else
    dev_write(s->dev, s->dptr + off, src, n);
}

static void side_get(struct side *s, size_t off, void *dst, size_t n) {
  if (s->dev < 0)
    memcpy(dst, s->host + off, n);
  else
    dev_read(s->dev, dst, s->dptr + off, n);
}

/* ------------------------------------ unregistered device memory as local */

static pdx_stats stats_of(pdx_engine *e) {
  pdx_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  CHECK_OK(pdx_engine_stats(e, &s));
  return s;
}

/* A batch of `n` entries of `len` bytes between `local` (stride len) and
 * `remote`: refused before anything moves, naming a device range. */
static void refused_batch(pdx_engine *e, const char *session, int opcode, uint64_t local, uint64_t remote, size_t n,
                          size_t len) {
  void **locals = malloc(n * sizeof *locals);
  uint64_t *remotes = malloc(n * sizeof *remotes);
  size_t *lens = malloc(n * sizeof *lens);
  for (size_t i = 0; i < n; i++) {
    locals[i] = (void *)(uintptr_t)(local + i * len);
    remotes[i] = remote + i * len;
    lens[i] = len;
  }
  pdx_status st = opcode == PDX_OPCODE_READ ? pdx_batch_transfer_sync_read(e, session, locals, remotes, lens, n)
                                            : pdx_batch_transfer_sync_write(e, session, locals, remotes, lens, n);
  CHECK(st == PDX_ERR_ADDRESS_NOT_REGISTERED);
  char want[96];
  snprintf(want, sizeof want, "local range %#llx+%zu is device memory (cuda:", (unsigned long long)local, len);
  CHECK(strstr(pdx_last_error_message(), want) != NULL);
  if (st != PDX_ERR_ADDRESS_NOT_REGISTERED || strstr(pdx_last_error_message(), want) == NULL)
    fprintf(stderr, "  %s %zu x %zu: %s: %s\n", opcode == PDX_OPCODE_READ ? "read" : "write", n, len,
            pdx_status_str(st), pdx_last_error_message());
  /* The asynchronous form refuses at submission. */
  uint64_t id = 0;
  CHECK_STATUS(pdx_batch_submit(e, session, opcode, locals, remotes, lens, n, NULL, NULL, &id),
               PDX_ERR_ADDRESS_NOT_REGISTERED);
  CHECK(id == 0);
  free(locals);
  free(remotes);
  free(lens);
}

/* Device memory this engine has not registered, as the local buffer of a
 * read or a write: refused with PDX_ERR_ADDRESS_NOT_REGISTERED before any
 * byte moves (reading into it would make the CPU write device memory),
 * whether the engine has device regions of its own or not, and also when
 * another engine registered it. Host memory nobody registered still moves. */
static void test_unregistered_device_locals(void) {
  pdx_engine *target = start_engine(), *c = start_engine();
  const char *st = pdx_engine_session_id(target);
  struct side remote;
  side_init(&remote, target, -1, 1 << 20);
  memset(remote.host, 0x5a, 1 << 20);
  const size_t n_big = 100000;
  CUdeviceptr d = dev_alloc(0, n_big * 4);
  pdx_stats before = stats_of(target);
  /* c has no region at all: the driver's pointer query finds the device memory. */
  static const size_t shapes[][2] = {{64, 16}, {1, 1}, {100000, 4}};
  for (size_t k = 0; k < 3; k++) {
    refused_batch(c, st, PDX_OPCODE_READ, d, (uint64_t)(uintptr_t)remote.host, shapes[k][0], shapes[k][1]);
    refused_batch(c, st, PDX_OPCODE_WRITE, d, (uint64_t)(uintptr_t)remote.host, shapes[k][0], shapes[k][1]);
  }
  /* A range that ends in device memory (its start is not) is refused too. */
  CHECK_STATUS(pdx_transfer_sync_read(c, st, (void *)(uintptr_t)(d - 100), (uint64_t)(uintptr_t)remote.host, 200),
               PDX_ERR_ADDRESS_NOT_REGISTERED);
  CHECK(strstr(pdx_last_error_message(), "is device memory (cuda:0") != NULL);
  /* Registered on the target engine (same process), used as c's local. */
  CHECK_OK(pdx_register_memory_at(target, (void *)(uintptr_t)d, n_big * 4, "cuda:0"));
  refused_batch(c, st, PDX_OPCODE_READ, d, (uint64_t)(uintptr_t)remote.host, 64, 16);
  refused_batch(c, st, PDX_OPCODE_WRITE, d + 16, (uint64_t)(uintptr_t)remote.host, 1, 1);
  CHECK_OK(pdx_unregister_memory(target, (void *)(uintptr_t)d));
  /* An engine with device regions of its own, and a device pointer outside them. */
  struct side own;
  side_init(&own, c, 0, 1 << 20);
  refused_batch(c, st, PDX_OPCODE_READ, d, (uint64_t)(uintptr_t)remote.host, 64, 16);
  refused_batch(c, st, PDX_OPCODE_WRITE, d, (uint64_t)(uintptr_t)remote.host, 64, 16);
  /* Nothing reached the target, nothing changed there. */
  pdx_stats after = stats_of(target);
  CHECK(after.served_reads == before.served_reads && after.served_writes == before.served_writes);
  int untouched = 1;
  for (size_t i = 0; i < (1u << 20); i++) untouched &= remote.host[i] == 0x5a;
  CHECK(untouched);
  /* The same transfers from registered device memory, and from host memory
   * nobody registered, work. */
  unsigned char *plain = malloc(4096);
  memset(plain, 0x11, 4096);
  CHECK_OK(pdx_transfer_sync_write(c, st, plain, (uint64_t)(uintptr_t)remote.host, 4096));
  CHECK(remote.host[0] == 0x11 && remote.host[4095] == 0x11);
  memset(plain, 0, 4096);
  CHECK_OK(pdx_transfer_sync_read(c, st, plain, (uint64_t)(uintptr_t)remote.host + 1, 4095));
  CHECK(plain[0] == 0x11 && plain[4094] == 0x11);
  CHECK_OK(pdx_transfer_sync_read(c, st, (void *)(uintptr_t)own.dptr, (uint64_t)(uintptr_t)remote.host, 4096));
  unsigned char got[4096];
  side_get(&own, 0, got, sizeof got);
  CHECK(got[0] == 0x11 && got[4095] == 0x11);
  free(plain);
  side_free(&own);
  side_free(&remote);
  CHECK(cu.free(d) == 0);
  pdx_engine_free(c);
  pdx_engine_free(target);
}

/* Write `n` bytes local → remote, read them back into another place of the
 * local side, and check both landings. */
static void round_trip(struct side *loc, struct side *rem, const char *session, size_t n, int label_dev) {
  unsigned char *want = malloc(n), *got = malloc(n);
  fill(want, n);
  side_put(loc, 0, want, n);
  double t0 = now_s();
  CHECK_OK(pdx_transfer_sync_write(loc->e, session, (void *)(uintptr_t)side_addr(loc), side_addr(rem), n));
  double t1 = now_s();
  side_get(rem, 0, got, n);
  CHECK(memcmp(want, got, n) == 0);
  /* Read back into the second half of the local side. */
  size_t off = loc->len / 2;
  CHECK_OK(pdx_transfer_sync_read(loc->e, session, (void *)(uintptr_t)(side_addr(loc) + off), side_addr(rem), n));
  double t2 = now_s();
  memset(got, 0, n);
  side_get(loc, off, got, n);
  CHECK(memcmp(want, got, n) == 0);
  if (n >= (64u << 20))
    printf("  %3d MiB %s -> %s: write %.2f GB/s, read %.2f GB/s\n", (int)(n >> 20), loc->dev < 0 ? "host" : "cuda",
           rem->dev < 0 ? "host" : "cuda", (double)n / (t1 - t0) / 1e9, (double)n / (t2 - t1) / 1e9);
  (void)label_dev;
  free(want);
  free(got);
}

static void test_round_trips(pdx_engine *a, pdx_engine *b) {
  const char *sa = pdx_engine_session_id(a);
  static const size_t sizes[] = {1, 4095, 4096, (1u << 20) + 7, 16u << 20};
  /* local/remote: cuda:0 ↔ cuda:3, cuda:0 → host, host → cuda:3 */
  const int combos[][2] = {{0, 3}, {0, -1}, {-1, 3}};
  for (size_t c = 0; c < 3; c++) {
    struct side loc, rem;
    int rd = combos[c][1] == 3 ? dev_hi : -1;
    side_init(&loc, b, combos[c][0], 32u << 20);
    side_init(&rem, a, rd, 16u << 20);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) round_trip(&loc, &rem, sa, sizes[i], 0);
    side_free(&loc);
    side_free(&rem);
    /* Protocol v1 (a fence read confirms the writes), engines started with
     * MC_TCP_PROTO=1. */
    setenv("MC_TCP_PROTO", "1", 1);
    pdx_engine *a1 = start_engine(), *b1 = start_engine();
    unsetenv("MC_TCP_PROTO");
    side_init(&loc, b1, combos[c][0], 32u << 20);
    side_init(&rem, a1, rd, 16u << 20);
    round_trip(&loc, &rem, pdx_engine_session_id(a1), (3u << 20) + 5, 0);
    round_trip(&loc, &rem, pdx_engine_session_id(a1), 4096, 0);
    side_free(&loc);
    side_free(&rem);
    pdx_engine_free(a1);
    pdx_engine_free(b1);
  }
  /* 256 MiB device to device, both directions. */
  struct side loc, rem;
  side_init(&loc, b, 0, 512u << 20);
  side_init(&rem, a, dev_hi, 256u << 20);
  round_trip(&loc, &rem, sa, 256u << 20, 0);
  side_free(&loc);
  side_free(&rem);
}

/* 2048 scattered 4 KiB pages, device to device, both directions. */
static void test_pages(pdx_engine *a, pdx_engine *b) {
  enum { PAGES = 4096, PG = 4096, N = 2048 };
  struct side loc, rem;
  side_init(&loc, b, 0, (size_t)PAGES * PG);
  side_init(&rem, a, dev_hi, (size_t)PAGES * PG);
  unsigned char *img = malloc((size_t)PAGES * PG), *got = malloc((size_t)PAGES * PG);
  fill(img, (size_t)PAGES * PG);
  side_put(&loc, 0, img, (size_t)PAGES * PG);
  memset(got, 0, (size_t)PAGES * PG);
  side_put(&rem, 0, got, (size_t)PAGES * PG);
  static int perm[PAGES];
  for (int i = 0; i < PAGES; i++) perm[i] = i;
  for (int i = PAGES - 1; i > 0; i--) {
    int j = (int)(rng() % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  static void *locals[N];
  static uint64_t remotes[N];
  static size_t lens[N];
  for (int i = 0; i < N; i++) {
    locals[i] = (void *)(uintptr_t)(loc.dptr + (uint64_t)perm[i] * PG);
    remotes[i] = rem.dptr + (uint64_t)perm[N + i] * PG;
    lens[i] = PG;
  }
  double t0 = now_s();
  CHECK_OK(pdx_batch_transfer_sync_write(b, pdx_engine_session_id(a), locals, remotes, lens, N));
  double t1 = now_s();
  side_get(&rem, 0, got, (size_t)PAGES * PG);
  int bad = 0;
  for (int i = 0; i < N; i++)
    bad += memcmp(got + (size_t)perm[N + i] * PG, img + (size_t)perm[i] * PG, PG) != 0;
  CHECK(bad == 0);
  /* Read them back into other pages of the local side. */
  for (int i = 0; i < N; i++) locals[i] = (void *)(uintptr_t)(loc.dptr + (uint64_t)perm[(i + 7) % N] * PG);
  CHECK_OK(pdx_batch_transfer_sync_read(b, pdx_engine_session_id(a), locals, remotes, lens, N));
  double t2 = now_s();
  side_get(&loc, 0, got, (size_t)PAGES * PG);
  bad = 0;
  for (int i = 0; i < N; i++)
    bad += memcmp(got + (size_t)perm[(i + 7) % N] * PG, img + (size_t)perm[i] * PG, PG) != 0;
  CHECK(bad == 0);
  printf("  %d x 4 KiB pages cuda -> cuda: write %.2f GB/s, read %.2f GB/s\n", N,
         (double)N * PG / (t1 - t0) / 1e9, (double)N * PG / (t2 - t1) / 1e9);
  free(img);
  free(got);
  side_free(&loc);
  side_free(&rem);
}

/* A KV plan over device memory on both sides, layer by layer: every page
 * lands, and the last layer's notification comes once, after all of them. */
static void test_kv_plan(pdx_engine *a, pdx_engine *b) {
  enum { LAYERS = 4, POOL = 64, PG = 8192, N = 40 };
  struct side loc, rem;
  size_t bytes = (size_t)2 * LAYERS * POOL * PG;
  side_init(&loc, b, 0, bytes);
  side_init(&rem, a, dev_hi, bytes);
  unsigned char *img = malloc(bytes), *got = malloc(bytes);
  fill(img, bytes);
  side_put(&loc, 0, img, bytes);
  memset(got, 0, bytes);
  side_put(&rem, 0, got, bytes);
  pdx_kv_buffer lb[2 * LAYERS], rb[2 * LAYERS];
  for (int i = 0; i < 2 * LAYERS; i++) {
    lb[i] = (pdx_kv_buffer){loc.dptr + (uint64_t)i * POOL * PG, PG, POOL};
    rb[i] = (pdx_kv_buffer){rem.dptr + (uint64_t)i * POOL * PG, PG, POOL};
  }
  int32_t src[N], dst[N];
  for (int i = 0; i < N; i++) src[i] = (i * 7) % POOL, dst[i] = POOL - 1 - i; /* runs of 1 */
  pdx_kv_plan *plan = NULL;
  CHECK_OK(pdx_kv_plan_new(lb, rb, 2 * LAYERS, src, dst, N, NULL, &plan));
  uint64_t ids[LAYERS];
  const char *peer = pdx_engine_session_id(a);
  for (int l = 0; l < LAYERS; l++) {
    int last = l == LAYERS - 1;
    CHECK_OK(pdx_kv_submit(b, peer, plan, 2 * (size_t)l, 2 * (size_t)l + 2, PDX_OPCODE_WRITE, NULL,
                           last ? "kv_done" : NULL, last ? "room-cuda" : NULL, &ids[l]));
  }
  pdx_status notified = -1;
  CHECK_OK(pdx_kv_notify_wait(b, ids[LAYERS - 1], 30000, &notified));
  CHECK(notified == PDX_OK);
  for (int l = 0; l < LAYERS; l++) {
    int32_t state = -1;
    CHECK_OK(pdx_batch_wait(b, ids[l], 30000, &state));
    CHECK(state == PDX_TASK_COMPLETED);
    CHECK_OK(pdx_batch_free(b, ids[l]));
  }
  pdx_notifications *list = NULL;
  CHECK_OK(pdx_notifications_drain(a, &list));
  size_t seen = 0;
  for (size_t i = 0; i < pdx_notifications_count(list); i++) {
    const char *name = NULL, *msg = NULL;
    CHECK_OK(pdx_notification_get(list, i, &name, &msg));
    seen += strcmp(name, "kv_done") == 0 && strcmp(msg, "room-cuda") == 0;
  }
  pdx_notifications_free(list);
  CHECK(seen == 1);
  side_get(&rem, 0, got, bytes);
  int bad = 0;
  for (int i = 0; i < 2 * LAYERS; i++)
    for (int k = 0; k < N; k++)
      bad += memcmp(got + ((size_t)i * POOL + (size_t)dst[k]) * PG, img + ((size_t)i * POOL + (size_t)src[k]) * PG, PG) != 0;
  CHECK(bad == 0);
  pdx_kv_plan_free(plan);
  free(img);
  free(got);
  side_free(&loc);
  side_free(&rem);
}

/* wait_event: a KV submit from device memory waits, on the device, for the
 * caller's work recorded on an event. The caller's "kernel" is a copy
 * queued on its own stream that nobody synchronizes: without the event pdx
 * reads the bytes from before it (the stand-in applies queued work only
 * when something waits for it, as a missing wait on a GPU races); with the
 * event it reads the new ones, and the caller never synchronized. */
static void test_kv_wait_event(pdx_engine *a, pdx_engine *b) {
  if (real) return;
  enum { PG = 4096, PAGES = 8 };
  void *lib = dlopen(CUDA_DOUBLE_LIB, RTLD_NOW | RTLD_LOCAL);
  CUresult (*stream_create)(CUstream *, unsigned) = NULL;
  CUresult (*stream_destroy)(CUstream) = NULL;
  CUresult (*event_create)(void **, unsigned) = NULL;
  CUresult (*event_record)(void *, CUstream) = NULL;
  CUresult (*event_destroy)(void *) = NULL;
  void *p;
  p = lib ? dlsym(lib, "cuStreamCreate") : NULL;
  memcpy(&stream_create, &p, sizeof p);
  p = lib ? dlsym(lib, "cuStreamDestroy_v2") : NULL;
  memcpy(&stream_destroy, &p, sizeof p);
  p = lib ? dlsym(lib, "cuEventCreate") : NULL;
  memcpy(&event_create, &p, sizeof p);
  p = lib ? dlsym(lib, "cuEventRecord") : NULL;
  memcpy(&event_record, &p, sizeof p);
  p = lib ? dlsym(lib, "cuEventDestroy_v2") : NULL;
  memcpy(&event_destroy, &p, sizeof p);
  CHECK(stream_create && stream_destroy && event_create && event_record && event_destroy);
  if (!(stream_create && stream_destroy && event_create && event_record && event_destroy)) return;
  struct side loc;
  side_init(&loc, b, 0, (size_t)PAGES * PG);
  static unsigned char old[PAGES * PG], fresh[PAGES * PG], target[PAGES * PG];
  memset(old, 'o', sizeof old);
  memset(fresh, 'n', sizeof fresh);
  side_put(&loc, 0, old, sizeof old);
  CHECK_OK(pdx_register_memory(a, target, sizeof target));
  pdx_kv_buffer lb = {loc.dptr, PG, PAGES}, rb = {(uint64_t)(uintptr_t)target, PG, PAGES};
  int32_t pages[PAGES];
  for (int i = 0; i < PAGES; i++) pages[i] = i;
  pdx_kv_plan *plan = NULL;
  CHECK_OK(pdx_kv_plan_new(&lb, &rb, 1, pages, pages, PAGES, NULL, &plan));
  const char *peer = pdx_engine_session_id(a);
  for (int with_event = 0; with_event <= 1; with_event++) {
    memset(target, 0, sizeof target);
    use_device(0);
    CUstream caller = NULL;
    void *ev = NULL;
    CHECK(stream_create(&caller, 1) == 0 && event_create(&ev, 0) == 0);
    CHECK(cu.h2d(loc.dptr, fresh, sizeof fresh, caller) == 0); /* the "kernel": queued, never synchronized */
    own_pageable++;
    CHECK(event_record(ev, caller) == 0);
    uint64_t id = 0;
    CHECK_OK(pdx_kv_submit(b, peer, plan, 0, 1, PDX_OPCODE_WRITE, with_event ? ev : NULL, NULL, NULL, &id));
    int32_t state = -1;
    CHECK_OK(pdx_batch_wait(b, id, 30000, &state));
    CHECK(state == PDX_TASK_COMPLETED);
    CHECK_OK(pdx_batch_free(b, id));
    if (with_event) {
      CHECK(memcmp(target, fresh, sizeof target) == 0);
    } else {
      CHECK(memcmp(target, old, sizeof target) == 0); /* the race a missing wait leaves */
    }
    use_device(0);
    CHECK(cu.sync(caller) == 0 && stream_destroy(caller) == 0 && event_destroy(ev) == 0);
    side_put(&loc, 0, old, sizeof old);
  }
  struct cuda_double_stats st;
  get_stats(&st);
  CHECK(st.event_waits >= 1);
  pdx_kv_plan_free(plan);
  CHECK_OK(pdx_unregister_memory(a, target));
  side_free(&loc);
  dlclose(lib);
}

/* ---------------------------------------------- bounded under 16 threads */

struct worker {
  pdx_engine *b;
  const char *session;
  CUdeviceptr local, remote, back;
  size_t n;
  int ok;
};

static void *worker_main(void *arg) {
  struct worker *w = arg;
  w->ok = 1;
  for (int r = 0; r < 3; r++) {
    if (pdx_transfer_sync_write(w->b, w->session, (void *)(uintptr_t)w->local, w->remote, w->n) != PDX_OK) w->ok = 0;
    if (pdx_transfer_sync_read(w->b, w->session, (void *)(uintptr_t)w->back, w->remote, w->n) != PDX_OK)
      w->ok = 0;
  }
  return NULL;
}

static void test_cap(void) {
  enum { T = 16 };
  const size_t cap = 256u << 10, n = 4u << 20;
  setenv("PDX_CUDA_STAGING_BYTES", "262144", 1);
  pdx_engine *a = start_engine(), *b = start_engine();
  unsetenv("PDX_CUDA_STAGING_BYTES");
  struct side loc, rem;
  side_init(&loc, b, 0, 2 * n * T);
  side_init(&rem, a, dev_hi, n * T);
  unsigned char *img = malloc(2 * n * T), *got = malloc(2 * n * T);
  fill(img, n * T);
  side_put(&loc, 0, img, n * T);
  struct cuda_double_stats before, after;
  if (cu.reset_peak) cu.reset_peak();
  get_stats(&before);
  pthread_t th[T];
  struct worker w[T];
  for (int i = 0; i < T; i++) {
    /* Local halves: [0, n*T) is the source, [n*T, 2n*T) the read-back. */
    w[i] = (struct worker){b, pdx_engine_session_id(a), loc.dptr + (uint64_t)i * n, rem.dptr + (uint64_t)i * n,
                           loc.dptr + (uint64_t)(T + i) * n, n, 0};
    pthread_create(&th[i], NULL, worker_main, &w[i]);
  }
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  get_stats(&after);
  for (int i = 0; i < T; i++) CHECK(w[i].ok);
  side_get(&rem, 0, got, n * T);
  CHECK(memcmp(got, img, n * T) == 0);
  side_get(&loc, n * T, got, n * T);
  CHECK(memcmp(got, img, n * T) == 0);
  if (!real) {
    /* Two engines, each within its cap; nothing else allocated pinned memory. */
    CHECK(after.pinned_peak - before.pinned_bytes <= 2 * cap);
    CHECK(after.pinned_peak > before.pinned_bytes);
    printf("  16 threads, cap %zu KiB per engine: pinned peak %llu KiB for two engines\n", cap >> 10,
           (unsigned long long)((after.pinned_peak - before.pinned_bytes) >> 10));
  }
  free(img);
  free(got);
  side_free(&loc);
  side_free(&rem);
  pdx_engine_free(a);
  pdx_engine_free(b);
  if (!real) {
    /* Freeing the engines freed their pools. */
    get_stats(&after);
    CHECK(after.pinned_bytes == 0);
    CHECK(after.streams_live == 0);
  }
}

/* -------------------------------------- unregister during a transfer */

struct writer {
  pdx_engine *b;
  const char *session;
  uint64_t local, remote;
  size_t n;
  volatile int stop;
  int done, failed;
};

static void *writer_main(void *arg) {
  struct writer *w = arg;
  while (!w->stop) {
    pdx_status s = pdx_transfer_sync_write(w->b, w->session, (void *)(uintptr_t)w->local, w->remote, w->n);
    if (s == PDX_OK)
      __atomic_fetch_add(&w->done, 1, __ATOMIC_SEQ_CST);
    else
      __atomic_fetch_add(&w->failed, 1, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

static void test_unregister_during_transfer(pdx_engine *a, pdx_engine *b) {
  const size_t n = 64u << 20;
  struct side loc;
  side_init(&loc, b, 0, n);
  CUdeviceptr target = dev_alloc(dev_hi, n);
  char locs[16];
  snprintf(locs, sizeof locs, "cuda:%d", dev_hi);
  CHECK_OK(pdx_register_memory_at(a, (void *)(uintptr_t)target, n, locs));
  struct writer w = {b, pdx_engine_session_id(a), loc.dptr, target, n, 0, 0, 0};
  pthread_t th;
  pthread_create(&th, NULL, writer_main, &w);
  /* Writes are under way once the first one is done (waited for, not slept). */
  for (double until = now_s() + 20; __atomic_load_n(&w.done, __ATOMIC_SEQ_CST) == 0 && now_s() < until;) usleep(1000);
  CHECK(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST) > 0);
  double t0 = now_s();
  CHECK_OK(pdx_unregister_memory(a, (void *)(uintptr_t)target));
  double t1 = now_s();
  /* Nothing touches the device memory after unregister returned. */
  CHECK(cu.free(target) == 0);
  /* The writer goes on until a write has failed against the withdrawn region. */
  for (double until = now_s() + 20; __atomic_load_n(&w.failed, __ATOMIC_SEQ_CST) == 0 && now_s() < until;) usleep(1000);
  w.stop = 1;
  pthread_join(th, NULL);
  CHECK(w.failed > 0);
  CHECK(t1 - t0 < 5.0);
  printf("  unregister during 64 MiB writes: %d done, %d failed after, unregister took %.0f ms\n", w.done, w.failed,
         (t1 - t0) * 1e3);
  side_free(&loc);
}

/* ------------------------------------------------- failing copies */

static void test_failing_copies(pdx_engine *a, pdx_engine *b) {
  if (real) return;
  struct side loc, rem, hloc;
  side_init(&loc, b, 0, 1 << 20);
  side_init(&rem, a, dev_hi, 1 << 20);
  side_init(&hloc, b, -1, 1 << 20);
  const char *sa = pdx_engine_session_id(a);
  unsigned char buf[4096];
  fill(buf, sizeof buf);
  /* Initiator side: the copy and its retry fail; that task fails with the
   * driver's name and text, and the next one succeeds. */
  cu.inject("copy", 0, 2, 700);
  CHECK_STATUS(pdx_transfer_sync_write(b, sa, (void *)(uintptr_t)loc.dptr, rem.dptr, 4096), PDX_ERR_DEVICE);
  CHECK(strstr(pdx_last_error_message(), "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered") !=
        NULL);
  CHECK_OK(pdx_transfer_sync_write(b, sa, (void *)(uintptr_t)loc.dptr, rem.dptr, 4096));
  /* Target side: the copy of the second of three pipelined requests fails;
   * only that task fails (the first is confirmed, the third retried). */
  memcpy(hloc.host, buf, sizeof buf);
  void *locals[3] = {hloc.host, hloc.host + 4096, hloc.host + 8192};
  uint64_t remotes[3] = {rem.dptr, rem.dptr + 4096, rem.dptr + 8192};
  size_t lens[3] = {4096, 4096, 4096};
  cu.inject("copy_call", 1, 1, 1);
  uint64_t id = 0;
  CHECK_OK(pdx_batch_submit(b, sa, PDX_OPCODE_WRITE, locals, remotes, lens, 3, NULL, NULL, &id));
  int32_t state = -1;
  CHECK_OK(pdx_batch_wait(b, id, 10000, &state));
  pdx_batch_summary sum;
  CHECK_OK(pdx_batch_status(b, id, &sum));
  CHECK(sum.completed == 2 && sum.failed == 1);
  uint64_t bytes = 0;
  pdx_status err = PDX_OK;
  CHECK_OK(pdx_task_status(b, id, 1, &state, &bytes, &err));
  CHECK(state == PDX_TASK_FAILED);
  CHECK(err == PDX_ERR_REMOTE_REJECTED);
  CHECK_OK(pdx_task_status(b, id, 0, &state, &bytes, &err));
  CHECK(state == PDX_TASK_COMPLETED);
  CHECK_OK(pdx_task_status(b, id, 2, &state, &bytes, &err));
  CHECK(state == PDX_TASK_COMPLETED);
  CHECK_OK(pdx_batch_free(b, id));
  side_free(&loc);
  side_free(&rem);
  side_free(&hloc);
}

/* -------------------------------- device faults on the target, as the initiator sees them */

static struct {
  pthread_mutex_t mu;
  char text[8][512];
  int n;
} warnings = {PTHREAD_MUTEX_INITIALIZER, {{0}}, 0};

static void keep_warnings(void *ud, int32_t level, const char *module, size_t module_len, const char *msg,
                          size_t msg_len) {
  (void)ud, (void)module, (void)module_len;
  if (level < PDX_LOG_WARNING || strstr(msg, "failed on this side") == NULL) return;
  pthread_mutex_lock(&warnings.mu);
  snprintf(warnings.text[warnings.n % 8], sizeof warnings.text[0], "%.*s", (int)msg_len, msg);
  warnings.n++;
  pthread_mutex_unlock(&warnings.mu);
}

/* 1 once a kept warning contains `what` (waits up to 5 s: the target logs
 * after it sent the reject). */
static int warned(const char *what) {
  for (int spin = 0; spin < 500; spin++) {
    pthread_mutex_lock(&warnings.mu);
    int found = 0;
    for (int i = 0; i < 8 && !found; i++) found = strstr(warnings.text[i], what) != NULL;
    pthread_mutex_unlock(&warnings.mu);
    if (found) return 1;
    usleep(10000);
  }
  return 0;
}

/* A driver call failing on the target (pinned buffer, stream, the copy
 * call, the synchronize that reports a copy's fault): the initiator gets
 * PDX_ERR_REMOTE_REJECTED (all the wire can say) with a text that does not
 * claim a range error; the target logs the failed call and counts it in
 * served_device_failures, not in requests_refused. */
static void test_target_device_faults(void) {
  if (real) return;
  static const struct {
    const char *inject, *call;
    int code;
  } faults[] = {
      {"cuMemHostAlloc", "cuMemHostAlloc", 2},
      {"cuStreamCreate", "cuStreamCreate", 2},
      {"copy_call", "cuMemcpy", 700},
      {"copy", "cuStreamSynchronize", 700},
  };
  CHECK_OK(pdx_set_log_callback(keep_warnings, NULL, PDX_LOG_WARNING));
  pdx_engine *init = start_engine();
  unsigned char *h = malloc(1 << 16);
  fill(h, 1 << 16);
  for (size_t k = 0; k < sizeof faults / sizeof faults[0]; k++) {
    /* A fresh target: no pinned buffer or stream cached yet. */
    pdx_engine *t = start_engine();
    struct side rem;
    side_init(&rem, t, dev_hi, 1 << 20);
    const char *st = pdx_engine_session_id(t);
    for (int read = 0; read < 2; read++) {
      pdx_stats before = stats_of(t);
      memset(warnings.text, 0, sizeof warnings.text);
      cu.inject(faults[k].inject, 0, 1, faults[k].code);
      pdx_status s = read ? pdx_transfer_sync_read(init, st, h, rem.dptr, 4096)
                          : pdx_transfer_sync_write(init, st, h, rem.dptr, 4096);
      const char *msg = pdx_last_error_message();
      CHECK(s == PDX_ERR_REMOTE_REJECTED);
      CHECK(strstr(msg, "not inside") == NULL);
      CHECK(strstr(msg, "serving it failed on its side (a device fault") != NULL);
      if (s != PDX_ERR_REMOTE_REJECTED || strstr(msg, "not inside") != NULL)
        fprintf(stderr, "  %s (%s): %s: %s\n", faults[k].inject, read ? "read" : "write", pdx_status_str(s), msg);
      CHECK(warned(faults[k].call));
      pdx_stats after = stats_of(t);
      CHECK(after.served_device_failures == before.served_device_failures + 1);
      CHECK(after.requests_refused == before.requests_refused);
    }
    /* Afterwards the same transfers work. */
    CHECK_OK(pdx_transfer_sync_write(init, st, h, rem.dptr, 4096));
    CHECK_OK(pdx_transfer_sync_read(init, st, h + 4096, rem.dptr, 4096));
    CHECK(memcmp(h, h + 4096, 4096) == 0);
    /* A range outside every region is still called that. */
    CHECK_STATUS(pdx_transfer_sync_write(init, st, h, rem.dptr + (1 << 20), 16), PDX_ERR_REMOTE_REJECTED);
    CHECK(strstr(pdx_last_error_message(), "is not inside one region it advertised") != NULL);
    pdx_stats after = stats_of(t);
    CHECK(after.served_device_failures == 2 && after.requests_refused == 1);
    side_free(&rem);
    pdx_engine_free(t);
  }
  CHECK_OK(pdx_set_log_callback(NULL, NULL, 0));
  free(h);
  pdx_engine_free(init);
}

/* ----------------------------------------- contexts and the right device */

static void test_contexts(const struct cuda_double_stats *start, pdx_engine *a, pdx_engine *b) {
  /* The caller's current context survives transfers on its thread (pdx
   * makes cuda:0's current for its copies and restores the caller's). */
  struct side loc, rem;
  side_init(&loc, b, 0, 1 << 20);
  side_init(&rem, a, dev_hi, 1 << 20);
  use_device(dev_hi);
  CUcontext mine = NULL, after = NULL;
  cu.get_current(&mine);
  CHECK_OK(pdx_transfer_sync_write(b, pdx_engine_session_id(a), (void *)(uintptr_t)loc.dptr, rem.dptr, 1 << 20));
  CHECK_OK(pdx_transfer_sync_read(b, pdx_engine_session_id(a), (void *)(uintptr_t)loc.dptr, rem.dptr, 4096));
  cu.get_current(&after);
  CHECK(mine != NULL && mine == after);
  side_free(&loc);
  side_free(&rem);
  if (real) return;
  struct cuda_double_stats st;
  get_stats(&st);
  CHECK(st.copies_no_context == 0);
  CHECK(st.copies_wrong_context == 0);
  CHECK(st.copies_pageable - start->copies_pageable == own_pageable);
  /* Only the devices regions live on were touched; contexts are bounded. */
  CHECK(st.contexts_retained_mask == ((1ull << 0) | (1ull << dev_hi)));
  CHECK(st.contexts_live == 2);
  CHECK(st.copies_by_device[1] == 0 && st.copies_by_device[2] == 0);
  CHECK(st.copies_by_device[0] > 0 && st.copies_by_device[dev_hi] > 0);
  printf("  copies on cuda:0 %llu, on cuda:%d %llu, wrong context 0, syncs %llu, pinned peak %llu KiB\n",
         (unsigned long long)st.copies_by_device[0], dev_hi, (unsigned long long)st.copies_by_device[dev_hi],
         (unsigned long long)st.syncs, (unsigned long long)(st.pinned_peak >> 10));
}

int main(int argc, char **argv) {
  real = argc > 1 && strcmp(argv[1], "--real") == 0;
  const char *path = real ? getenv("PDX_TEST_CUDA_REAL_LIB") : CUDA_DOUBLE_LIB;
  if (!path) path = "libcuda.so.1";
  test_no_driver();
  if (!load_driver(path)) {
    if (real) {
      printf("SKIP: test_cuda --real: no NVIDIA GPU here (%s does not load or has no device)\n", path);
      return 77; /* ctest's SKIP_RETURN_CODE */
    }
    fprintf(stderr, "cannot load the driver stand-in %s\n", path);
    return 1;
  }
  printf("test_cuda: driver %s (%s), devices cuda:0 and cuda:%d\n", path, real ? "real" : "stand-in", dev_hi);
  setenv("PDX_CUDA_LIB", path, 1);
  struct cuda_double_stats start;
  get_stats(&start);
  test_stand_in();
  pdx_engine *a = start_engine(), *b = start_engine();
  test_refusals(a);
  test_unregistered_device_locals();
  test_round_trips(a, b);
  test_pages(a, b);
  test_kv_plan(a, b);
  test_kv_wait_event(a, b);
  test_failing_copies(a, b);
  test_target_device_faults();
  test_unregister_during_transfer(a, b);
  test_contexts(&start, a, b);
  pdx_engine_free(a);
  pdx_engine_free(b);
  test_cap();
  return pdx_test_finish(real ? "test_cuda --real" : "test_cuda");
}
