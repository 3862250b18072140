/* pdx_set_log_callback: the level filter, replacement and removal (no call
 * after removal returns, even with calls in flight on other threads), calls
 * from pdx's own threads, and a callback that calls back into pdx (engine,
 * args, notifications, the callback setter itself) without deadlocking.
 * A watchdog alarm turns a deadlock into a failure instead of a hang. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define MAX_RECORDS 512

typedef struct {
  int level;
  char module[96];
  char message[512];
  int on_main_thread;
} record;

typedef struct {
  pthread_mutex_t mu;
  int count;
  record records[MAX_RECORDS];
  int bad_text;     /* a text whose length or NUL terminator was wrong */
  int in_flight;    /* calls running now */
  int after_remove; /* calls that began after removal returned */
  volatile int removed;
  int slow_us;      /* sleep inside each call (to keep calls in flight) */
} log_sink;

static pthread_t main_thread;

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static void sink_init(log_sink *s) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
}

static void sink_reset(log_sink *s) {
  pthread_mutex_lock(&s->mu);
  s->count = 0;
  pthread_mutex_unlock(&s->mu);
}

static int sink_count(log_sink *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->count;
  pthread_mutex_unlock(&s->mu);
  return n;
}

static void copy_text(char *dst, size_t cap, const char *src, size_t len) {
  size_t n = len < cap - 1 ? len : cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

static void record_call(void *userdata, int32_t level, const char *module, size_t module_len, const char *message,
                        size_t message_len) {
  log_sink *s = userdata;
  pthread_mutex_lock(&s->mu);
  if (s->removed) s->after_remove++;
  s->in_flight++;
  if (module == NULL || message == NULL || module[module_len] != 0 || message[message_len] != 0 ||
      strlen(module) != module_len || strlen(message) != message_len)
    s->bad_text++;
  if (s->count < MAX_RECORDS) {
    record *r = &s->records[s->count];
    r->level = level;
    copy_text(r->module, sizeof r->module, module, module_len);
    copy_text(r->message, sizeof r->message, message, message_len);
    r->on_main_thread = pthread_equal(pthread_self(), main_thread);
  }
  s->count++;
  pthread_mutex_unlock(&s->mu);
  if (s->slow_us) sleep_us(s->slow_us);
  pthread_mutex_lock(&s->mu);
  s->in_flight--;
  pthread_mutex_unlock(&s->mu);
}

/* Index of the first record whose message contains `text` (and, if
 * `module` is not NULL, whose module is `module`), or -1. */
static int find_record(log_sink *s, const char *text, const char *module) {
  int found = -1;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->count && i < MAX_RECORDS; i++) {
    if (strstr(s->records[i].message, text) && (module == NULL || strcmp(s->records[i].module, module) == 0)) {
      found = i;
      break;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return found;
}

static int lowest_level(log_sink *s) {
  int low = 1000;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->count && i < MAX_RECORDS; i++)
    if (s->records[i].level < low) low = s->records[i].level;
  pthread_mutex_unlock(&s->mu);
  return low;
}

/* A port with a bound socket that does not listen: connecting is refused. */
static int dead_fd = -1;
static char dead_session[64];

static void make_dead_peer(void) {
  dead_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  CHECK(dead_fd >= 0 && bind(dead_fd, (struct sockaddr *)&a, sizeof a) == 0);
  CHECK(getsockname(dead_fd, (struct sockaddr *)&a, &len) == 0);
  snprintf(dead_session, sizeof dead_session, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
}

static unsigned char scratch[64];

static void failed_write(pdx_engine *e) {
  CHECK_STATUS(pdx_transfer_sync_write(e, dead_session, scratch, 0x1000, sizeof scratch), PDX_ERR_PEER_UNREACHABLE);
}

/* ------------------------------------------------------------- levels */

static void test_level_filter(void) {
  log_sink s;
  sink_init(&s);
  pdx_engine *e = start_engine();

  /* Warnings and errors only: a failed write logs a warning, starting an
   * engine logs only info (not delivered). */
  CHECK_OK(pdx_set_log_callback(record_call, &s, PDX_LOG_WARNING));
  failed_write(e);
  pdx_engine *other = start_engine();
  pdx_engine_free(other);
  int i = find_record(&s, "failed", "pdx::engine::batch");
  CHECK(i >= 0);
  if (i >= 0) {
    CHECK(s.records[i].level == PDX_LOG_WARNING);
    CHECK(strstr(s.records[i].message, dead_session) != NULL);
    CHECK(s.records[i].on_main_thread);
  }
  CHECK(lowest_level(&s) >= PDX_LOG_WARNING);
  CHECK(find_record(&s, "engine", "pdx::engine") < 0); /* "pdx tcp engine ... up" is info */

  /* Info: the engine's start and stop come through. */
  sink_reset(&s);
  CHECK_OK(pdx_set_log_callback(record_call, &s, PDX_LOG_INFO));
  other = start_engine();
  CHECK(find_record(&s, "up (data port", "pdx::engine") >= 0);
  pdx_engine_free(other);
  CHECK(find_record(&s, "stopped", "pdx::engine") >= 0);
  CHECK(lowest_level(&s) >= PDX_LOG_INFO);

  /* Debug: the refused connect itself is logged too. */
  sink_reset(&s);
  CHECK_OK(pdx_set_log_callback(record_call, &s, PDX_LOG_DEBUG));
  failed_write(e);
  i = find_record(&s, "cannot connect", "pdx::engine::dialer");
  CHECK(i >= 0);
  if (i >= 0) CHECK(s.records[i].level == PDX_LOG_DEBUG);
  CHECK(find_record(&s, "failed", "pdx::engine::batch") >= 0);

  /* Between levels: 25 passes warnings, not info; above error nothing. */
  sink_reset(&s);
  CHECK_OK(pdx_set_log_callback(record_call, &s, 25));
  other = start_engine();
  pdx_engine_free(other);
  failed_write(e);
  CHECK(sink_count(&s) > 0);
  CHECK(lowest_level(&s) == PDX_LOG_WARNING);
  sink_reset(&s);
  CHECK_OK(pdx_set_log_callback(record_call, &s, PDX_LOG_ERROR + 1));
  failed_write(e);
  CHECK(sink_count(&s) == 0);

  CHECK(s.bad_text == 0);
  CHECK_OK(pdx_set_log_callback(NULL, NULL, 0));
  pdx_engine_free(e);
}

/* ------------------------------------------------- replace and remove */

static void test_replace_and_remove(void) {
  log_sink a, b;
  sink_init(&a);
  sink_init(&b);
  pdx_engine *e = start_engine();

  CHECK_OK(pdx_set_log_callback(record_call, &a, PDX_LOG_WARNING));
  failed_write(e);
  CHECK(sink_count(&a) >= 1);
  CHECK_OK(pdx_set_log_callback(record_call, &b, PDX_LOG_WARNING));
  int before = sink_count(&a);
  failed_write(e);
  CHECK(sink_count(&a) == before);
  CHECK(sink_count(&b) >= 1);

  /* Removed: back to stderr (silenced by RUST_LOG=off under ctest). */
  CHECK_OK(pdx_set_log_callback(NULL, NULL, PDX_LOG_TRACE));
  b.removed = 1;
  before = sink_count(&b);
  failed_write(e);
  CHECK(sink_count(&b) == before);
  CHECK(b.after_remove == 0);
  /* Removing twice is fine. */
  CHECK_OK(pdx_set_log_callback(NULL, NULL, 0));
  pdx_engine_free(e);
}

/* Calls in flight on other threads when the callback is removed: removal
 * returns only after they finished, and none starts afterwards. */
typedef struct {
  pdx_engine *engine;
  volatile int stop;
  int writes; /* failed writes so far (each one logs); atomic */
} writer_arg;

static void *failing_writer(void *p) {
  writer_arg *w = p;
  while (!w->stop) {
    pdx_status st = pdx_transfer_sync_write(w->engine, dead_session, scratch, 0x1000, sizeof scratch);
    if (st != PDX_ERR_PEER_UNREACHABLE) {
      fprintf(stderr, "failing_writer: unexpected status %d\n", (int)st);
      break;
    }
    __atomic_fetch_add(&w->writes, 1, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

static void test_remove_waits_for_calls_in_flight(void) {
  pdx_engine *e = start_engine();
  writer_arg w = {e, 0, 0};
  pthread_t threads[3];
  for (int round = 0; round < 5; round++) {
    log_sink s;
    sink_init(&s);
    s.slow_us = 2000;
    CHECK_OK(pdx_set_log_callback(record_call, &s, PDX_LOG_DEBUG));
    w.stop = 0;
    for (int t = 0; t < 3; t++) CHECK(pthread_create(&threads[t], NULL, failing_writer, &w) == 0);
    for (int spin = 0; spin < 2000 && sink_count(&s) < 6; spin++) sleep_us(1000);
    CHECK(sink_count(&s) >= 6);
    CHECK_OK(pdx_set_log_callback(NULL, NULL, 0));
    pthread_mutex_lock(&s.mu);
    s.removed = 1;
    CHECK(s.in_flight == 0);
    pthread_mutex_unlock(&s.mu);
    /* The writers go on failing (and would log) after the removal: wait for
     * six more failed writes rather than for a time. */
    int removed_at = __atomic_load_n(&w.writes, __ATOMIC_SEQ_CST);
    for (int spin = 0; spin < 10000 && __atomic_load_n(&w.writes, __ATOMIC_SEQ_CST) < removed_at + 6; spin++)
      sleep_us(1000);
    CHECK(__atomic_load_n(&w.writes, __ATOMIC_SEQ_CST) >= removed_at + 6);
    w.stop = 1;
    for (int t = 0; t < 3; t++) pthread_join(threads[t], NULL);
    CHECK(s.after_remove == 0);
    CHECK(s.bad_text == 0);
  }
  pdx_engine_free(e);
}

/* ------------------------------------------------------ pdx's threads */

/* Send a handshake frame whose length prefix is absurd: the engine's
 * handshake thread refuses it and logs at debug level. */
static void send_bad_handshake(pdx_engine *e) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(pdx_engine_rpc_port(e));
  CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
  unsigned char prefix[8];
  memset(prefix, 0xff, sizeof prefix);
  CHECK(write(fd, prefix, sizeof prefix) == (ssize_t)sizeof prefix);
  char byte;
  ssize_t got = read(fd, &byte, 1); /* returns when the engine closes */
  (void)got;
  close(fd);
}

static int wait_for_record(log_sink *s, const char *text, const char *module) {
  for (int spin = 0; spin < 5000; spin++) {
    int i = find_record(s, text, module);
    if (i >= 0) return i;
    sleep_us(1000);
  }
  return -1;
}

static void test_called_from_pdx_threads(void) {
  log_sink s;
  sink_init(&s);
  pdx_engine *e = start_engine();
  CHECK_OK(pdx_set_log_callback(record_call, &s, PDX_LOG_DEBUG));
  send_bad_handshake(e);
  int i = wait_for_record(&s, "refused frame length", "pdx::engine::server::handshake");
  CHECK(i >= 0);
  if (i >= 0) {
    CHECK(!s.records[i].on_main_thread);
    CHECK(s.records[i].level == PDX_LOG_DEBUG);
  }
  CHECK_OK(pdx_set_log_callback(NULL, NULL, 0));
  pdx_engine_free(e);
}

/* ---------------------------------------------------------- re-entry */

typedef struct {
  log_sink sink;
  pdx_engine *engine;
  pdx_args *args;
  int reentered;
  int args_seen;
  int replaced;
} reentry;

static void reentrant_call(void *userdata, int32_t level, const char *module, size_t module_len,
                           const char *message, size_t message_len) {
  reentry *r = userdata;
  record_call(&r->sink, level, module, module_len, message, message_len);
  /* Everything below takes pdx locks; none may be held by our caller. */
  if (pdx_engine_session_id(r->engine) == NULL) return;
  pdx_notifications *n = NULL;
  if (pdx_notifications_drain(r->engine, &n) == PDX_OK) pdx_notifications_free(n);
  (void)pdx_backend_available("tcp");
  /* Fails, and logs while we are inside: that record is dropped. */
  (void)pdx_send_probe(r->engine, dead_session);
  if (r->args != NULL) {
    (void)pdx_args_message_count(r->args);
    r->args_seen++;
  }
  /* Replace the callback with itself from inside it. */
  if (pdx_set_log_callback(reentrant_call, r, PDX_LOG_DEBUG) == PDX_OK) r->replaced++;
  __atomic_fetch_add(&r->reentered, 1, __ATOMIC_SEQ_CST);
}

static void test_reentrant_callback(void) {
  reentry r;
  memset(&r, 0, sizeof r);
  sink_init(&r.sink);
  r.engine = start_engine();
  CHECK_OK(pdx_set_log_callback(reentrant_call, &r, PDX_LOG_DEBUG));

  /* From the caller's thread, after a failed transfer. */
  failed_write(r.engine);
  CHECK(r.reentered >= 1);
  /* The probe inside the callback failed and logged; nothing recursed. */
  CHECK(find_record(&r.sink, "failed", "pdx::engine::batch") >= 0);

  /* Starting and stopping an engine log while the engine table is in use. */
  pdx_engine *extra = start_engine();
  pdx_engine_free(extra);
  CHECK(find_record(&r.sink, "stopped", "pdx::engine") >= 0);

  /* From a pdx thread. */
  int before = r.reentered;
  send_bad_handshake(r.engine);
  CHECK(wait_for_record(&r.sink, "refused frame length", "pdx::engine::server::handshake") >= 0);
  CHECK(r.reentered > before);

  /* While normalizing: its messages are logged with the args handle in use,
   * and the callback reads that same handle. */
  unsetenv("MC_FORCE_TCP");
  CHECK_OK(pdx_args_new(&r.args));
  CHECK_OK(pdx_args_set(r.args, "disaggregation_transfer_backend", "mooncake_tcp"));
  CHECK_OK(pdx_normalize_args(r.args));
  CHECK(r.args_seen >= 1);
  CHECK(find_record(&r.sink, "MC_FORCE_TCP", "pdx::config") >= 0);
  unsetenv("MC_FORCE_TCP");

  CHECK(r.replaced == r.reentered);
  CHECK_OK(pdx_set_log_callback(NULL, NULL, 0));
  CHECK(r.sink.bad_text == 0);
  pdx_args *args = r.args;
  r.args = NULL;
  pdx_args_free(args);
  pdx_engine_free(r.engine);
}


/* ------------------------------------- free from the callback, on pdx's thread */

/* Threads of this process besides the main one (all of them pdx's here:
 * engine threads and the reaper; names are set late, so not counted by name). */
static int other_threads(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/task");
  if (d == NULL) return -1;
  struct dirent *t;
  char self[32];
  snprintf(self, sizeof self, "%ld", (long)getpid());
  while ((t = readdir(d)) != NULL)
    if (t->d_name[0] != '.' && strcmp(t->d_name, self) != 0) n++;
  closedir(d);
  return n;
}

static struct {
  pdx_engine *victim;  /* freed by the first record logged off the main thread */
  int freed;
  char last_error[512];
} freeing;

static void freeing_call(void *userdata, int32_t level, const char *module, size_t module_len, const char *message,
                         size_t message_len) {
  (void)userdata, (void)level, (void)module, (void)module_len, (void)message, (void)message_len;
  if (pthread_equal(pthread_self(), main_thread)) return;
  pdx_engine *e = __atomic_exchange_n(&freeing.victim, NULL, __ATOMIC_SEQ_CST);
  if (e == NULL) return;
  pdx_engine_free(e);
  const char *err = pdx_last_error_message();
  snprintf(freeing.last_error, sizeof freeing.last_error, "%s", err ? err : "");
  __atomic_store_n(&freeing.freed, 1, __ATOMIC_SEQ_CST);
}

/* pdx_engine_free from the callback while it runs on one of that engine's
 * own threads (its handshake thread): no panic, no error, nothing on
 * stderr, and every engine thread ends within 10 s. */
static void test_free_from_own_thread(void) {
  CHECK(other_threads() == 0); /* engines of the earlier tests are gone */
  pdx_engine *e = start_engine();
  CHECK(other_threads() > 0);
  /* stderr into a file for the duration (a panic would print there). */
  char path[] = "/tmp/pdx_test_log_stderr_XXXXXX";
  int capture = mkstemp(path);
  int saved = dup(2);
  CHECK(capture >= 0 && saved >= 0);
  fflush(stderr);
  dup2(capture, 2);
  freeing.victim = e;
  freeing.freed = 0;
  CHECK_OK(pdx_set_log_callback(freeing_call, NULL, PDX_LOG_TRACE));
  send_bad_handshake(e);
  for (int spin = 0; spin < 10000 && !__atomic_load_n(&freeing.freed, __ATOMIC_SEQ_CST); spin++) sleep_us(1000);
  double t0 = now_s();
  int left = other_threads();
  while (left != 0 && now_s() - t0 < 10.0) {
    sleep_us(10000);
    left = other_threads();
  }
  double took = now_s() - t0;
  CHECK_OK(pdx_set_log_callback(NULL, NULL, 0));
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char seen[4096] = {0};
  ssize_t got = pread(capture, seen, sizeof seen - 1, 0);
  close(capture);
  unlink(path);
  CHECK(freeing.freed == 1);
  CHECK(strstr(freeing.last_error, "panic") == NULL);
  if (strstr(freeing.last_error, "panic") != NULL) fprintf(stderr, "last error in the callback: %s\n", freeing.last_error);
  CHECK(got == 0);
  if (got > 0) fprintf(stderr, "stderr during the test:\n%s\n", seen);
  CHECK(left == 0);
  printf("  engine freed from its own handshake thread: its threads ended %.2f s later (%d left)\n", took, left);
  /* The handle is gone; a new engine works. */
  CHECK(pdx_engine_session_id(e) == NULL);
  pdx_engine *again = start_engine();
  failed_write(again);
  pdx_engine_free(again);
}

int main(void) {
  main_thread = pthread_self();
  alarm(120); /* a deadlock fails the test instead of hanging it */
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  unsetenv("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE");
  make_dead_peer();
  /* Before any callback: stderr, and removing nothing is fine. */
  CHECK_OK(pdx_set_log_callback(NULL, NULL, 0));
  test_level_filter();
  test_replace_and_remove();
  test_remove_waits_for_calls_in_flight();
  test_called_from_pdx_threads();
  test_reentrant_callback();
  test_free_from_own_thread();
  close(dead_fd);
  return pdx_test_finish("test_log");
}
