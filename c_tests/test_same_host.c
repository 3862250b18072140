/* The same-host link between two processes (issue 20): this process is the
 * initiator, a forked child runs the target engine. Every size both ways and
 * 2048 scattered pages over the link; a refused request changes nothing and
 * keeps the link; a target in another pid namespace and one running as
 * another user fall back to TCP with a reason naming the cause, and their
 * transfers succeed; unregistering during same-host writes is a fence; a
 * target stopped (SIGSTOP) mid-way through a 1 GiB write fails the write
 * within 1.1 x 2 s + 1 s. Device memory (the CUDA stand-in, shared across
 * processes through its IPC): device -> device both ways is one
 * device-to-device copy in the target, host -> device and device -> host
 * too. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <grp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_double/cuda_double.h"
#include "harness.h"

/* The CUDA stand-in, loaded in both processes (PDX_CUDA_LIB points pdx at it). */
typedef int CUresult;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
static struct {
  CUresult (*init)(unsigned);
  CUresult (*retain)(CUcontext *, int);
  CUresult (*set_current)(CUcontext);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*h2d)(CUdeviceptr, const void *, size_t, void *);
  CUresult (*d2h)(void *, CUdeviceptr, size_t, void *);
  CUresult (*sync)(void *);
  cuda_double_stats_fn stats;
} cu;

static int load_cuda(void) {
  void *lib = dlopen(CUDA_DOUBLE_LIB, RTLD_NOW | RTLD_LOCAL);
  void *f[8] = {0};
  const char *names[8] = {"cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc_v2",
                          "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuStreamSynchronize", "cuda_double_stats"};
  for (int i = 0; lib && i < 8; i++)
    if (!(f[i] = dlsym(lib, names[i]))) return 0;
  if (!lib) return 0;
  memcpy(&cu.init, &f[0], sizeof f[0]);
  memcpy(&cu.retain, &f[1], sizeof f[1]);
  memcpy(&cu.set_current, &f[2], sizeof f[2]);
  memcpy(&cu.alloc, &f[3], sizeof f[3]);
  memcpy(&cu.h2d, &f[4], sizeof f[4]);
  memcpy(&cu.d2h, &f[5], sizeof f[5]);
  memcpy(&cu.sync, &f[6], sizeof f[6]);
  memcpy(&cu.stats, &f[7], sizeof f[7]);
  return cu.init(0) == 0;
}

/* `n` bytes of device memory on device `d` (its context made current). */
static CUdeviceptr dev_alloc(int d, size_t n) {
  CUcontext c = NULL;
  CUdeviceptr p = 0;
  if (cu.retain(&c, d) != 0 || cu.set_current(c) != 0 || cu.alloc(&p, n) != 0) return 0;
  return p;
}

enum where { SAME, PID_NAMESPACE, OTHER_USER };

struct target {
  pid_t pid; /* the forked child (in PID_NAMESPACE: the parent of the engine's process) */
  pid_t engine_pid; /* the engine's process as seen from here (SIGSTOP) */
  int to, from;
  char session[128];
  uint64_t addr;
  size_t len;
};

static void put_line(int fd, const char *s) {
  size_t n = strlen(s);
  if (write(fd, s, n) != (ssize_t)n) _exit(90);
}

static int get_line(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = read(fd, buf + n, 1);
    if (r <= 0) return -1;
    if (buf[n] == '\n') break;
    n++;
  }
  buf[n] = '\0';
  return 0;
}

/* The target's side: an engine with `len` bytes registered, answering
 * commands on `in` until "quit" (or the pipe closes). "fence": unregister
 * while writes are landing, then check that no byte changes afterwards. */
static int serve(size_t len, int on_device, int in, int out) {
  pdx_engine *e = NULL;
  if (pdx_engine_init("127.0.0.1", "tcp", NULL, &e) != PDX_OK) return 10;
  unsigned char *region = NULL;
  if (on_device) {
    CUdeviceptr d = load_cuda() ? dev_alloc(1, len) : 0;
    region = (unsigned char *)(uintptr_t)d;
    if (!d || pdx_register_memory_at(e, region, len, "cuda:1") != PDX_OK) return 15;
  } else {
    region = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED || pdx_register_memory(e, region, len) != PDX_OK) return 11;
  }
  char line[256];
  snprintf(line, sizeof line, "%s %llu %d\n", pdx_engine_session_id(e), (unsigned long long)(uintptr_t)region,
           (int)getpid());
  put_line(out, line);
  int rc = 0;
  while (get_line(in, line, sizeof line) == 0) {
    if (strcmp(line, "quit") == 0) break;
    if (strcmp(line, "copies") == 0) {
      struct cuda_double_stats st;
      cu.stats(&st);
      snprintf(line, sizeof line, "%llu %llu %llu\n", (unsigned long long)st.d2d_copies,
               (unsigned long long)st.h2d_copies, (unsigned long long)st.d2h_copies);
      put_line(out, line);
    }
    if (strcmp(line, "fence") == 0) {
      usleep(50 * 1000); /* writes are landing */
      int ok = pdx_unregister_memory(e, region) == PDX_OK;
      unsigned char *snap = malloc(len);
      memcpy(snap, region, len);
      usleep(300 * 1000);
      ok = ok && memcmp(snap, region, len) == 0;
      free(snap);
      put_line(out, ok ? "fenced\n" : "changed\n");
    }
  }
  pdx_engine_free(e);
  return rc;
}

static const char *self_exe;

/* Decimal digits of `v` into `buf` (async-signal-safe), with a newline. */
static size_t decimal(char *buf, long v) {
  char tmp[24];
  size_t n = 0, m = 0;
  do tmp[n++] = (char)('0' + v % 10); while ((v /= 10) > 0);
  while (n > 0) buf[m++] = tmp[--n];
  buf[m++] = '\n';
  return m;
}

/* Start a target of `len` bytes running `where`: this program again
 * (exec'd, so nothing of this process's threads is inherited), its
 * commands on stdin and its answers on stdout. */
static int start_target_on(struct target *t, enum where where, size_t len, int on_device);

static int start_target(struct target *t, enum where where, size_t len) {
  return start_target_on(t, where, len, 0);
}

static int start_target_on(struct target *t, enum where where, size_t len, int on_device) {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) return -1;
  char len_arg[24];
  len_arg[decimal(len_arg, (long)len) - 1] = '\0';
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    /* Only async-signal-safe calls until exec. */
    if (dup2(to[0], 0) < 0 || dup2(from[1], 1) < 0) _exit(12);
    close(to[1]);
    close(from[0]);
    if (where == OTHER_USER) {
      if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
    }
    if (where == PID_NAMESPACE) {
      if (unshare(CLONE_NEWPID) != 0) _exit(77);
      pid_t inner = fork(); /* pid 1 of the new namespace */
      if (inner < 0) _exit(12);
      if (inner > 0) {
        char line[24];
        if (write(1, line, decimal(line, inner)) < 0) _exit(12); /* its pid as the parent sees it */
        int st = 0;
        waitpid(inner, &st, 0);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 13);
      }
    }
    execl(self_exe, self_exe, on_device ? "--device-target" : "--target", len_arg, (char *)NULL);
    _exit(14);
  }
  close(to[0]);
  close(from[1]);
  memset(t, 0, sizeof *t);
  t->pid = t->engine_pid = pid;
  t->to = to[1];
  t->from = from[0];
  t->len = len;
  char line[256];
  if (where == PID_NAMESPACE) {
    if (get_line(t->from, line, sizeof line) != 0) return -1;
    t->engine_pid = (pid_t)atoi(line);
  }
  if (get_line(t->from, line, sizeof line) != 0) return -1;
  unsigned long long addr = 0;
  int their_pid = 0;
  if (sscanf(line, "%127s %llu %d", t->session, &addr, &their_pid) != 3) return -1;
  t->addr = addr;
  if (where == PID_NAMESPACE) CHECK(their_pid == 1); /* it sees itself as pid 1 */
  return 0;
}

static int stop_target(struct target *t) {
  put_line(t->to, "quit\n");
  close(t->to);
  int st = 0;
  waitpid(t->pid, &st, 0);
  close(t->from);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1) | 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (unsigned char)x;
  }
}

/* "path" and "reason" of `session` as pdx_peer_info says. */
static void path_of(pdx_engine *e, const char *session, char *info, size_t cap) {
  size_t n = 0;
  info[0] = '\0';
  CHECK_OK(pdx_peer_info(e, session, info, cap, &n));
}

/* Write `n` bytes of pattern `seed` to `remote` and read them back, from
 * and into buffers registered with `e` (the link copies only those). */
static int round_trip(pdx_engine *e, const char *session, uint64_t remote, size_t n, unsigned seed) {
  unsigned char *src = malloc(n), *back = calloc(1, n);
  fill(src, n, seed);
  CHECK_OK(pdx_register_memory(e, src, n));
  CHECK_OK(pdx_register_memory(e, back, n));
  int ok = pdx_transfer_sync_write(e, session, src, remote, n) == PDX_OK &&
           pdx_transfer_sync_read(e, session, back, remote, n) == PDX_OK && memcmp(src, back, n) == 0;
  CHECK_OK(pdx_unregister_memory(e, src));
  CHECK_OK(pdx_unregister_memory(e, back));
  free(src);
  free(back);
  return ok;
}

static void every_size_and_scattered_pages(pdx_engine *a) {
  struct target t;
  size_t sizes[] = {1, 4097, (8u << 20) + 3, 256u << 20};
  CHECK(start_target(&t, SAME, (256u << 20) + 4096) == 0);
  uint64_t moved = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    CHECK(round_trip(a, t.session, t.addr + (i % 2), sizes[i], (unsigned)i));
    moved += sizes[i];
  }
  char info[4096];
  path_of(a, t.session, info, sizeof info);
  CHECK(strstr(info, "\"path\":\"same-host\"") != NULL);
  pdx_stats s = {.size = sizeof s};
  CHECK_OK(pdx_engine_stats(a, &s));
  CHECK(s.same_host_bytes_written == moved && s.same_host_bytes_read == moved);

  /* 2048 scattered 4 KiB pages: page i to slot (i * 613) % 2048. */
  enum { PAGES = 2048, PAGE = 4096 };
  unsigned char *src = malloc(PAGES * PAGE), *back = calloc(PAGES, PAGE);
  fill(src, PAGES * PAGE, 99);
  CHECK_OK(pdx_register_memory(a, src, (size_t)PAGES * PAGE));
  CHECK_OK(pdx_register_memory(a, back, (size_t)PAGES * PAGE));
  void *locals[PAGES];
  uint64_t remotes[PAGES];
  size_t lens[PAGES];
  for (int i = 0; i < PAGES; i++) {
    locals[i] = src + (size_t)i * PAGE;
    remotes[i] = t.addr + (uint64_t)((i * 613) % PAGES) * PAGE;
    lens[i] = PAGE;
  }
  CHECK_OK(pdx_batch_transfer_sync_write(a, t.session, locals, remotes, lens, PAGES));
  for (int i = 0; i < PAGES; i++) locals[i] = back + (size_t)i * PAGE;
  CHECK_OK(pdx_batch_transfer_sync_read(a, t.session, locals, remotes, lens, PAGES));
  CHECK(memcmp(src, back, (size_t)PAGES * PAGE) == 0);

  /* Out of range: refused as over TCP, nothing changed, still same-host. */
  unsigned char before[PAGE], after[PAGE];
  CHECK_OK(pdx_transfer_sync_read(a, t.session, before, t.addr + t.len - PAGE, PAGE));
  CHECK_STATUS(pdx_transfer_sync_write(a, t.session, src, t.addr + t.len - PAGE, 2 * PAGE), PDX_ERR_REMOTE_REJECTED);
  CHECK_OK(pdx_transfer_sync_read(a, t.session, after, t.addr + t.len - PAGE, PAGE));
  CHECK(memcmp(before, after, PAGE) == 0);
  CHECK(round_trip(a, t.session, t.addr, 100, 5));
  path_of(a, t.session, info, sizeof info);
  CHECK(strstr(info, "\"path\":\"same-host\"") != NULL);
  CHECK_OK(pdx_unregister_memory(a, src));
  CHECK_OK(pdx_unregister_memory(a, back));
  free(src);
  free(back);
  CHECK(stop_target(&t) == 0);
}

/* A target that the link cannot reach: TCP, with `cause` in the reason. */
static void falls_back(pdx_engine *a, enum where where, const char *cause) {
  struct target t;
  if (start_target(&t, where, 1 << 20) != 0) {
    int st = 0;
    waitpid(t.pid, &st, 0);
    printf("SKIP %s: cannot start such a target here (exit %d)\n", cause, WEXITSTATUS(st));
    return;
  }
  CHECK(round_trip(a, t.session, t.addr, 1 << 20, 3));
  char info[4096];
  path_of(a, t.session, info, sizeof info);
  CHECK(strstr(info, "\"path\":\"tcp\"") != NULL);
  CHECK(strstr(info, cause) != NULL);
  if (strstr(info, cause) == NULL) fprintf(stderr, "peer info: %s\n", info);
  CHECK(stop_target(&t) == 0);
}

struct writer {
  pdx_engine *e;
  const char *session;
  uint64_t remote;
  size_t len;
  unsigned char *src;
  int rounds;
  pdx_status last;
};

static void *keep_writing(void *arg) {
  struct writer *w = arg;
  w->last = PDX_OK;
  for (w->rounds = 0; w->rounds < 100000 && w->last == PDX_OK; w->rounds++)
    w->last = pdx_transfer_sync_write(w->e, w->session, w->src, w->remote, w->len);
  return NULL;
}

static void unregister_is_a_fence(pdx_engine *a) {
  struct target t;
  size_t len = 64u << 20;
  CHECK(start_target(&t, SAME, len) == 0);
  CHECK(round_trip(a, t.session, t.addr, 4096, 1));
  struct writer w = {a, t.session, t.addr, len, malloc(len), 0, PDX_OK};
  fill(w.src, len, 8);
  CHECK_OK(pdx_register_memory(a, w.src, len)); /* on the link, not TCP */
  pthread_t th;
  CHECK(pthread_create(&th, NULL, keep_writing, &w) == 0);
  put_line(t.to, "fence\n");
  char line[64];
  CHECK(get_line(t.from, line, sizeof line) == 0);
  CHECK(strcmp(line, "fenced") == 0);
  pthread_join(th, NULL);
  CHECK(w.last == PDX_ERR_REMOTE_REJECTED || w.last == PDX_ERR_CONNECTION_LOST);
  CHECK_OK(pdx_unregister_memory(a, w.src));
  free(w.src);
  CHECK(stop_target(&t) == 0);
}

static void a_stopped_target_fails_within_the_bound(pdx_engine *a) {
  struct target t;
  size_t len = 1u << 30;
  CHECK(start_target(&t, SAME, len) == 0);
  CHECK(round_trip(a, t.session, t.addr, 4096, 1));
  /* Zero pages: the source costs no memory, the copies are real. */
  unsigned char *src = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  CHECK(src != MAP_FAILED);
  uint64_t batch = 0;
  void *locals[1] = {src};
  uint64_t remotes[1] = {t.addr};
  size_t lens[1] = {len};
  CHECK_OK(pdx_batch_submit(a, t.session, PDX_OPCODE_WRITE, locals, remotes, lens, 1, NULL, NULL, &batch));
  usleep(20 * 1000);
  CHECK(kill(t.engine_pid, SIGSTOP) == 0);
  double start = now_s();
  int32_t state = PDX_TASK_PENDING;
  while (state == PDX_TASK_PENDING && now_s() - start < 30) {
    pdx_status w = pdx_batch_wait(a, batch, 100, &state);
    if (w != PDX_OK && w != PDX_ERR_TIMEOUT) break;
  }
  double took = now_s() - start;
  if (state == PDX_TASK_COMPLETED) {
    printf("NOTE: the 1 GiB write completed within 20 ms, before SIGSTOP; no bound to check\n");
  } else {
    CHECK(state == PDX_TASK_FAILED);
    CHECK(took <= 1.1 * 2.0 + 1.0);
    printf("stopped target: the write failed %.2f s after SIGSTOP (bound %.1f s)\n", took, 1.1 * 2.0 + 1.0);
  }
  CHECK_OK(pdx_batch_free(a, batch));
  kill(t.engine_pid, SIGCONT);
  munmap(src, len);
  CHECK(stop_target(&t) == 0);
}

/* The target's device-to-device, host-to-device and device-to-host copies. */
static void target_copies(struct target *t, unsigned long long out[3]) {
  char line[128];
  put_line(t->to, "copies\n");
  CHECK(get_line(t->from, line, sizeof line) == 0);
  CHECK(sscanf(line, "%llu %llu %llu", &out[0], &out[1], &out[2]) == 3);
}

static void device_memory_both_ways(pdx_engine *a) {
  struct target t;
  size_t len = (8u << 20) + 4096;
  if (!load_cuda() || start_target_on(&t, SAME, len, 1) != 0) {
    printf("SKIP device memory: the CUDA stand-in did not load\n");
    return;
  }
  CUdeviceptr mine = dev_alloc(0, len), back = dev_alloc(0, len);
  CHECK(mine != 0 && back != 0);
  /* Local device memory must be registered on the initiator's engine too. */
  CHECK_OK(pdx_register_memory_at(a, (void *)(uintptr_t)mine, len, "cuda:0"));
  CHECK_OK(pdx_register_memory_at(a, (void *)(uintptr_t)back, len, "cuda:0"));
  unsigned char *src = malloc(len), *got = malloc(len);
  CHECK_OK(pdx_register_memory(a, src, len));
  CHECK_OK(pdx_register_memory(a, got, len));
  size_t sizes[] = {1, 4097, (8u << 20) + 3};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    fill(src, n, 40 + (unsigned)i);
    CHECK(cu.h2d(mine, src, n, NULL) == 0 && cu.sync(NULL) == 0);
    unsigned long long before[3], after[3];
    target_copies(&t, before);
    /* Device -> device, then back into another device buffer. */
    CHECK_OK(pdx_transfer_sync_write(a, t.session, (void *)(uintptr_t)mine, t.addr + 1, n));
    CHECK_OK(pdx_transfer_sync_read(a, t.session, (void *)(uintptr_t)back, t.addr + 1, n));
    target_copies(&t, after);
    CHECK(after[0] - before[0] >= 2 && after[1] == before[1] && after[2] == before[2]);
    memset(got, 0, n);
    CHECK(cu.d2h(got, back, n, NULL) == 0 && cu.sync(NULL) == 0);
    CHECK(memcmp(src, got, n) == 0);
    /* Host -> device and device -> host. */
    fill(src, n, 60 + (unsigned)i);
    CHECK_OK(pdx_transfer_sync_write(a, t.session, src, t.addr, n));
    memset(got, 0, n);
    CHECK_OK(pdx_transfer_sync_read(a, t.session, got, t.addr, n));
    CHECK(memcmp(src, got, n) == 0);
  }
  char info[4096];
  path_of(a, t.session, info, sizeof info);
  CHECK(strstr(info, "\"path\":\"same-host\"") != NULL && strstr(info, "CUDA IPC") != NULL);
  if (strstr(info, "CUDA IPC") == NULL) fprintf(stderr, "peer info: %s\n", info);
  CHECK_OK(pdx_unregister_memory(a, src));
  CHECK_OK(pdx_unregister_memory(a, got));
  free(src);
  free(got);
  CHECK(stop_target(&t) == 0);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--target") == 0) return serve((size_t)atoll(argv[2]), 0, 0, 1);
  if (argc == 3 && strcmp(argv[1], "--device-target") == 0) return serve((size_t)atoll(argv[2]), 1, 0, 1);
  /* Resolved here: after setuid the child may not read /proc/self. */
  static char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return 1;
  exe[n] = '\0';
  self_exe = exe;
  /* Every deadline at 2 s, for the stopped target (read when engines start). */
  const char *vars[] = {"PDX_STATUS_TIMEOUT_MS", "PDX_PROGRESS_TIMEOUT_MS", "PDX_LANE_WAIT_TIMEOUT_MS",
                        "PDX_HANDSHAKE_TIMEOUT_MS", "PDX_CONNECT_TIMEOUT_MS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) setenv(vars[i], "2000", 1);
  unsetenv("PDX_SAME_HOST");
  setenv("PDX_CUDA_LIB", CUDA_DOUBLE_LIB, 1);
  pdx_engine *a = start_engine();
  every_size_and_scattered_pages(a);
  falls_back(a, PID_NAMESPACE, "pid namespace");
  if (geteuid() == 0) {
    falls_back(a, OTHER_USER, "uid 65534");
  } else {
    printf("SKIP another user: needs root to start a target as another user\n");
  }
  unregister_is_a_fence(a);
  device_memory_both_ways(a);
  a_stopped_target_fails_within_the_bound(a);
  pdx_engine_free(a);
  return pdx_test_finish("test_same_host");
}
