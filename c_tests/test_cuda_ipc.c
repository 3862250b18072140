/* CUDA IPC in the driver stand-in (c_tests/cuda_double), across two real
 * processes: the exporter (this program) allocates device memory and hands
 * its cuIpcGetMemHandle to an importer (this program again, exec'd with
 * --importer), which opens it and copies device to device both ways while
 * the exporter checks what landed. Shows: bytes copied across processes
 * arrive at the synchronize and not before, the imported range is device
 * memory the CPU cannot touch, reopen and close count, and every misuse is
 * refused with the driver's code. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_double/cuda_double.h"
#include "harness.h"

typedef int CUresult;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct {
  char reserved[64];
} CUipcMemHandle;

enum {
  INVALID_VALUE = 1,
  INVALID_CONTEXT = 201,
  INVALID_HANDLE = 400,
  NOT_FOUND = 500,
};

static struct {
  CUresult (*init)(unsigned);
  CUresult (*retain)(CUcontext *, int);
  CUresult (*set_current)(CUcontext);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*free)(CUdeviceptr);
  CUresult (*host_alloc)(void **, size_t, unsigned);
  CUresult (*free_host)(void *);
  CUresult (*h2d)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*d2h)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*d2d)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*stream_create)(CUstream *, unsigned);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*sync)(CUstream);
  CUresult (*pointer_attribute)(void *, int, CUdeviceptr);
  CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr);
  CUresult (*ipc_get)(CUipcMemHandle *, CUdeviceptr);
  CUresult (*ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned);
  CUresult (*ipc_close)(CUdeviceptr);
  cuda_double_stats_fn stats;
} cu;

#define LOAD(field, name)                                  \
  do {                                                     \
    void *p_ = dlsym(lib, name);                           \
    if (!p_) {                                             \
      fprintf(stderr, "the stand-in lacks %s\n", name);    \
      exit(1);                                             \
    }                                                      \
    memcpy(&cu.field, &p_, sizeof cu.field);               \
  } while (0)

static void load(void) {
  void *lib = dlopen(CUDA_DOUBLE_LIB, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "cannot load %s: %s\n", CUDA_DOUBLE_LIB, dlerror());
    exit(1);
  }
  LOAD(init, "cuInit");
  LOAD(retain, "cuDevicePrimaryCtxRetain");
  LOAD(set_current, "cuCtxSetCurrent");
  LOAD(alloc, "cuMemAlloc_v2");
  LOAD(free, "cuMemFree_v2");
  LOAD(host_alloc, "cuMemHostAlloc");
  LOAD(free_host, "cuMemFreeHost");
  LOAD(h2d, "cuMemcpyHtoDAsync_v2");
  LOAD(d2h, "cuMemcpyDtoHAsync_v2");
  LOAD(d2d, "cuMemcpyDtoDAsync_v2");
  LOAD(stream_create, "cuStreamCreate");
  LOAD(stream_destroy, "cuStreamDestroy_v2");
  LOAD(sync, "cuStreamSynchronize");
  LOAD(pointer_attribute, "cuPointerGetAttribute");
  LOAD(range, "cuMemGetAddressRange_v2");
  LOAD(ipc_get, "cuIpcGetMemHandle");
  LOAD(ipc_open, "cuIpcOpenMemHandle_v2");
  LOAD(ipc_close, "cuIpcCloseMemHandle");
  LOAD(stats, "cuda_double_stats");
  if (cu.init(0) != 0) exit(1);
}

static CUcontext context(int device) {
  CUcontext c = NULL;
  if (cu.retain(&c, device) != 0) exit(1);
  return c;
}

/* Byte i of pattern `seed`. */
static unsigned char pat(unsigned seed, size_t i) { return (unsigned char)(seed * 131u + i * 7u + (i >> 9)); }

static int is_pattern(const unsigned char *p, size_t n, unsigned seed, size_t from) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pat(seed, from + i)) return 0;
  return 1;
}

static void fill(unsigned char *p, size_t n, unsigned seed, size_t from) {
  for (size_t i = 0; i < n; i++) p[i] = pat(seed, from + i);
}

/* An odd length: the last page is partly used. */
#define LEN ((size_t)(1 << 20) + 333)
#define OFF ((size_t)4093)
#define PART ((size_t)70001)

static void to_hex(const void *p, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", ((const unsigned char *)p)[i]);
}

static int from_hex(const char *s, void *p, size_t n) {
  if (strlen(s) != 2 * n) return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return 0;
    ((unsigned char *)p)[i] = (unsigned char)v;
  }
  return 1;
}

static void say(int fd, char c) { CHECK(write(fd, &c, 1) == 1); }

static char hear(int fd) {
  char c = 0;
  return read(fd, &c, 1) == 1 ? c : 0;
}

/* 1 if a CPU read of `p` faults (in a child process). */
static int cpu_read_faults(CUdeviceptr p) {
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2); /* the expected fault is reported on stderr */
    volatile unsigned char *bad = (volatile unsigned char *)(uintptr_t)p;
    _exit(bad[0] == 0x42 ? 0 : 0); /* never reached */
  }
  int status = 0;
  if (child <= 0 || waitpid(child, &status, 0) != child) return 0;
  return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
}

/* ------------------------------------------------------------ importer */

static int importer(const char *hex, int in, int out) {
  struct cuda_double_ipc_handle raw;
  CUipcMemHandle h, bad;
  CHECK(from_hex(hex, &h, sizeof h));
  memcpy(&raw, &h, sizeof raw);
  CHECK(memcmp(raw.magic, CUDA_DOUBLE_IPC_MAGIC, 8) == 0 && raw.pid == (uint32_t)getppid());
  CHECK(raw.len == LEN && raw.device == 0);

  CUdeviceptr p = 0, again = 0;
  CHECK(cu.ipc_open(&p, h, 1) == INVALID_CONTEXT); /* no context yet */
  CHECK(cu.set_current(context(1)) == 0);          /* another device than the exporter's */
  CHECK(cu.ipc_open(&p, h, 2) == INVALID_VALUE);   /* unknown flag */
  CHECK(cu.ipc_open(NULL, h, 1) == INVALID_VALUE);
  memcpy(&bad, &h, sizeof bad);
  bad.reserved[0] ^= 1;
  CHECK(cu.ipc_open(&p, bad, 1) == INVALID_VALUE); /* not a handle */
  memset(&bad, 0, sizeof bad);
  CHECK(cu.ipc_open(&p, bad, 1) == INVALID_VALUE);
  memcpy(&raw, &h, sizeof raw);
  raw.ino ^= 0x5a5a;
  memcpy(&bad, &raw, sizeof bad);
  CHECK(cu.ipc_open(&p, bad, 1) == INVALID_HANDLE); /* names another file */
  memcpy(&raw, &h, sizeof raw);
  raw.fd = 1000;
  memcpy(&bad, &raw, sizeof bad);
  CHECK(cu.ipc_open(&p, bad, 1) == INVALID_HANDLE); /* no such fd */
  CHECK(p == 0);

  CHECK(cu.ipc_open(&p, h, 1) == 0 && p != 0);
  CHECK(cu.ipc_open(&again, h, 0) == 0 && again == p); /* reopened: same address, one more open */
  struct cuda_double_stats st;
  cu.stats(&st);
  CHECK(st.ipc_opens == 2 && st.ipc_mapped == 1 && st.device_bytes == 0);
  unsigned type = 0;
  int ordinal = -1;
  CHECK(cu.pointer_attribute(&type, 2, p + 17) == 0 && type == 2 /* DEVICE */);
  CHECK(cu.pointer_attribute(&ordinal, 9, p) == 0 && ordinal == 1);
  /* Another device's context gets a mapping of its own. */
  CUdeviceptr on2 = 0;
  CHECK(cu.set_current(context(2)) == 0);
  CHECK(cu.ipc_open(&on2, h, 1) == 0 && on2 != 0 && on2 != p);
  CHECK(cu.pointer_attribute(&ordinal, 9, on2) == 0 && ordinal == 2);
  CHECK(cu.ipc_close(on2) == 0);
  CHECK(cu.set_current(context(1)) == 0);
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK(cu.range(&base, &size, p + LEN - 1) == 0 && base == p && size == LEN);
  CHECK(cu.range(&base, &size, p + LEN + 4096) == NOT_FOUND);
  CHECK(cu.ipc_get(&bad, p) == INVALID_VALUE); /* memory of another process is not exported again */
  CHECK(cu.free(p) == INVALID_VALUE);          /* it is closed, not freed */
  CHECK(cpu_read_faults(p));
  CHECK(cpu_read_faults(p + LEN - 1));

  /* Read the exporter's bytes: device to device into memory of our own. */
  CUdeviceptr mine = 0;
  CHECK(cu.alloc(&mine, LEN) == 0);
  CUstream s1 = NULL, s2 = NULL;
  CHECK(cu.stream_create(&s1, 1) == 0 && cu.stream_create(&s2, 1) == 0);
  unsigned char *host = NULL;
  CHECK(cu.host_alloc((void **)&host, LEN, 0) == 0 && host != NULL);
  if (!host) return 1;
  CHECK(cu.d2d(mine, p, LEN, s1) == 0);
  CHECK(cu.d2h(host, mine, LEN, s2) == 0 && cu.sync(s2) == 0);
  CHECK(!is_pattern(host, LEN, 1, 0)); /* s1 not synchronized yet: the copy has not landed */
  CHECK(host[0] == 0xA5 && host[LEN - 1] == 0xA5);
  CHECK(cu.sync(s1) == 0);
  CHECK(cu.d2h(host, mine, LEN, s2) == 0 && cu.sync(s2) == 0);
  CHECK(is_pattern(host, LEN, 1, 0));

  /* Write into the exporter's memory: lands at our synchronize, not before. */
  fill(host, LEN, 2, 0);
  CHECK(cu.h2d(mine, host, LEN, s2) == 0 && cu.sync(s2) == 0);
  CHECK(cu.d2d(p + OFF, mine + OFF, PART, s1) == 0);
  say(out, 'w'); /* exporter: look now (the copy is queued, not synchronized) */
  CHECK(hear(in) == 'k');
  CHECK(cu.sync(s1) == 0);
  say(out, 's'); /* exporter: look again */
  CHECK(hear(in) == 'k');

  /* Refusals of the copy itself. */
  CHECK(cu.d2d(p + LEN - 1, mine, 2, s1) == INVALID_VALUE); /* past the end of the import */
  CHECK(cu.d2d(p, (CUdeviceptr)(uintptr_t)host, 16, s1) == INVALID_VALUE); /* host memory */
  CHECK(cu.set_current(NULL) == 0);
  CHECK(cu.d2d(mine, p, 16, s1) == INVALID_CONTEXT);
  CHECK(cu.ipc_close(p) == INVALID_CONTEXT); /* closing needs a context too */
  CHECK(cu.set_current(context(1)) == 0);
  CHECK(cu.d2d(mine, p, 16, NULL) == 0 && cu.sync(NULL) == 0); /* the default stream works too */

  /* Close: one per open; the last unmaps. */
  CHECK(cu.ipc_close(p) == 0);
  CHECK(cu.ipc_close(mine) == INVALID_VALUE); /* not opened from a handle */
  cu.stats(&st);
  CHECK(st.ipc_mapped == 1 && st.ipc_closes == 2);
  CHECK(cu.ipc_close(p) == 0);
  CHECK(cu.ipc_close(p) == INVALID_VALUE);
  cu.stats(&st);
  CHECK(st.ipc_mapped == 0 && st.ipc_opens == 3 && st.ipc_closes == 3 && st.d2d_copies == 3);
  CHECK(cu.range(&base, &size, p) == NOT_FOUND);

  /* Once the exporter freed the allocation, its handle opens nothing. */
  say(out, 'f');
  CHECK(hear(in) == 'k');
  CHECK(cu.ipc_open(&p, h, 1) == INVALID_HANDLE);

  CHECK(cu.stream_destroy(s1) == 0 && cu.stream_destroy(s2) == 0);
  CHECK(cu.free_host(host) == 0 && cu.free(mine) == 0);
  return pdx_test_finish("test_cuda_ipc (importer)");
}

/* ------------------------------------------------------------ exporter */

static void exporter(const char *self) {
  CHECK(cu.set_current(context(0)) == 0);
  CUdeviceptr d = 0, other = 0;
  CHECK(cu.alloc(&d, LEN) == 0 && cu.alloc(&other, 64) == 0);
  unsigned char *host = NULL;
  CHECK(cu.host_alloc((void **)&host, LEN, 0) == 0 && host != NULL);
  if (!host) return;
  fill(host, LEN, 1, 0);
  CHECK(cu.h2d(d, host, LEN, NULL) == 0 && cu.sync(NULL) == 0);

  /* Within one process: the allocation's range; handles only for its base. */
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK(cu.range(&base, &size, d + 12345) == 0 && base == d && size == LEN);
  CHECK(cu.range(NULL, &size, d) == 0 && cu.range(&base, NULL, d) == 0);
  CHECK(cu.range(&base, &size, (CUdeviceptr)(uintptr_t)host) == NOT_FOUND);
  CUipcMemHandle h;
  CHECK(cu.ipc_get(&h, d + 1) == INVALID_VALUE);
  CHECK(cu.ipc_get(&h, (CUdeviceptr)(uintptr_t)host) == INVALID_VALUE);
  CHECK(cu.ipc_get(NULL, d) == INVALID_VALUE);
  CHECK(cu.ipc_get(&h, d) == 0);
  CUdeviceptr opened = 0;
  CHECK(cu.ipc_open(&opened, h, 1) == INVALID_CONTEXT); /* as the driver: not in the exporting process */
  CHECK(opened == 0);
  CHECK(cu.ipc_close(d) == INVALID_VALUE);
  /* Device to device within the process, queued like the other copies. */
  CHECK(cu.d2d(other, d + 100, 64, NULL) == 0 && cu.sync(NULL) == 0);
  unsigned char small[64];
  CHECK(cu.d2h(small, other, 64, NULL) == 0 && cu.sync(NULL) == 0);
  CHECK(is_pattern(small, 64, 1, 100));

  char hex[2 * sizeof h + 1];
  to_hex(&h, sizeof h, hex);
  int to_child[2], from_child[2];
  CHECK(pipe(to_child) == 0 && pipe(from_child) == 0);
  char in[16], out[16];
  snprintf(in, sizeof in, "%d", to_child[0]);
  snprintf(out, sizeof out, "%d", from_child[1]);
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) {
    close(to_child[1]);
    close(from_child[0]);
    execl("/proc/self/exe", self, "--importer", hex, in, out, (char *)NULL);
    _exit(127);
  }
  CHECK(child > 0);
  close(to_child[0]);
  close(from_child[1]);
  for (;;) {
    char c = hear(from_child[0]);
    if (c == 0) break;
    if (c == 'w' || c == 's') {
      CHECK(cu.d2h(host, d, LEN, NULL) == 0 && cu.sync(NULL) == 0);
      if (c == 'w') {
        CHECK(is_pattern(host, LEN, 1, 0)); /* the importer did not synchronize: nothing landed */
      } else {
        CHECK(is_pattern(host, OFF, 1, 0));
        CHECK(is_pattern(host + OFF, PART, 2, OFF)); /* its bytes, exactly where it wrote them */
        CHECK(is_pattern(host + OFF + PART, LEN - OFF - PART, 1, OFF + PART));
      }
    } else if (c == 'f') {
      CHECK(cu.free(d) == 0);
    }
    say(to_child[1], 'k');
  }
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  struct cuda_double_stats st;
  cu.stats(&st);
  CHECK(st.ipc_exports == 1 && st.ipc_opens == 0 && st.ipc_mapped == 0 && st.d2d_copies == 1);
  CHECK(cu.free(other) == 0 && cu.free_host(host) == 0);
}

int main(int argc, char **argv) {
  load();
  if (argc == 5 && strcmp(argv[1], "--importer") == 0) return importer(argv[2], atoi(argv[3]), atoi(argv[4]));
  exporter(argv[0]);
  return pdx_test_finish("test_cuda_ipc");
}
