/* uninstallTransport then installTransport on pdx's libtransfer_engine.so:
 *
 * - a batch of the old transport keeps its tasks' states (COMPLETED) after
 *   the new transport ran a batch of its own that FAILED; freeing the old one
 *   leaves the new one's state intact (pdx batch ids are never taken for
 *   another transport's);
 * - memory registered before is served by the new transport at once (a peer
 *   writes into it and reads from it, and it is the source of a transfer);
 *   registering it again, the same start and length, is 0 (Mooncake answers
 *   -7 there), a second time -7, and unregistering it is 0;
 * - between uninstall and install the old batch still answers, and a region
 *   unregistered then is not carried;
 * - unregisterLocalMemory of an address never registered is -3, not -200. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>

#include "harness.h"

#define REGION 65536

static transfer_engine_t start(char *name, size_t len) {
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  if (e == NULL) {
    fprintf(stderr, "createTransferEngine: %s\n", pdx_last_error_message());
    exit(1);
  }
  CHECK_EQ(getLocalIpAndPort(e, name, len), 0);
  return e;
}

/* Poll task `task` of `batch` until it leaves WAITING/PENDING; its state. */
static int settle(transfer_engine_t e, uint64_t batch, size_t task, uint64_t *bytes) {
  transfer_status_t s = {-1, 0};
  double deadline = mc_now() + 30;
  do {
    if (getTransferStatus(e, batch, task, &s) != 0) return -1;
  } while ((s.status == STATUS_WAITING || s.status == STATUS_PENDING) && mc_now() < deadline);
  if (bytes) *bytes = s.transferred_bytes;
  return s.status;
}

/* One `opcode` transfer of `len` bytes between `local` and `remote` in a
 * batch of its own, polled to its end; the batch is not freed. */
static uint64_t one(transfer_engine_t e, int seg, int opcode, uint8_t *local, uint64_t remote, size_t len, int *state) {
  uint64_t b = allocateBatchID(e, 4);
  CHECK(b != INVALID_BATCH);
  transfer_request_t r = {opcode, local, seg, remote, len};
  CHECK_EQ(submitTransfer(e, b, &r, 1), 0);
  *state = settle(e, b, 0, NULL);
  return b;
}

static void batches_and_regions_survive_a_reinstall(void) {
  char a_name[64], b_name[64];
  transfer_engine_t a = start(a_name, sizeof a_name), b = start(b_name, sizeof b_name);
  static uint8_t src[REGION], kept[REGION], dropped[REGION], target[REGION];
  CHECK_EQ(registerLocalMemory(a, src, sizeof src, "cpu:0", 1), 0);
  CHECK_EQ(registerLocalMemory(a, kept, sizeof kept, "*", 1), 0);
  CHECK_EQ(registerLocalMemory(a, dropped, sizeof dropped, "*", 1), 0);
  CHECK_EQ(registerLocalMemory(b, target, sizeof target, "*", 1), 0);
  int seg = openSegment(a, b_name);
  CHECK(seg > 0);

  /* Batch X on the first transport: completed, not freed. */
  memset(src, 0x11, sizeof src);
  int state = -1;
  uint64_t x = one(a, seg, OPCODE_WRITE, src, (uint64_t)(uintptr_t)target, 4096, &state);
  CHECK_EQ(state, STATUS_COMPLETED);
  CHECK(target[0] == 0x11 && target[4095] == 0x11);

  CHECK_EQ(uninstallTransport(a, "tcp"), 0);
  /* No transport: the old batch still answers, and a region can go. */
  uint64_t bytes = 0;
  CHECK_EQ(settle(a, x, 0, &bytes), STATUS_COMPLETED);
  CHECK_EQ(bytes, 4096);
  CHECK_EQ(unregisterLocalMemory(a, dropped), 0);
  CHECK_EQ(unregisterLocalMemory(a, dropped), -3);
  CHECK(installTransport(a, "tcp", NULL) != NULL);
  CHECK_EQ(getLocalIpAndPort(a, a_name, sizeof a_name), 0); /* new ports, new name */

  /* Batch Y on the new transport fails (outside the peer's memory); the
   * first batch of a fresh engine: the id pdx numbered X with too. */
  int y_state = -1;
  uint64_t y = one(a, seg, OPCODE_WRITE, src, (uint64_t)(uintptr_t)target + REGION, 4096, &y_state);
  CHECK(y != x);
  CHECK_EQ(y_state, STATUS_FAILED);
  CHECK_EQ(settle(a, x, 0, &bytes), STATUS_COMPLETED); /* X is X, not Y */
  CHECK_EQ(bytes, 4096);
  CHECK_EQ(freeBatchID(a, x), 0);
  CHECK_EQ(settle(a, y, 0, NULL), STATUS_FAILED); /* Y's result is intact */
  CHECK_EQ(freeBatchID(a, y), 0);
  transfer_status_t s;
  CHECK_EQ(getTransferStatus(a, x, 0, &s), 1); /* freed */

  /* The carried source serves the new transport: a write from it lands. */
  memset(src, 0x22, sizeof src);
  uint64_t z = one(a, seg, OPCODE_WRITE, src, (uint64_t)(uintptr_t)target, sizeof src, &state);
  CHECK_EQ(state, STATUS_COMPLETED);
  CHECK(target[0] == 0x22 && target[REGION - 1] == 0x22);
  CHECK_EQ(freeBatchID(a, z), 0);

  /* The peer reaches the carried regions through the new transport. */
  int back = openSegment(b, a_name);
  CHECK(back > 0);
  memset(kept, 0x33, sizeof kept);
  memset(target, 0, sizeof target);
  uint64_t r = one(b, back, OPCODE_READ, target, (uint64_t)(uintptr_t)kept, sizeof kept, &state);
  CHECK_EQ(state, STATUS_COMPLETED);
  CHECK(target[0] == 0x33 && target[REGION - 1] == 0x33);
  CHECK_EQ(freeBatchID(b, r), 0);
  memset(target, 0x44, sizeof target);
  uint64_t w = one(b, back, OPCODE_WRITE, target, (uint64_t)(uintptr_t)kept, 128, &state);
  CHECK_EQ(state, STATUS_COMPLETED);
  CHECK(kept[0] == 0x44 && kept[127] == 0x44 && kept[128] == 0x33);
  CHECK_EQ(freeBatchID(b, w), 0);
  /* A region unregistered before the install is not served. */
  w = one(b, back, OPCODE_WRITE, target, (uint64_t)(uintptr_t)dropped, 128, &state);
  CHECK_EQ(state, STATUS_FAILED);
  CHECK_EQ(freeBatchID(b, w), 0);

  /* Registering a carried region again: 0 (Mooncake: -7); then as ever. */
  CHECK_EQ(registerLocalMemory(a, kept, sizeof kept, "*", 1), 0);
  CHECK_EQ(registerLocalMemory(a, kept, sizeof kept, "*", 1), -7);
  CHECK_EQ(registerLocalMemory(a, src, 4096, "*", 1), -7); /* not the same length: it overlaps */
  buffer_entry_t twice[2] = {{src, sizeof src}, {src, sizeof src}};
  CHECK_EQ(registerLocalMemoryBatch(a, twice, 2, "*"), -7);
  CHECK_EQ(unregisterLocalMemory(a, kept), 0);
  CHECK_EQ(unregisterLocalMemory(a, src), 0);
  CHECK_EQ(unregisterLocalMemory(a, src), -3);
  w = one(b, back, OPCODE_WRITE, target, (uint64_t)(uintptr_t)kept, 128, &state);
  CHECK_EQ(state, STATUS_FAILED); /* unregistered: no longer served */
  CHECK_EQ(freeBatchID(b, w), 0);

  /* Twice more: no id of an earlier transport is ever asked of a later one. */
  for (int round = 0; round < 2; round++) {
    CHECK_EQ(registerLocalMemory(a, src, sizeof src, "*", 1), 0);
    uint64_t before = one(a, seg, OPCODE_WRITE, src, (uint64_t)(uintptr_t)target, 64, &state);
    CHECK_EQ(state, STATUS_COMPLETED);
    CHECK_EQ(uninstallTransport(a, "tcp"), 0);
    CHECK(installTransport(a, "tcp", NULL) != NULL);
    uint64_t after = one(a, seg, OPCODE_WRITE, src, (uint64_t)(uintptr_t)target + REGION, 64, &state);
    CHECK_EQ(state, STATUS_FAILED);
    CHECK_EQ(settle(a, before, 0, NULL), STATUS_COMPLETED);
    CHECK_EQ(freeBatchID(a, before), 0);
    CHECK_EQ(settle(a, after, 0, NULL), STATUS_FAILED);
    CHECK_EQ(freeBatchID(a, after), 0);
    CHECK_EQ(unregisterLocalMemory(a, src), 0);
  }
  CHECK_EQ(unregisterLocalMemory(b, target), 0);
  destroyTransferEngine(a);
  destroyTransferEngine(b);
}

/* A batch in flight when its transport goes reads FAILED afterwards, with
 * its reason; the batch can be freed. */
static void a_batch_in_flight_is_failed_by_the_uninstall(void) {
  char a_name[64], b_name[64];
  transfer_engine_t a = start(a_name, sizeof a_name), b = start(b_name, sizeof b_name);
  size_t big = 64u << 20;
  uint8_t *src = malloc(big), *dst = malloc(big);
  CHECK(src != NULL && dst != NULL);
  memset(src, 5, big);
  CHECK_EQ(registerLocalMemory(a, src, big, "*", 1), 0);
  CHECK_EQ(registerLocalMemory(b, dst, big, "*", 1), 0);
  int seg = openSegment(a, b_name);
  uint64_t batch = allocateBatchID(a, 64);
  transfer_request_t req[64];
  for (size_t i = 0; i < 64; i++)
    req[i] = (transfer_request_t){OPCODE_WRITE, src + i * (big / 64), seg, (uint64_t)(uintptr_t)dst + i * (big / 64),
                                  big / 64};
  CHECK_EQ(submitTransfer(a, batch, req, 64), 0);
  CHECK_EQ(uninstallTransport(a, "tcp"), 0);
  int completed = 0, failed = 0;
  for (size_t t = 0; t < 64; t++) {
    int st = settle(a, batch, t, NULL);
    if (st == STATUS_COMPLETED) completed++;
    if (st == STATUS_FAILED) failed++;
  }
  CHECK_EQ(completed + failed, 64); /* every task is terminal, none in flight */
  if (failed > 0) CHECK(strlen(pdx_last_error_message()) > 0);
  CHECK_EQ(freeBatchID(a, batch), 0);
  CHECK(installTransport(a, "tcp", NULL) != NULL);
  CHECK_EQ(unregisterLocalMemory(a, src), 0);
  CHECK_EQ(unregisterLocalMemory(b, dst), 0);
  destroyTransferEngine(a);
  destroyTransferEngine(b);
  free(src);
  free(dst);
}

static void never_registered_is_minus_3(void) {
  char a_name[64], b_name[64];
  transfer_engine_t a = start(a_name, sizeof a_name), b = start(b_name, sizeof b_name);
  static uint8_t mine[4096], theirs[4096];
  CHECK_EQ(unregisterLocalMemory(a, mine), -3); /* nothing registered at all */
  CHECK_REASON("no registered region starts at");
  CHECK_EQ(registerLocalMemory(b, theirs, sizeof theirs, "*", 1), 0);
  CHECK_EQ(unregisterLocalMemory(a, theirs), -3); /* another engine's region */
  void *list[1] = {theirs};
  CHECK_EQ(unregisterLocalMemoryBatch(a, list, 1), -3);
  CHECK_EQ(registerLocalMemory(a, mine, sizeof mine, "*", 1), 0);
  CHECK_EQ(unregisterLocalMemory(a, mine + 1), -3); /* inside, not the start */
  CHECK_EQ(unregisterLocalMemory(a, mine), 0);
  CHECK_EQ(unregisterLocalMemory(a, mine), -3); /* twice */
  CHECK_EQ(unregisterLocalMemory(b, theirs), 0);
  destroyTransferEngine(a);
  destroyTransferEngine(b);
}

int main(void) {
  setenv("MC_FORCE_TCP", "1", 1);
  batches_and_regions_survive_a_reinstall();
  a_batch_in_flight_is_failed_by_the_uninstall();
  never_registered_is_minus_3();
  return mc_finish("test_mc_reinstall");
}
