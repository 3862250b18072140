/* Mooncake's C API on pdx against pdx's own C ABI, side by side in one run:
 * the same native engine underneath, so any difference is what the C API
 * layer adds (segment and task bookkeeping, per-task status polls as NIXL
 * does them; pdx's side is timed both waiting and polling the same way).
 * Both ABIs come from the one libtransfer_engine.so (it carries
 * pdx_* too), two engines each, over loopback; rounds alternate, median of
 * ROUNDS. Build: cmake --build build --target mc_api_overhead, then run
 * build/mc_api_overhead. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pdx.h"
#include "transfer_engine_c.h"

#define ROUNDS 9
#define REGION (64u << 20)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void die(const char *what) {
  fprintf(stderr, "%s: %s\n", what, pdx_last_error_message());
  exit(1);
}

/* pdx's ABI: one batch of n entries of `each` bytes; then either wait
 * (pdx_batch_wait, blocking) or poll every task as the Mooncake side does
 * (pdx_task_status), then free. */
static double pdx_round(pdx_engine *e, const char *peer, uint8_t *src, uint8_t *dst, size_t n, size_t each,
                        int poll) {
  static void *locals[256];
  static uint64_t remotes[256];
  static size_t lens[256];
  for (size_t i = 0; i < n; i++) {
    locals[i] = src + i * each;
    remotes[i] = (uint64_t)(uintptr_t)(dst + i * each);
    lens[i] = each;
  }
  double t0 = now();
  uint64_t b;
  int32_t state;
  if (pdx_batch_submit(e, peer, PDX_OPCODE_WRITE, locals, remotes, lens, n, NULL, NULL, &b) != PDX_OK) die("submit");
  if (poll) {
    for (;;) {
      int busy = 0;
      for (size_t t = 0; t < n; t++) {
        if (pdx_task_status(e, b, t, &state, NULL, NULL) != PDX_OK || state == PDX_TASK_FAILED) die("task");
        if (state == PDX_TASK_PENDING) {
          busy = 1;
          break;
        }
      }
      if (!busy) break;
    }
  } else if (pdx_batch_wait(e, b, 60000, &state) != PDX_OK || state != PDX_TASK_COMPLETED) {
    die("wait");
  }
  double t = now() - t0;
  pdx_batch_free(e, b);
  return t;
}

/* Mooncake's API as NIXL drives it: allocate, submit, poll every task, free. */
static double mc_round(transfer_engine_t e, int seg, uint8_t *src, uint8_t *dst, size_t n, size_t each) {
  static transfer_request_t req[256];
  for (size_t i = 0; i < n; i++)
    req[i] = (transfer_request_t){OPCODE_WRITE, src + i * each, seg, (uint64_t)(uintptr_t)(dst + i * each), each};
  double t0 = now();
  uint64_t b = allocateBatchID(e, 1024);
  if (submitTransfer(e, b, req, n) != 0) die("submitTransfer");
  for (;;) {
    int busy = 0;
    for (size_t t = 0; t < n; t++) {
      transfer_status_t s;
      if (getTransferStatus(e, b, t, &s) != 0 || s.status == STATUS_FAILED) die("getTransferStatus");
      if (s.status == STATUS_WAITING || s.status == STATUS_PENDING) {
        busy = 1;
        break;
      }
    }
    if (!busy) break;
  }
  if (freeBatchID(e, b) != 0) die("freeBatchID");
  return now() - t0;
}

int main(void) {
  setenv("MC_FORCE_TCP", "1", 1);
  uint8_t *src = aligned_alloc(4096, REGION), *dst = aligned_alloc(4096, REGION);
  uint8_t *src2 = aligned_alloc(4096, REGION), *dst2 = aligned_alloc(4096, REGION);
  memset(src, 1, REGION);
  memset(dst, 0, REGION);
  memset(src2, 2, REGION);
  memset(dst2, 0, REGION);
  pdx_engine *pa, *pb;
  if (pdx_engine_init("127.0.0.1", "tcp", NULL, &pa) != PDX_OK || pdx_engine_init("127.0.0.1", "tcp", NULL, &pb))
    die("pdx_engine_init");
  pdx_register_memory(pa, src, REGION);
  pdx_register_memory(pb, dst, REGION);
  transfer_engine_t ma = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  transfer_engine_t mb = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  if (!ma || !mb) die("createTransferEngine");
  registerLocalMemory(ma, src2, REGION, "*", 1);
  registerLocalMemory(mb, dst2, REGION, "*", 1);
  char name[64];
  getLocalIpAndPort(mb, name, sizeof name);
  int seg = openSegment(ma, name);
  if (seg < 0) die("openSegment");
  const char *peer = pdx_engine_session_id(pb);

  struct { const char *what; size_t n, each; } shapes[] = {{"64 MiB x 1", 1, REGION}, {"64 KiB x 256", 256, 64u << 10}};
  printf("%-14s %12s %12s %12s %10s\n", "batch", "pdx wait", "pdx poll", "Mooncake", "Mc/pdx poll");
  for (size_t s = 0; s < 2; s++) {
    size_t n = shapes[s].n, each = shapes[s].each;
    double tw[ROUNDS], tp[ROUNDS], tm[ROUNDS];
    pdx_round(pa, peer, src, dst, n, each, 0); /* warm-up: lanes open */
    mc_round(ma, seg, src2, dst2, n, each);
    for (int r = 0; r < ROUNDS; r++) {
      tw[r] = pdx_round(pa, peer, src, dst, n, each, 0);
      tp[r] = pdx_round(pa, peer, src, dst, n, each, 1);
      tm[r] = mc_round(ma, seg, src2, dst2, n, each);
    }
    qsort(tw, ROUNDS, sizeof(double), cmp);
    qsort(tp, ROUNDS, sizeof(double), cmp);
    qsort(tm, ROUNDS, sizeof(double), cmp);
    double bytes = (double)n * (double)each;
    double gw = bytes / tw[ROUNDS / 2] / 1e9, gp = bytes / tp[ROUNDS / 2] / 1e9, gm = bytes / tm[ROUNDS / 2] / 1e9;
    printf("%-14s %12.2f %12.2f %12.2f %10.3f\n", shapes[s].what, gw, gp, gm, gm / gp);
  }
  destroyTransferEngine(ma);
  destroyTransferEngine(mb);
  pdx_engine_free(pa);
  pdx_engine_free(pb);
  return 0;
}
