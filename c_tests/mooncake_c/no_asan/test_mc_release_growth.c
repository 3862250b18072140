/* Nothing grows with releases in flight: 10,000 transfers released while in
 * flight (allocateBatchID, submitTransfer of a READ of 256 KiB and 4 MiB,
 * freeBatchID as NIXL's releaseReqH calls it: every other one at once, the
 * others once the 256 KiB arrived, so that a window on the wire is cut)
 * leave, a second after the last one, the
 * heap in use (glibc's mallinfo2: uordblks + hblkhd) within 1 MiB, the RSS
 * within 2 MiB, and threads and open descriptors within 2 of what a control
 * of 10,000 releases after completion left. Built without sanitizers (they
 * replace malloc, whose figures this reads). Both engines live in this
 * process, so the target's side counts too. */
#define _GNU_SOURCE
#include <dirent.h>
#include <malloc.h>
#include <stdint.h>
#include <unistd.h>

#include "../harness.h"

#define REGION ((size_t)64 << 20)
#define HEAD_BYTES ((size_t)256 << 10)
#define TAIL_BYTES ((size_t)4 << 20)
#define RELEASES 10000
#define WARM 300

struct figures {
  long long heap, rss, threads, fds;
};

static long long status_field(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long v = -1;
  size_t n = strlen(field);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, field, n) == 0) v = atoll(line + n);
  if (f) fclose(f);
  return v;
}

static struct figures measure(void) {
  struct mallinfo2 m = mallinfo2();
  struct figures f = {(long long)(m.uordblks + m.hblkhd), status_field("VmRSS:") * 1024, status_field("Threads:"), 0};
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) f.fds += e->d_name[0] != '.';
  if (d) closedir(d);
  return f;
}

static void print(const char *what, struct figures f) {
  printf("%-34s heap %8.1f KiB  rss %8.1f KiB  threads %lld  fds %lld\n", what, f.heap / 1024.0, f.rss / 1024.0,
         f.threads, f.fds);
}

static transfer_engine_t a, b;
static uint8_t *abuf, *bbuf;
static int seg;

/* Wait (bounded) until task `task` of batch `id` is no longer in flight. */
static void wait_task(uint64_t id, size_t task) {
  transfer_status_t s = {-1, 0};
  double deadline = mc_now() + 30;
  do {
    if (getTransferStatus(a, id, task, &s) != 0) break;
  } while ((s.status == STATUS_WAITING || s.status == STATUS_PENDING) && mc_now() < deadline);
}

/* One release of a READ of HEAD_BYTES then TAIL_BYTES (`len`: the control's
 * size, one entry), freed in flight (`in_flight`: 1 at once, 2 once the head
 * arrived) or once it completed. */
static void release(size_t len, int in_flight) {
  uint64_t id = allocateBatchID(a, 1024);
  if (id == INVALID_BATCH) {
    CHECK(id != INVALID_BATCH);
    return;
  }
  uint64_t remote = (uint64_t)(uintptr_t)bbuf;
  transfer_request_t r[2] = {{OPCODE_READ, abuf, seg, remote, in_flight ? HEAD_BYTES : len},
                             {OPCODE_READ, abuf + HEAD_BYTES, seg, remote + HEAD_BYTES, TAIL_BYTES}};
  CHECK_EQ(submitTransfer(a, id, r, in_flight ? 2 : 1), 0);
  if (in_flight != 1) wait_task(id, 0);
  if (!in_flight) {
    transfer_status_t s = {-1, 0};
    CHECK_EQ(getTransferStatus(a, id, 0, &s), 0);
    CHECK_EQ(s.status, STATUS_COMPLETED);
  }
  int rc = freeBatchID(a, id);
  if (rc != 0) CHECK_EQ(rc, 0);
}

static void releases(int n, size_t len, int in_flight) {
  for (int i = 0; i < n && mc_failures < 10; i++) release(len, in_flight ? 1 + i % 2 : 0);
}

int main(void) {
  setenv("MC_FORCE_TCP", "1", 1);
  setenv("PDX_SAME_HOST", "off", 1);
  a = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  b = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  CHECK(a != NULL && b != NULL);
  if (a == NULL || b == NULL) return mc_finish("test_mc_release_growth");
  abuf = aligned_alloc(4096, REGION);
  bbuf = aligned_alloc(4096, REGION);
  memset(abuf, 0, REGION);
  memset(bbuf, 7, REGION);
  CHECK_EQ(registerLocalMemory(a, abuf, REGION, "*", 1), 0);
  CHECK_EQ(registerLocalMemory(b, bbuf, REGION, "*", 1), 0);
  char name[64];
  CHECK_EQ(getLocalIpAndPort(b, name, sizeof name), 0);
  seg = openSegment(a, name);
  CHECK(seg > 0);

  /* Warm both kinds first: pools, caches and lanes reach their sizes. */
  releases(WARM, 0, 1);
  releases(WARM, HEAD_BYTES, 0);
  sleep(1);
  struct figures warm = measure();
  double t0 = mc_now();
  releases(RELEASES, HEAD_BYTES, 0);
  double control_s = mc_now() - t0;
  sleep(1);
  struct figures control = measure();
  t0 = mc_now();
  releases(RELEASES, 0, 1);
  double in_flight_s = mc_now() - t0;
  sleep(1);
  struct figures after = measure();
  print("after warming:", warm);
  print("after 10,000 completed releases:", control);
  print("after 10,000 in-flight releases:", after);
  printf("(%.1f s and %.1f s; in-flight minus control: heap %+.1f KiB, rss %+.1f KiB, threads %+lld, fds %+lld)\n",
         control_s, in_flight_s, (after.heap - control.heap) / 1024.0, (after.rss - control.rss) / 1024.0,
         after.threads - control.threads, after.fds - control.fds);
  CHECK(llabs(after.heap - control.heap) <= 1 << 20);
  CHECK(llabs(after.rss - control.rss) <= 2 << 20);
  CHECK(llabs(after.threads - control.threads) <= 2);
  CHECK(llabs(after.fds - control.fds) <= 2);
  /* And the control itself did not grow. */
  CHECK(llabs(control.heap - warm.heap) <= 1 << 20);
  CHECK(llabs(control.fds - warm.fds) <= 2);

  CHECK_EQ(unregisterLocalMemory(a, abuf), 0);
  CHECK_EQ(unregisterLocalMemory(b, bbuf), 0);
  destroyTransferEngine(a);
  destroyTransferEngine(b);
  free(abuf);
  free(bbuf);
  return mc_finish("test_mc_release_growth");
}
