/* Peer lifecycle across processes (issue #16):
 * 1. A peer restarts under its old session name with a new data port while
 *    another process's engine takes its old data port and registers the same
 *    address: writes to the session land in the restarted peer, never in the
 *    other process.
 * 2. A long-lived engine that talks to many short-lived peers (each in turn:
 *    init, one write each way, free) holds no more peers, descriptors, fds,
 *    threads or memory a few seconds after the last than near the start, and
 *    no transfer fails. PDX_LIFETIMES sets how many (default 2000). */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#if defined(__SANITIZE_ADDRESS__)
/* ASan's quarantine would hold freed memory and hide what pdx returns. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=1"; }
#endif

/* Same virtual address in parent and forked child. */
static unsigned char pool[4096];

static uint64_t addr_of(const void *p) { return (uint64_t)(uintptr_t)p; }

/* A loopback port nothing listens on now (bound, read, closed). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    perror("free_port");
    exit(1);
  }
  close(fd);
  return ntohs(a.sin_port);
}

/* An engine whose handshake port is `rpc` and data port `data` (0: any). */
static pdx_engine *engine_on(int rpc, int data) {
  pdx_engine_options *o = NULL;
  char v[16];
  CHECK_OK(pdx_engine_options_new(&o));
  if (rpc) {
    snprintf(v, sizeof v, "%d", rpc);
    CHECK_OK(pdx_engine_options_set(o, "min_port", v));
    CHECK_OK(pdx_engine_options_set(o, "max_port", v));
  }
  if (data) {
    snprintf(v, sizeof v, "%d", data);
    CHECK_OK(pdx_engine_options_set(o, "min_data_port", v));
    CHECK_OK(pdx_engine_options_set(o, "max_data_port", v));
  }
  pdx_engine *e = NULL;
  CHECK_OK(pdx_engine_init_with("127.0.0.1", "tcp", NULL, o, &e));
  pdx_engine_options_free(o);
  if (e == NULL) {
    fprintf(stderr, "cannot start an engine: %s\n", pdx_last_error_message());
    exit(1);
  }
  return e;
}

static pdx_stats stats_of(pdx_engine *e) {
  pdx_stats st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  CHECK_OK(pdx_engine_stats(e, &st));
  return st;
}

/* served_writes of `e` once it reaches `n` (a target counts a write just
 * after acknowledging it), or what it is after 2 s. */
static uint64_t served_writes_reaching(pdx_engine *e, uint64_t n) {
  double until = now_s() + 2.0;
  uint64_t got = stats_of(e).served_writes;
  while (got < n && now_s() < until) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
    got = stats_of(e).served_writes;
  }
  return got;
}

static void put(int fd, const void *p, size_t n) {
  if (write(fd, p, n) != (ssize_t)n) {
    perror("pipe write");
    exit(1);
  }
}

static void get(int fd, void *p, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = read(fd, (char *)p + done, n - done);
    if (r <= 0) {
      fprintf(stderr, "pipe read: %s\n", r == 0 ? "closed" : "error");
      exit(1);
    }
    done += (size_t)r;
  }
}

static size_t count_bytes(const unsigned char *p, size_t n, unsigned char v) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += p[i] == v;
  return c;
}

/* ---- 1. a reused data port ---- */

struct other_report {
  uint64_t served_writes;
  uint64_t bytes_b2;
};

/* The other process: on a byte from `cmd`, start an engine on data port
 * `data`, register `pool`, say so; on the next byte, report and exit. */
static void other_process(int cmd, int reply, int data) {
  unsigned char go;
  get(cmd, &go, 1);
  memset(pool, 0, sizeof pool);
  pdx_engine *c = engine_on(0, data);
  CHECK_OK(pdx_register_memory(c, pool, sizeof pool));
  put(reply, "r", 1);
  get(cmd, &go, 1);
  struct other_report r = {stats_of(c).served_writes, count_bytes(pool, sizeof pool, 0xB2)};
  put(reply, &r, sizeof r);
  pdx_engine_free(c);
  _exit(pdx_failures == 0 ? 0 : 1);
}

static void test_reused_data_port(void) {
  int rpc = free_port(), data = free_port(), data2 = free_port();
  int to_child[2], from_child[2];
  CHECK(pipe(to_child) == 0 && pipe(from_child) == 0);
  pid_t child = fork(); /* before any engine: `pool` has one address in both */
  if (child == 0) other_process(to_child[0], from_child[1], data);

  pdx_engine *b = start_engine();
  pdx_engine *a1 = engine_on(rpc, data);
  CHECK_OK(pdx_register_memory(a1, pool, sizeof pool));
  char session[64];
  snprintf(session, sizeof session, "%s", pdx_engine_session_id(a1));
  unsigned char src[64];
  memset(src, 0xA1, sizeof src);
  CHECK_OK(pdx_transfer_sync_write(b, session, src, addr_of(pool), sizeof src));
  pdx_engine_free(a1);

  put(to_child[1], "s", 1); /* C takes A1's data port */
  unsigned char ready;
  get(from_child[0], &ready, 1);
  memset(pool, 0, sizeof pool);
  pdx_engine *a2 = engine_on(rpc, data2); /* A restarts under its old name */
  CHECK_OK(pdx_register_memory(a2, pool, sizeof pool));
  CHECK_STR(pdx_engine_session_id(a2), session);

  memset(src, 0xB2, sizeof src);
  for (uint64_t round = 1; round <= 3; round++) {
    CHECK_OK(pdx_transfer_sync_write(b, session, src, addr_of(pool), sizeof src));
    CHECK(served_writes_reaching(a2, round) == round);
  }
  CHECK(count_bytes(pool, sizeof pool, 0xB2) == sizeof src);
  put(to_child[1], "q", 1);
  struct other_report r;
  get(from_child[0], &r, sizeof r);
  printf("after A's restart: A2 served %llu writes; the process on A1's old data port served %llu and holds %llu "
         "of B's bytes\n",
         (unsigned long long)stats_of(a2).served_writes, (unsigned long long)r.served_writes,
         (unsigned long long)r.bytes_b2);
  CHECK(r.served_writes == 0);
  CHECK(r.bytes_b2 == 0);
  int wstatus = 0;
  CHECK(waitpid(child, &wstatus, 0) == child && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  pdx_engine_free(a2);
  pdx_engine_free(b);
}

/* ---- 2. many short-lived peers ---- */

static long count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  long n = 0;
  if (d == NULL) return -1;
  while (readdir(d) != NULL) n++;
  closedir(d);
  return n - 3; /* ".", ".." and the directory's own fd */
}

static long status_field(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  size_t k = strlen(key);
  if (f == NULL) return -1;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, key, k) == 0 && line[k] == ':') {
      v = strtol(line + k + 1, NULL, 10);
      break;
    }
  }
  fclose(f);
  return v;
}

struct usage {
  long fds, threads, rss_kib;
  uint64_t peers;
};

static struct usage usage_of(pdx_engine *b) {
  struct usage u = {count_fds(), status_field("Threads"), status_field("VmRSS"), stats_of(b).peers_connected};
  return u;
}

/* Whether `u` is back within the bounds the test allows over `start`. */
static int settled_since(struct usage u, struct usage start) {
  return u.peers <= 64 && u.fds <= start.fds + 64 && u.threads <= start.threads + 64 &&
         u.rss_kib <= start.rss_kib + 64 * 1024;
}

static void print_usage(const char *when, struct usage u) {
  printf("%s: peers_connected %llu, fds %ld, threads %ld, RSS %ld MiB\n", when, (unsigned long long)u.peers, u.fds,
         u.threads, u.rss_kib / 1024);
}

/* The short-lived peers, one after another in this process: each starts,
 * registers `pool`, sends its session name, writes to B once B has written
 * to it, and stops. Reports how many of its writes failed. */
static void peers_process(int cmd, int reply, long lifetimes) {
  char b_session[64];
  get(cmd, b_session, sizeof b_session);
  b_session[sizeof b_session - 1] = 0;
  uint64_t failed = 0;
  unsigned char src[64];
  memset(src, 0x5A, sizeof src);
  for (long i = 0; i < lifetimes; i++) {
    pdx_engine *e = start_engine();
    CHECK_OK(pdx_register_memory(e, pool, sizeof pool));
    char name[64];
    memset(name, 0, sizeof name);
    snprintf(name, sizeof name, "%s", pdx_engine_session_id(e));
    put(reply, name, sizeof name);
    unsigned char done;
    get(cmd, &done, 1); /* B has written to us */
    if (pdx_transfer_sync_write(e, b_session, src, addr_of(pool), sizeof src) != PDX_OK) {
      failed++;
      fprintf(stderr, "peer %ld: write to B failed: %s\n", i, pdx_last_error_message());
    }
    pdx_engine_free(e);
  }
  put(reply, &failed, sizeof failed);
  _exit(0);
}

static void test_many_short_lived_peers(void) {
  const char *env = getenv("PDX_LIFETIMES");
  long lifetimes = env != NULL ? strtol(env, NULL, 10) : 2000;
  if (lifetimes < 100) lifetimes = 100;
  int to_child[2], from_child[2];
  CHECK(pipe(to_child) == 0 && pipe(from_child) == 0);
  pid_t child = fork(); /* before B's threads exist */
  if (child == 0) peers_process(to_child[0], from_child[1], lifetimes);
  pdx_engine *b = start_engine();
  CHECK_OK(pdx_register_memory(b, pool, sizeof pool));
  char b_session[64];
  memset(b_session, 0, sizeof b_session);
  snprintf(b_session, sizeof b_session, "%s", pdx_engine_session_id(b));
  put(to_child[1], b_session, sizeof b_session);

  unsigned char src[64];
  memset(src, 0xC3, sizeof src);
  uint64_t failed = 0;
  struct usage start = usage_of(b);
  double t0 = now_s();
  for (long i = 0; i < lifetimes; i++) {
    char name[64];
    get(from_child[0], name, sizeof name);
    name[sizeof name - 1] = 0;
    pdx_status s = pdx_transfer_sync_write(b, name, src, addr_of(pool), sizeof src);
    if (s != PDX_OK) {
      failed++;
      fprintf(stderr, "lifetime %ld: write to %s failed: %s\n", i, name, pdx_last_error_message());
    }
    put(to_child[1], "w", 1);
  }
  uint64_t peer_failed = 0;
  get(from_child[0], &peer_failed, sizeof peer_failed);
  double took = now_s() - t0;
  int wstatus = 0;
  CHECK(waitpid(child, &wstatus, 0) == child && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  struct usage end = usage_of(b);
  /* Idle lanes and threads leave on their own: wait until the usage is back
   * within the bounds checked below (10 s at most), not for a fixed time. */
  double settle_from = now_s();
  struct usage settled = usage_of(b);
  while (!settled_since(settled, start) && now_s() - settle_from < 10.0) {
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    settled = usage_of(b);
  }
  printf("usage settled %.2f s after the last lifetime\n", now_s() - settle_from);
  printf("%ld peer lifetimes in %.1f s; failed writes: B->peers %llu, peers->B %llu\n", lifetimes, took,
         (unsigned long long)failed, (unsigned long long)peer_failed);
  print_usage("before the first", start);
  print_usage("right after the last", end);
  print_usage("settled", settled);
  CHECK(failed == 0);
  CHECK(peer_failed == 0);
  CHECK(settled.peers <= 64);
  CHECK(settled.fds <= start.fds + 64);
  CHECK(settled.threads <= start.threads + 64);
  CHECK(settled.rss_kib <= start.rss_kib + 64 * 1024);
  CHECK(settled_since(settled, start));
  pdx_engine_free(b);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  test_reused_data_port();
  test_many_short_lived_peers();
  return pdx_test_finish("test_peer_lifecycle");
}
