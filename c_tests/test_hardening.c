/* Hardening through the C ABI (issue #11): bogus lengths and oversized
 * batches are refused before anything proportional to them is allocated,
 * and the notification of an asynchronous batch that the peer refused (its
 * byte budget is full) is readable through pdx_batch_notify_error. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
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

int main(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  setenv("PDX_NOTIFY_QUEUE_BYTES", "4096", 1);
  pdx_engine *a = start_engine();
  pdx_engine *b = start_engine();
  test_huge_lengths_and_batches(a, b);
  test_notify_error_is_readable(a, b);
  pdx_engine_free(a);
  pdx_engine_free(b);
  return pdx_test_finish("test_hardening");
}
