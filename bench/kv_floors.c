/* The KV API's speed floors, through the C ABI on loopback:
 *  1. planning the 32k-token Qwen3-8B handoff (72 buffers x 2048 pages of
 *     32 KiB, about 200 runs) with pdx_kv_plan_new + pdx_kv_plan_requests:
 *     median of 101 runs (floor: under 5 ms);
 *  2. pdx_kv_transfer_sync against pdx_batch_transfer_sync_write given the
 *     same blocks (one per run per buffer), alternating which goes first:
 *     medians of 9 each (floor: kv >= 0.9 x batch).
 *
 *   cmake --build build --target kv_floors && RUST_LOG=off ./build/kv_floors [pages moved, default 512]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pdx.h"

#define BUFFERS 72
#define PAGE_BYTES (16u * 8u * 128u * 2u) /* 16 tokens x 8 KV heads x 128 x bf16 */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void die(const char *what) {
  fprintf(stderr, "%s: %s\n", what, pdx_last_error_message());
  exit(1);
}

/* Runs of 10 pages, every other block of 10 on the source side. */
static void page_map(int32_t *src, int32_t *dst, int pages) {
  for (int i = 0; i < pages; i++) src[i] = (i / 10) * 20 + i % 10, dst[i] = i;
}

static void layout(pdx_kv_buffer *b, uint64_t base, uint64_t pool) {
  for (int i = 0; i < BUFFERS; i++) b[i] = (pdx_kv_buffer){base + (uint64_t)i * PAGE_BYTES * pool, PAGE_BYTES, pool};
}

int main(int argc, char **argv) {
  int32_t *src = malloc(2048 * sizeof *src), *dst = malloc(2048 * sizeof *dst);
  pdx_kv_buffer l[BUFFERS], r[BUFFERS];
  page_map(src, dst, 2048);
  layout(l, 1ull << 32, 4200);
  layout(r, 9ull << 32, 4200);
  double t[101];
  size_t n = 0;
  for (int k = 0; k < 101; k++) {
    pdx_kv_plan *p;
    double t0 = now();
    if (pdx_kv_plan_new(l, r, BUFFERS, src, dst, 2048, NULL, &p) != PDX_OK) die("pdx_kv_plan_new");
    if (pdx_kv_plan_requests(p, 0, BUFFERS, &n) != PDX_OK) die("pdx_kv_plan_requests");
    t[k] = now() - t0;
    pdx_kv_plan_free(p);
  }
  qsort(t, 101, sizeof t[0], by_value);
  printf("planning 72 buffers x 2048 pages -> %zu requests: median %.3f ms, max %.3f ms (101 runs)\n", n,
         t[50] * 1e3, t[100] * 1e3);

  int moved = argc > 1 ? atoi(argv[1]) : 512;
  if (moved < 1 || moved > 2048) moved = 512;
  uint64_t pool = 2 * (uint64_t)moved;
  size_t bytes = (size_t)(BUFFERS * pool * PAGE_BYTES);
  unsigned char *lp = malloc(bytes), *rp = calloc(1, bytes);
  memset(lp, 0x5a, bytes);
  pdx_engine *a, *b;
  if (pdx_engine_init("127.0.0.1", "tcp", NULL, &a) != PDX_OK || pdx_engine_init("127.0.0.1", "tcp", NULL, &b) != PDX_OK)
    die("pdx_engine_init");
  if (pdx_register_memory(a, lp, bytes) != PDX_OK || pdx_register_memory(b, rp, bytes) != PDX_OK)
    die("pdx_register_memory");
  layout(l, (uint64_t)(uintptr_t)lp, pool);
  layout(r, (uint64_t)(uintptr_t)rp, pool);
  page_map(src, dst, moved);
  pdx_kv_plan *plan;
  if (pdx_kv_plan_new(l, r, BUFFERS, src, dst, (size_t)moved, NULL, &plan) != PDX_OK) die("pdx_kv_plan_new");
  if (pdx_kv_plan_requests(plan, 0, BUFFERS, &n) != PDX_OK) die("pdx_kv_plan_requests");
  /* The same blocks by hand: one per run per buffer. */
  void **locals = malloc(n * sizeof *locals);
  uint64_t *remotes = malloc(n * sizeof *remotes);
  size_t *lens = malloc(n * sizeof *lens), k = 0;
  for (int buf = 0; buf < BUFFERS; buf++) {
    for (int s = 0, i = 1; i <= moved; i++) {
      if (i < moved && src[i] == src[i - 1] + 1 && dst[i] == dst[i - 1] + 1) continue;
      locals[k] = (void *)(uintptr_t)(l[buf].base + (uint64_t)src[s] * PAGE_BYTES);
      remotes[k] = r[buf].base + (uint64_t)dst[s] * PAGE_BYTES;
      lens[k++] = (size_t)(i - s) * PAGE_BYTES;
      s = i;
    }
  }
  const char *peer = pdx_engine_session_id(b);
  double kv[9], batch[9];
  for (int it = 0; it < 9; it++) {
    for (int turn = 0; turn < 2; turn++) {
      int kv_turn = (turn + it) % 2 == 0;
      double t0 = now();
      pdx_status s = kv_turn ? pdx_kv_transfer_sync(a, peer, plan, PDX_OPCODE_WRITE)
                             : pdx_batch_transfer_sync_write(a, peer, locals, remotes, lens, k);
      if (s != PDX_OK) die(kv_turn ? "pdx_kv_transfer_sync" : "pdx_batch_transfer_sync_write");
      (kv_turn ? kv : batch)[it] = now() - t0;
    }
  }
  qsort(kv, 9, sizeof kv[0], by_value);
  qsort(batch, 9, sizeof batch[0], by_value);
  double gb = (double)BUFFERS * moved * PAGE_BYTES / 1e9;
  printf("moving %.2f GB in %zu requests (%zu by hand): pdx_kv_transfer_sync %.1f ms (%.2f GB/s), "
         "pdx_batch_transfer_sync_write %.1f ms (%.2f GB/s): ratio %.3f\n",
         gb, n, k, kv[4] * 1e3, gb / kv[4], batch[4] * 1e3, gb / batch[4], batch[4] / kv[4]);
  if (memcmp(lp + (size_t)src[0] * PAGE_BYTES, rp + (size_t)dst[0] * PAGE_BYTES, PAGE_BYTES) != 0) die("verify");
  pdx_kv_plan_free(plan);
  pdx_engine_free(a);
  pdx_engine_free(b);
  free(locals);
  free(remotes);
  free(lens);
  free(lp);
  free(rp);
  free(src);
  free(dst);
  return 0;
}
