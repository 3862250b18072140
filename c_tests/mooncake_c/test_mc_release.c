/* A transfer released while in flight, as NIXL's Mooncake plugin releases
 * one (vLLM aborts a request or its transfer times out; releaseReqH calls
 * freeBatchID, ignores the result, and the memory goes to the next request):
 * allocateBatchID, submitTransfer of a 256 MiB READ, freeBatchID at once
 * (0: freed), the READ buffer filled right after, 2 s of waiting, then not
 * one byte of the buffer may differ from the fill. Then the same peer
 * serves the next READ, byte for byte, and a notification.
 *
 * Two processes (the target forked before any engine exists), over TCP
 * (PDX_SAME_HOST=off) and over the same-host link (the default for two
 * engines of one host; checked with showLinks). With
 * PDX_FREE_BATCH_IN_FLIGHT=busy, freeBatchID answers 4 (batch busy) as
 * Mooncake does. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define REGION ((size_t)256 << 20)
#define FILL 0xA5 /* the target's bytes are all below 0x80 */
#define RELEASES 2

static uint8_t pattern(size_t i) { return (uint8_t)((i * 131u + (i >> 12)) & 0x7f); }

static transfer_engine_t start(char name[64], uint8_t *buf) {
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  if (e == NULL) {
    fprintf(stderr, "createTransferEngine: %s\n", pdx_last_error_message());
    exit(1);
  }
  CHECK_EQ(getLocalIpAndPort(e, name, 64), 0);
  CHECK_EQ(registerLocalMemory(e, buf, REGION, "*", 1), 0);
  return e;
}

/* The target: register the pattern, say where, serve until told to stop. */
static int target_process(int to_parent, int from_parent, const char *same_host) {
  char go;
  if (read(from_parent, &go, 1) != 1) return 2;
  setenv("PDX_SAME_HOST", same_host, 1);
  uint8_t *buf = aligned_alloc(4096, REGION);
  if (buf == NULL) return 2;
  for (size_t i = 0; i < REGION; i++) buf[i] = pattern(i);
  char name[64];
  transfer_engine_t e = start(name, buf);
  uint64_t addr = (uint64_t)(uintptr_t)buf;
  if (write(to_parent, name, sizeof name) != (ssize_t)sizeof name ||
      write(to_parent, &addr, sizeof addr) != (ssize_t)sizeof addr)
    return 2;
  char bye;
  if (read(from_parent, &bye, 1) != 1) return 2;
  CHECK_EQ(unregisterLocalMemory(e, buf), 0);
  destroyTransferEngine(e);
  free(buf);
  return mc_checks > 0 && mc_failures == 0 ? 0 : 1;
}

struct target {
  pid_t pid;
  int up, down;
};

static struct target fork_target(const char *same_host) {
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) exit(2);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    _exit(target_process(up[1], down[0], same_host));
  }
  close(up[1]);
  close(down[0]);
  return (struct target){pid, up[0], down[1]};
}

static size_t differing(const uint8_t *p, size_t n, uint8_t byte) {
  size_t d = 0;
  for (size_t i = 0; i < n; i++) d += p[i] != byte;
  return d;
}

/* NIXL's release sequence against the target `t`, over the link `same_host`. */
static void release_in_flight(struct target t, const char *same_host) {
  CHECK(write(t.down, "g", 1) == 1);
  char peer[64];
  uint64_t remote = 0;
  CHECK(read(t.up, peer, sizeof peer) == (ssize_t)sizeof peer);
  CHECK(read(t.up, &remote, sizeof remote) == (ssize_t)sizeof remote);
  setenv("PDX_SAME_HOST", same_host, 1);
  uint8_t *buf = aligned_alloc(4096, REGION);
  CHECK(buf != NULL);
  memset(buf, 0, REGION);
  char name[64];
  transfer_engine_t e = start(name, buf);
  int seg = openSegment(e, peer);
  CHECK(seg > 0);
  transfer_request_t whole = {OPCODE_READ, buf, seg, remote, REGION};

  /* Warm: one READ to completion (lanes open, as in a running server). */
  uint64_t b = allocateBatchID(e, 1024);
  CHECK_EQ(submitTransfer(e, b, &whole, 1), 0);
  transfer_status_t s = {-1, 0};
  double deadline = mc_now() + 60;
  do {
    CHECK_EQ(getTransferStatus(e, b, 0, &s), 0);
  } while ((s.status == STATUS_WAITING || s.status == STATUS_PENDING) && mc_now() < deadline);
  CHECK_EQ(s.status, STATUS_COMPLETED);
  CHECK_EQ(freeBatchID(e, b), 0);
  CHECK(buf[12345] == pattern(12345) && buf[REGION - 1] == pattern(REGION - 1));
  char links[4096] = {0};
  CHECK_EQ(showLinks(e, links, sizeof links, 1), 0);
  int on_link = strstr(links, "\"same-host\"") != NULL;
  CHECK_EQ(on_link, strcmp(same_host, "off") != 0);

  for (int r = 0; r < RELEASES; r++) {
    memset(buf, 0, REGION);
    b = allocateBatchID(e, 1024);
    CHECK(b != INVALID_BATCH);
    CHECK_EQ(submitTransfer(e, b, &whole, 1), 0);
    double t0 = mc_now();
    CHECK_EQ(freeBatchID(e, b), 0);
    double took = mc_now() - t0;
    memset(buf, FILL, REGION);
    mc_sleep_ms(2000);
    size_t late = differing(buf, REGION, FILL);
    printf("PDX_SAME_HOST=%s: freeBatchID of a 256 MiB READ in flight took %.1f ms; %zu late bytes in 2 s\n",
           same_host, took * 1e3, late);
    CHECK_EQ(late, 0);
    CHECK(took < 5.0);
    transfer_status_t gone;
    CHECK_EQ(getTransferStatus(e, b, 0, &gone), 1); /* the batch is freed */
  }

  /* The same peer at once: the next READ, byte for byte, and a notification. */
  memset(buf, 0, REGION);
  b = allocateBatchID(e, 1024);
  CHECK_EQ(submitTransfer(e, b, &whole, 1), 0);
  deadline = mc_now() + 60;
  do {
    CHECK_EQ(getTransferStatus(e, b, 0, &s), 0);
  } while ((s.status == STATUS_WAITING || s.status == STATUS_PENDING) && mc_now() < deadline);
  CHECK_EQ(s.status, STATUS_COMPLETED);
  CHECK_EQ(s.transferred_bytes, REGION);
  CHECK_EQ(freeBatchID(e, b), 0);
  size_t wrong = 0;
  for (size_t i = 0; i < REGION; i++) wrong += buf[i] != pattern(i);
  CHECK_EQ(wrong, 0);
  notify_msg_t m = {(char *)"A", (char *)"after-release"};
  CHECK_EQ(genNotifyInEngine(e, (uint64_t)seg, m), 0);

  /* Mooncake's answer on request: "batch busy", the batch kept. */
  setenv("PDX_FREE_BATCH_IN_FLIGHT", "busy", 1);
  char other[64];
  uint8_t *small = aligned_alloc(4096, REGION);
  CHECK(small != NULL);
  memset(small, 0, REGION);
  transfer_engine_t busy = start(other, small);
  unsetenv("PDX_FREE_BATCH_IN_FLIGHT");
  int seg2 = openSegment(busy, peer);
  transfer_request_t r2 = {OPCODE_READ, small, seg2, remote, REGION};
  b = allocateBatchID(busy, 1);
  CHECK_EQ(submitTransfer(busy, b, &r2, 1), 0);
  int rc = freeBatchID(busy, b);
  CHECK(rc == 4 || rc == 0); /* 0 only when the READ finished first */
  if (rc == 4) CHECK_REASON("PDX_FREE_BATCH_IN_FLIGHT=busy");
  deadline = mc_now() + 60;
  while (rc == 4 && mc_now() < deadline) {
    mc_sleep_ms(5);
    rc = freeBatchID(busy, b);
  }
  CHECK_EQ(rc, 0);
  CHECK_EQ(unregisterLocalMemory(busy, small), 0);
  destroyTransferEngine(busy);
  free(small);

  CHECK_EQ(unregisterLocalMemory(e, buf), 0);
  destroyTransferEngine(e);
  free(buf);
  CHECK(write(t.down, "x", 1) == 1);
  int status = 0;
  CHECK(waitpid(t.pid, &status, 0) == t.pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
  setenv("MC_FORCE_TCP", "1", 1);
  /* Both targets forked before this process has engine threads. */
  struct target tcp = fork_target("off");
  struct target link = fork_target("auto");
  release_in_flight(tcp, "off");
  release_in_flight(link, "auto");
  return mc_finish("test_mc_release");
}
