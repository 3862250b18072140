/* Hardening through the C ABI (issue #11): bogus lengths and oversized
 * batches are refused before anything proportional to them is allocated,
 * and the notification of an asynchronous batch that the peer refused (its
 * byte budget is full) is readable through pdx_batch_notify_error. Slow
 * handshake clients announcing 1 MiB frames do not keep a new peer out
 * (issue 18). */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static uint64_t addr_of(const void *p) { return (uint64_t)(uintptr_t)p; }

/* Resident set size in bytes (from /proc/self/statm). */
static long rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (f == NULL) return -1;
  if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
  fclose(f);
  return resident * sysconf(_SC_PAGESIZE);
}

static void test_huge_lengths_and_batches(pdx_engine *a, pdx_engine *b) {
  static unsigned char target[4096], src[4096];
  CHECK_OK(pdx_register_memory(b, target, sizeof target));
  const char *session = pdx_engine_session_id(b);
  double t0 = now_s();
  CHECK_STATUS(pdx_transfer_sync_write(a, session, src, addr_of(target), (size_t)1 << 62),
               PDX_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(pdx_transfer_sync_read(a, session, src, addr_of(target), (size_t)1 << 62),
               PDX_ERR_INVALID_ARGUMENT);
  /* 10 million entries: refused within 1 s with under 100 MiB of growth.
   * calloc'd arrays stay unmapped until touched, so RSS shows only what pdx
   * itself allocates or reads. */
  const size_t n = 10u * 1000u * 1000u;
  void **locals = calloc(n, sizeof *locals);
  uint64_t *remotes = calloc(n, sizeof *remotes);
  size_t *lens = calloc(n, sizeof *lens);
  CHECK(locals != NULL && remotes != NULL && lens != NULL);
  long before = rss_bytes();
  double t1 = now_s();
  CHECK_STATUS(pdx_batch_transfer_sync_write(a, session, locals, remotes, lens, n), PDX_ERR_INVALID_ARGUMENT);
  uint64_t id = 0;
  CHECK_STATUS(pdx_batch_submit(a, session, PDX_OPCODE_WRITE, locals, remotes, lens, n, NULL, NULL, &id),
               PDX_ERR_INVALID_ARGUMENT);
  CHECK(id == 0);
  double took = now_s() - t1;
  long grew = rss_bytes() - before;
  printf("10M-entry batch refused in %.3f s, RSS +%ld KiB; 1<<62 refused in %.3f s\n", took, grew / 1024,
         t1 - t0);
  CHECK(took < 1.0);
  CHECK(grew < 100l << 20);
  free(locals);
  free(remotes);
  free(lens);
  CHECK_OK(pdx_unregister_memory(b, target));
}

static void test_notify_error_is_readable(pdx_engine *a, pdx_engine *b) {
  /* b keeps at most 4 KiB of notifications (PDX_NOTIFY_QUEUE_BYTES). */
  static unsigned char target[64], src[64];
  CHECK_OK(pdx_register_memory(b, target, sizeof target));
  const char *session = pdx_engine_session_id(b);
  static char big[3000];
  memset(big, 'n', sizeof big - 1);
  big[sizeof big - 1] = 0;
  void *locals[1] = {src};
  uint64_t remotes[1] = {addr_of(target)};
  size_t lens[1] = {sizeof src};
  int accepted = 0, refused = 0;
  for (int i = 0; i < 3; i++) {
    uint64_t id = 0;
    CHECK_OK(pdx_batch_submit(a, session, PDX_OPCODE_WRITE, locals, remotes, lens, 1, "kv", big, &id));
    int32_t state = -1;
    CHECK_OK(pdx_batch_wait(a, id, 30000, &state));
    CHECK(state == PDX_TASK_COMPLETED);
    pdx_status notify = 12345;
    char text[256] = "x";
    size_t len = 0;
    CHECK_OK(pdx_batch_notify_error(a, id, &notify, text, sizeof text, &len));
    if (notify == PDX_OK) {
      accepted++;
      CHECK(len == 0 && text[0] == 0);
    } else {
      refused++;
      CHECK(notify == PDX_ERR_NOTIFY_REJECTED);
      CHECK(len > 0 && strstr(text, "rejected") != NULL);
    }
    CHECK_OK(pdx_batch_notify_error(a, id, NULL, NULL, 0, NULL));
    CHECK_OK(pdx_batch_free(a, id));
    CHECK_STATUS(pdx_batch_notify_error(a, id, &notify, NULL, 0, NULL), PDX_ERR_INVALID_HANDLE);
  }
  CHECK(accepted == 1 && refused == 2);
  /* A batch without a notification has no notify error. */
  uint64_t id = 0;
  CHECK_OK(pdx_batch_submit(a, session, PDX_OPCODE_WRITE, locals, remotes, lens, 1, NULL, NULL, &id));
  CHECK_OK(pdx_batch_wait(a, id, 30000, NULL));
  pdx_status notify = 12345;
  CHECK_OK(pdx_batch_notify_error(a, id, &notify, NULL, 0, NULL));
  CHECK(notify == PDX_OK);
  CHECK_OK(pdx_batch_free(a, id));
  /* Accepted == drained. */
  pdx_notifications *list = NULL;
  CHECK_OK(pdx_notifications_drain(b, &list));
  CHECK(pdx_notifications_count(list) == (size_t)accepted);
  pdx_notifications_free(list);
  CHECK_STATUS(pdx_batch_notify_error(NULL, 1, &notify, NULL, 0, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_OK(pdx_unregister_memory(b, target));
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* A connection to `to` announcing a 1 MiB handshake frame and sending its
 * first byte; -1 if it could not be opened. */
static int open_slow_client(const struct sockaddr_in *to) {
  static const unsigned char first[9] = {0, 0, 0x10, 0, 0, 0, 0, 0, '{'}; /* 1 << 20, little endian */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (connect(fd, (const struct sockaddr *)to, sizeof *to) != 0 ||
      send(fd, first, sizeof first, MSG_NOSIGNAL) != (ssize_t)sizeof first) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Whether the peer has closed `fd` (EOF or an error waiting to be read). */
static int closed_by_peer(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* 64 connections to b's handshake port each announce a 1 MiB frame, send
 * its first byte, then one byte every ~0.8 s, and are reopened when b closes
 * them (the attack of issue 18). After 2.5 s a new engine probes 8 times
 * (the closed clients reopened before each) and writes, each within 2 s;
 * a, which wrote to b before, still writes and notifies. */
static void test_slow_handshake_clients_do_not_stop_a_new_peer(pdx_engine *a, pdx_engine *b) {
  enum { SLOW = 64, PROBES = 8 };
  static unsigned char target[2 * 4096], src[4096];
  CHECK_OK(pdx_register_memory(b, target, sizeof target));
  const char *session = pdx_engine_session_id(b);
  const char *colon = strrchr(session, ':');
  CHECK(colon != NULL);
  if (colon == NULL) return;
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fds[SLOW];
  int opened = 0;
  for (int i = 0; i < SLOW; i++) {
    fds[i] = open_slow_client(&to);
    opened += fds[i] >= 0;
  }
  CHECK(opened == SLOW);
  for (int round = 0; round < 3; round++) {
    sleep_s(0.83);
    for (int i = 0; i < SLOW; i++) {
      if (fds[i] >= 0) (void)send(fds[i], " ", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
  pdx_engine *c = start_engine();
  double slowest_probe = 0;
  int probes_ok = 0, reopened = 0;
  for (int k = 0; k < PROBES; k++) {
    for (int i = 0; i < SLOW; i++) {
      if (fds[i] >= 0 && !closed_by_peer(fds[i])) continue;
      if (fds[i] >= 0) close(fds[i]);
      fds[i] = open_slow_client(&to);
      reopened++;
    }
    sleep_s(0.05); /* b has read the reopened clients' first bytes */
    double t0 = now_s();
    pdx_status st = pdx_send_probe(c, session);
    double took = now_s() - t0;
    CHECK_OK(st);
    probes_ok += st == PDX_OK;
    if (took > slowest_probe) slowest_probe = took;
  }
  memset(src, 0x5a, sizeof src);
  double t0 = now_s();
  CHECK_OK(pdx_transfer_sync_write(c, session, src, addr_of(target), sizeof src));
  double write = now_s() - t0;
  CHECK_OK(pdx_transfer_sync_write(a, session, src, addr_of(target) + 4096, sizeof src));
  CHECK_OK(pdx_send_notify(a, session, "kv", "from a known peer"));
  printf("past %d slow clients announcing 1 MiB frames (%d reopened): %d of %d probes ok, slowest %.3f s; "
         "write %.3f s\n",
         SLOW, reopened, probes_ok, PROBES, slowest_probe, write);
  CHECK(slowest_probe < 2.0 && write < 2.0);
  CHECK(memcmp(target, src, sizeof src) == 0 && memcmp(target + 4096, src, sizeof src) == 0);
  pdx_notifications *list = NULL;
  CHECK_OK(pdx_notifications_drain(b, &list));
  int found = 0;
  for (size_t i = 0; i < pdx_notifications_count(list); i++) {
    const char *name = NULL, *msg = NULL;
    CHECK_OK(pdx_notification_get(list, i, &name, &msg));
    found += name != NULL && msg != NULL && strcmp(name, "kv") == 0 && strcmp(msg, "from a known peer") == 0;
  }
  CHECK(found == 1);
  pdx_notifications_free(list);
  for (int i = 0; i < SLOW; i++) {
    if (fds[i] >= 0) close(fds[i]);
  }
  pdx_engine_free(c);
  CHECK_OK(pdx_unregister_memory(b, target));
}

/* 8 clients, one after another, send all but the last byte of a handshake
 * frame of exactly MC_HANDSHAKE_MAX_LENGTH (1 MiB) and hold it: the last
 * four fill b's handshake budget (4 frames). A new engine's probe takes its
 * bytes from the slowest holder: it and a write each finish within 2 s, and
 * a's notify is delivered. */
static void test_handshake_budget_holders_give_way_to_a_new_peer(pdx_engine *a, pdx_engine *b) {
  enum { HOLDERS = 8 };
  const size_t frame = (size_t)1 << 20;
  static unsigned char target[4096], src[4096];
  CHECK_OK(pdx_register_memory(b, target, sizeof target));
  const char *session = pdx_engine_session_id(b);
  const char *colon = strrchr(session, ':');
  CHECK(colon != NULL);
  if (colon == NULL) return;
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  size_t len = 8 + frame - 1;
  unsigned char *bytes = malloc(len);
  CHECK(bytes != NULL);
  if (bytes == NULL) return;
  memset(bytes, ' ', len);
  for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)(frame >> (8 * i));
  int fds[HOLDERS];
  for (int i = 0; i < HOLDERS; i++) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fds[i] >= 0 && connect(fds[i], (struct sockaddr *)&to, sizeof to) == 0);
    struct timeval three = {3, 0};
    (void)setsockopt(fds[i], SOL_SOCKET, SO_SNDTIMEO, &three, sizeof three);
    /* A holder that loses its place is closed while it sends: that is allowed. */
    for (size_t sent = 0; sent < len;) {
      ssize_t n = send(fds[i], bytes + sent, len - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += (size_t)n;
    }
    sleep_s(0.1); /* b has read it */
  }
  free(bytes);
  int holding = 0;
  for (int i = 0; i < HOLDERS; i++) holding += !closed_by_peer(fds[i]);
  pdx_engine *c = start_engine();
  double t0 = now_s();
  CHECK_OK(pdx_send_probe(c, session));
  double probe = now_s() - t0;
  memset(src, 0x3c, sizeof src);
  t0 = now_s();
  CHECK_OK(pdx_transfer_sync_write(c, session, src, addr_of(target), sizeof src));
  double write = now_s() - t0;
  CHECK_OK(pdx_send_notify(a, session, "kv", "known peer, budget full"));
  int still = 0;
  for (int i = 0; i < HOLDERS; i++) still += !closed_by_peer(fds[i]);
  printf("%d clients holding 1 MiB frames (%d held, %d after): probe %.3f s, write %.3f s\n", HOLDERS, holding,
         still, probe, write);
  CHECK(holding == 4 && still < 4);
  CHECK(probe < 2.0 && write < 2.0);
  CHECK(memcmp(target, src, sizeof src) == 0);
  pdx_notifications *list = NULL;
  CHECK_OK(pdx_notifications_drain(b, &list));
  const char *name = NULL, *msg = NULL;
  CHECK(pdx_notifications_count(list) == 1);
  CHECK_OK(pdx_notification_get(list, 0, &name, &msg));
  CHECK(name != NULL && msg != NULL && strcmp(name, "kv") == 0 && strcmp(msg, "known peer, budget full") == 0);
  pdx_notifications_free(list);
  for (int i = 0; i < HOLDERS; i++) {
    if (fds[i] >= 0) close(fds[i]);
  }
  pdx_engine_free(c);
  CHECK_OK(pdx_unregister_memory(b, target));
}

int main(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  setenv("PDX_NOTIFY_QUEUE_BYTES", "4096", 1);
  setenv("MC_HANDSHAKE_MAX_LENGTH", "1048576", 1); /* the frames of the budget test */
  pdx_engine *a = start_engine();
  pdx_engine *b = start_engine();
  test_huge_lengths_and_batches(a, b);
  test_notify_error_is_readable(a, b);
  test_slow_handshake_clients_do_not_stop_a_new_peer(a, b);
  test_handshake_budget_holders_give_way_to_a_new_peer(a, b);
  pdx_engine_free(a);
  pdx_engine_free(b);
  return pdx_test_finish("test_hardening");
}
