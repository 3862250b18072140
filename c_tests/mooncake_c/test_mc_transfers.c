/* Mooncake's C API on pdx, driven the way NIXL's Mooncake backend plugin
 * drives it (createTransferEngine("P2PHANDSHAKE", ip, "", 0, 1),
 * getLocalIpAndPort as the segment name, openSegment on every metadata load,
 * registerLocalMemory(..., "*", 1), allocateBatchID(1024) per posted
 * transfer, task ids polled until none is WAITING/PENDING, freeBatchID, the
 * handle reused for the next post, genNotifyInEngine):
 *
 * - two engines in one process: 64 x 1 MiB WRITE and READ, with and
 *   without a notification, 10 iterations each, every byte checked, exactly
 *   one notification per notified transfer, genNotifyInEngine both ways;
 * - task ids adding up across two submits to one batch;
 * - two processes (the target forked before any engine exists): the same
 *   WRITE + notification and READ, checked at both ends. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define DESCS 64
#define DESC_BYTES (1u << 20)
#define REGION ((size_t)DESCS * DESC_BYTES)
#define ITERATIONS 10

struct agent {
  transfer_engine_t e;
  char name[64];
  uint8_t *buf; /* [0, REGION): written into / read into; [REGION, 2 REGION): read from */
};

static void agent_start(struct agent *a) {
  a->e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  if (a->e == NULL) {
    fprintf(stderr, "createTransferEngine: %s\n", pdx_last_error_message());
    exit(1);
  }
  CHECK_EQ(getLocalIpAndPort(a->e, a->name, sizeof a->name), 0);
  CHECK(strncmp(a->name, "127.0.0.1:", 10) == 0);
  a->buf = aligned_alloc(4096, 2 * REGION);
  CHECK(a->buf != NULL);
  memset(a->buf, 0, 2 * REGION);
  CHECK_EQ(registerLocalMemory(a->e, a->buf, 2 * REGION, "*", 1), 0);
}

static void agent_stop(struct agent *a) {
  CHECK_EQ(unregisterLocalMemory(a->e, a->buf), 0);
  destroyTransferEngine(a->e);
  free(a->buf);
}

static uint8_t pattern(unsigned iter, size_t i) { return (uint8_t)(i * 131u + iter * 7u + (i >> 20)); }

static void fill(uint8_t *p, size_t n, unsigned iter) {
  for (size_t i = 0; i < n; i += 4096) p[i] = pattern(iter, i);
  for (size_t i = 0; i < n; i += 4096 * 61 + 1) p[i] = pattern(iter, i);
}

static int same(const uint8_t *p, size_t n, unsigned iter) {
  for (size_t i = 0; i < n; i += 4096)
    if (p[i] != pattern(iter, i)) return 0;
  for (size_t i = 0; i < n; i += 4096 * 61 + 1)
    if (p[i] != pattern(iter, i)) return 0;
  return 1;
}

/* NIXL's postXfer + checkXfer loop on one handle (`*handle`: a batch id or
 * INVALID_BATCH). 0 when every task completed. */
static int post_and_wait(transfer_engine_t e, uint64_t *handle, int seg, int opcode, uint8_t *local,
                         uint64_t remote, const char *notif) {
  if (*handle == INVALID_BATCH) {
    *handle = allocateBatchID(e, 1024);
    if (*handle == INVALID_BATCH) return -1;
  }
  transfer_request_t req[DESCS];
  for (size_t i = 0; i < DESCS; i++) {
    req[i].opcode = opcode;
    req[i].source = local + i * DESC_BYTES;
    req[i].target_id = seg;
    req[i].target_offset = remote + i * DESC_BYTES;
    req[i].length = DESC_BYTES;
  }
  int rc;
  if (notif) {
    notify_msg_t m = {(char *)"Agent1", (char *)notif};
    rc = submitTransferWithNotify(e, *handle, req, DESCS, m);
  } else {
    rc = submitTransfer(e, *handle, req, DESCS);
  }
  if (rc != 0) return rc;
  double deadline = mc_now() + 60;
  for (;;) {
    int in_progress = 0, failed = 0;
    for (size_t t = 0; t < DESCS; t++) {
      transfer_status_t s;
      int r = getTransferStatus(e, *handle, t, &s);
      if (r != 0 || s.status == STATUS_FAILED)
        failed = 1;
      else if (s.status == STATUS_WAITING || s.status == STATUS_PENDING)
        in_progress = 1;
      else if (s.status == STATUS_COMPLETED && s.transferred_bytes != DESC_BYTES)
        failed = 1;
    }
    if (failed) return -2;
    if (!in_progress) break;
    if (mc_now() > deadline) return -3;
  }
  CHECK_EQ(freeBatchID(e, *handle), 0);
  *handle = INVALID_BATCH;
  return 0;
}

/* Wait for `want` notifications at `e`; each must be {"Agent1"|from, msg_i}. */
static void expect_notifications(transfer_engine_t e, const char *from, const char *prefix, int first, int want) {
  int got = 0;
  double deadline = mc_now() + 30;
  while (got < want && mc_now() < deadline) {
    int size = -1;
    notify_msg_t *m = getNotifsFromEngine(e, &size);
    CHECK(size >= 0);
    for (int i = 0; i < size; i++) {
      char expect[64];
      snprintf(expect, sizeof expect, "%s%d", prefix, first + got + i);
      CHECK(strcmp(m[i].name, from) == 0);
      CHECK(strcmp(m[i].msg, expect) == 0);
    }
    got += size;
    CHECK_EQ(freeNotifsMsgBuf(m, size), 0);
    if (got < want) mc_sleep_ms(1);
  }
  CHECK_EQ(got, want);
}

static void one_process(void) {
  struct agent a, b;
  agent_start(&a);
  agent_start(&b);
  /* NIXL loads metadata again and again: the same id every time. */
  int seg = openSegment(a.e, b.name);
  CHECK(seg > 0);
  CHECK_EQ(openSegment(a.e, b.name), seg);
  CHECK_EQ(openSegmentNoCache(a.e, b.name), seg);
  CHECK_EQ(openSegment(a.e, a.name), LOCAL_SEGMENT);
  int back = openSegment(b.e, a.name);
  CHECK(back > 0);

  uint64_t handle = INVALID_BATCH; /* reused across every post, as NIXL's handle */
  int notified = 0;
  for (int with_notif = 0; with_notif < 2; with_notif++) {
    for (unsigned it = 0; it < ITERATIONS; it++) {
      char msg[32];
      snprintf(msg, sizeof msg, "w%d", notified);
      fill(a.buf, REGION, it + 100u * (unsigned)with_notif);
      CHECK_EQ(post_and_wait(a.e, &handle, seg, OPCODE_WRITE, a.buf, (uint64_t)(uintptr_t)b.buf,
                             with_notif ? msg : NULL), 0);
      CHECK(same(b.buf, REGION, it + 100u * (unsigned)with_notif));
      if (with_notif) expect_notifications(b.e, "Agent1", "w", notified++, 1);

      fill(b.buf + REGION, REGION, it + 1000u);
      snprintf(msg, sizeof msg, "w%d", notified);
      CHECK_EQ(post_and_wait(a.e, &handle, seg, OPCODE_READ, a.buf, (uint64_t)(uintptr_t)(b.buf + REGION),
                             with_notif ? msg : NULL), 0);
      CHECK(same(a.buf, REGION, it + 1000u));
      if (with_notif) expect_notifications(b.e, "Agent1", "w", notified++, 1);
    }
  }
  /* Nothing more arrived than was sent. */
  int size = -1;
  notify_msg_t *extra = getNotifsFromEngine(b.e, &size);
  CHECK(extra == NULL);
  CHECK_EQ(size, 0);
  CHECK_EQ(freeNotifsMsgBuf(extra, size), 0);

  /* genNotifyInEngine both ways. */
  for (int i = 0; i < 3; i++) {
    char msg[32];
    snprintf(msg, sizeof msg, "g%d", i);
    notify_msg_t m = {(char *)"B", msg};
    CHECK_EQ(genNotifyInEngine(b.e, (uint64_t)back, m), 0);
  }
  expect_notifications(a.e, "B", "g", 0, 3);
  notify_msg_t m = {(char *)"A", (char *)"g0"};
  CHECK_EQ(genNotifyInEngine(a.e, (uint64_t)seg, m), 0);
  expect_notifications(b.e, "A", "g", 0, 1);

  /* Task ids add up across submits to one batch (0..31, then 32..63). */
  uint64_t batch = allocateBatchID(a.e, 64);
  CHECK(batch != INVALID_BATCH);
  transfer_request_t req[DESCS];
  fill(a.buf, REGION, 7);
  for (size_t i = 0; i < DESCS; i++)
    req[i] = (transfer_request_t){OPCODE_WRITE, a.buf + i * DESC_BYTES, seg,
                                  (uint64_t)(uintptr_t)(b.buf + i * DESC_BYTES), DESC_BYTES};
  CHECK_EQ(submitTransfer(a.e, batch, req, 32), 0);
  notify_msg_t done = {(char *)"Agent1", (char *)"halves"};
  CHECK_EQ(submitTransferWithNotify(a.e, batch, req + 32, 32, done), 0);
  CHECK_EQ(submitTransfer(a.e, batch, req, 1), 2); /* over the batch's 64 */
  for (size_t t = 0; t < DESCS; t++) {
    transfer_status_t s = {-1, 0};
    double deadline = mc_now() + 60;
    do {
      CHECK_EQ(getTransferStatus(a.e, batch, t, &s), 0);
    } while ((s.status == STATUS_WAITING || s.status == STATUS_PENDING) && mc_now() < deadline);
    CHECK_EQ(s.status, STATUS_COMPLETED);
    CHECK_EQ(s.transferred_bytes, DESC_BYTES);
  }
  transfer_status_t s;
  CHECK_EQ(getTransferStatus(a.e, batch, DESCS, &s), 1); /* no task 64 */
  CHECK_EQ(freeBatchID(a.e, batch), 0);
  CHECK(same(b.buf, REGION, 7));
  /* The notification of a batch of two submits came after both. */
  double deadline = mc_now() + 30;
  int got = 0;
  while (!got && mc_now() < deadline) {
    notify_msg_t *n = getNotifsFromEngine(b.e, &size);
    if (size == 1) got = strcmp(n[0].msg, "halves") == 0 ? 1 : -1;
    freeNotifsMsgBuf(n, size);
  }
  CHECK_EQ(got, 1);

  CHECK_EQ(closeSegment(a.e, seg), 0);
  CHECK(submitTransfer(a.e, allocateBatchID(a.e, 1), req, 1) == 1); /* closed segment */
  agent_stop(&a);
  agent_stop(&b);
}

/* The target in its own process: serve, wait for ITERATIONS notifications,
 * check the last write, answer through `report`, notify the initiator. */
static int target_process(int to_parent, int from_parent) {
  struct agent b;
  agent_start(&b);
  fill(b.buf + REGION, REGION, 4242);
  uint64_t addr = (uint64_t)(uintptr_t)b.buf;
  if (write(to_parent, b.name, sizeof b.name) != (ssize_t)sizeof b.name ||
      write(to_parent, &addr, sizeof addr) != (ssize_t)sizeof addr)
    return 2;
  expect_notifications(b.e, "Agent1", "p", 0, ITERATIONS);
  unsigned char ok = same(b.buf, REGION, ITERATIONS - 1);
  char peer[64];
  if (read(from_parent, peer, sizeof peer) != (ssize_t)sizeof peer) return 2;
  int back = openSegment(b.e, peer);
  CHECK(back > 0);
  notify_msg_t m = {(char *)"target", (char *)"t0"};
  CHECK_EQ(genNotifyInEngine(b.e, (uint64_t)back, m), 0);
  if (write(to_parent, &ok, 1) != 1) return 2;
  char bye;
  if (read(from_parent, &bye, 1) != 1) return 2;
  agent_stop(&b);
  return mc_finish("test_mc_transfers (target process)") == 0 && ok ? 0 : 1;
}

static void two_processes(void) {
  int up[2], down[2];
  CHECK(pipe(up) == 0 && pipe(down) == 0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    _exit(target_process(up[1], down[0]));
  }
  close(up[1]);
  close(down[0]);
  char peer[64];
  uint64_t remote = 0;
  CHECK(read(up[0], peer, sizeof peer) == (ssize_t)sizeof peer);
  CHECK(read(up[0], &remote, sizeof remote) == (ssize_t)sizeof remote);
  struct agent a;
  agent_start(&a);
  int seg = openSegment(a.e, peer);
  CHECK(seg > 0);
  uint64_t handle = INVALID_BATCH;
  for (unsigned it = 0; it < ITERATIONS; it++) {
    char msg[16];
    snprintf(msg, sizeof msg, "p%u", it);
    fill(a.buf, REGION, it);
    CHECK_EQ(post_and_wait(a.e, &handle, seg, OPCODE_WRITE, a.buf, remote, msg), 0);
    CHECK_EQ(post_and_wait(a.e, &handle, seg, OPCODE_READ, a.buf + REGION, remote + REGION, NULL), 0);
    CHECK(same(a.buf + REGION, REGION, 4242));
  }
  CHECK(write(down[1], a.name, sizeof a.name) == (ssize_t)sizeof a.name);
  unsigned char ok = 0;
  CHECK(read(up[0], &ok, 1) == 1);
  CHECK_EQ(ok, 1);
  expect_notifications(a.e, "target", "t", 0, 1);
  CHECK(write(down[1], "x", 1) == 1);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  agent_stop(&a);
}

int main(void) {
  setenv("MC_FORCE_TCP", "1", 1);
  two_processes(); /* first: fork before this process has engine threads */
  one_process();
  return mc_finish("test_mc_transfers");
}
