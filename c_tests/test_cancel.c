/* pdx_batch_cancel and pdx_task_cancel through the C ABI, between two
 * engines of this process over TCP (PDX_SAME_HOST=off): a 64 MiB READ
 * cancelled in flight writes no byte into its buffer after the call
 * returned (the buffer is filled right after and compared after 1 s); one
 * task of a batch cancelled while the others complete, byte for byte;
 * states, counts, errors and texts; bad handles, indexes and NULLs. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <unistd.h>

#include "harness.h"

#define REGION ((size_t)64 << 20)
#define FILL 0xA5

static uint8_t pattern(size_t i) { return (uint8_t)((i * 131u + (i >> 12)) & 0x7f); }

static size_t differing(const uint8_t *p, size_t n, uint8_t byte) {
  size_t d = 0;
  for (size_t i = 0; i < n; i++) d += p[i] != byte;
  return d;
}

int main(void) {
  setenv("PDX_SAME_HOST", "off", 1);
  pdx_engine *a = start_engine(), *b = start_engine();
  uint8_t *remote = malloc(REGION), *local = malloc(REGION);
  CHECK(remote != NULL && local != NULL);
  for (size_t i = 0; i < REGION; i++) remote[i] = pattern(i);
  memset(local, 0, REGION);
  CHECK_OK(pdx_register_memory(b, remote, REGION));
  CHECK_OK(pdx_register_memory(a, local, REGION));
  const char *sb = pdx_engine_session_id(b);

  /* Warm (lanes open), then a whole READ cancelled in flight. */
  void *locals[4] = {local};
  uint64_t remotes[4] = {(uint64_t)(uintptr_t)remote};
  size_t lens[4] = {4096};
  uint64_t id = 0;
  int32_t st = -1;
  CHECK_OK(pdx_batch_submit(a, sb, PDX_OPCODE_READ, locals, remotes, lens, 1, NULL, NULL, &id));
  CHECK_OK(pdx_batch_wait(a, id, 30000, &st));
  CHECK_OK(pdx_batch_free(a, id));
  lens[0] = REGION;
  CHECK_OK(pdx_batch_submit(a, sb, PDX_OPCODE_READ, locals, remotes, lens, 1, NULL, NULL, &id));
  pdx_batch_summary s = {0};
  /* On the wire: its first pieces arrived. */
  for (double by = now_s() + 30; s.bytes == 0 && now_s() < by;) CHECK_OK(pdx_batch_status(a, id, &s));
  size_t cancelled = 0;
  double t0 = now_s();
  CHECK_OK(pdx_batch_cancel(a, id, &cancelled));
  double took = now_s() - t0;
  memset(local, FILL, REGION);
  CHECK(cancelled == 1);
  CHECK_OK(pdx_batch_wait(a, id, 0, &st));
  CHECK(st == PDX_TASK_CANCELED);
  CHECK_OK(pdx_batch_status(a, id, &s));
  CHECK(s.state == PDX_TASK_CANCELED && s.total == 1 && s.completed == 0 && s.failed == 0);
  int32_t ts = -1;
  pdx_status err = PDX_OK;
  CHECK_OK(pdx_task_status(a, id, 0, &ts, NULL, &err));
  CHECK(ts == PDX_TASK_CANCELED && err == PDX_ERR_CANCELED);
  char text[128];
  CHECK_OK(pdx_task_error_message(a, id, 0, text, sizeof text, NULL));
  CHECK_STR(text, "canceled by the caller");
  CHECK_STR(pdx_status_str(PDX_ERR_CANCELED), "canceled by the caller");
  CHECK_OK(pdx_batch_cancel(a, id, &cancelled)); /* again: nothing more */
  CHECK(cancelled == 0);
  CHECK_OK(pdx_batch_free(a, id));
  CHECK_STATUS(pdx_batch_cancel(a, id, NULL), PDX_ERR_INVALID_HANDLE);
  sleep(1);
  size_t late = differing(local, REGION, FILL);
  printf("pdx_batch_cancel of a 64 MiB READ with %llu bytes in: %.2f ms; %zu late bytes in 1 s\n",
         (unsigned long long)s.bytes, took * 1e3, late);
  CHECK(late == 0);

  /* One task of four cancelled; the other three complete byte for byte. */
  memset(local, 0, REGION);
  for (int k = 0; k < 4; k++) {
    locals[k] = local + (size_t)k * (REGION / 4);
    remotes[k] = (uint64_t)(uintptr_t)(remote + (size_t)k * (REGION / 4));
    lens[k] = REGION / 4;
  }
  CHECK_OK(pdx_batch_submit(a, sb, PDX_OPCODE_READ, locals, remotes, lens, 4, NULL, NULL, &id));
  CHECK_OK(pdx_task_cancel(a, id, 2, &ts));
  uint8_t *third = local + 2 * (REGION / 4);
  int third_cancelled = ts == PDX_TASK_CANCELED; /* else it completed first */
  if (third_cancelled) memset(third, FILL, REGION / 4);
  CHECK(ts == PDX_TASK_CANCELED || ts == PDX_TASK_COMPLETED);
  CHECK_STATUS(pdx_task_cancel(a, id, 4, &ts), PDX_ERR_INDEX_OUT_OF_RANGE);
  CHECK_OK(pdx_batch_wait(a, id, 60000, &st));
  CHECK(st == (third_cancelled ? PDX_TASK_CANCELED : PDX_TASK_COMPLETED));
  CHECK_OK(pdx_batch_status(a, id, &s));
  CHECK(s.completed == (third_cancelled ? 3u : 4u) && s.failed == 0);
  sleep(1);
  for (int k = 0; k < 4; k++) {
    if (k == 2 && third_cancelled) {
      CHECK(differing(third, REGION / 4, FILL) == 0);
      continue;
    }
    size_t wrong = 0, base = (size_t)k * (REGION / 4);
    for (size_t i = 0; i < REGION / 4; i++) wrong += local[base + i] != pattern(base + i);
    CHECK(wrong == 0);
  }
  CHECK_OK(pdx_task_cancel(a, id, 0, &ts)); /* completed: stays so */
  CHECK(ts == PDX_TASK_COMPLETED);
  CHECK_OK(pdx_batch_free(a, id));

  /* Handles checked, NULL engine refused, NULL out-params allowed. */
  CHECK_STATUS(pdx_batch_cancel(NULL, id, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_task_cancel(a, 0, 0, NULL), PDX_ERR_INVALID_HANDLE);
  pdx_stats stats = {.size = sizeof stats};
  CHECK_OK(pdx_engine_stats(a, &stats));
  CHECK(stats.tasks_canceled == 1u + (unsigned)third_cancelled && stats.tasks_failed == 0);

  CHECK_OK(pdx_unregister_memory(a, local));
  CHECK_OK(pdx_unregister_memory(b, remote));
  pdx_engine_free(a);
  pdx_engine_free(b);
  free(remote);
  free(local);
  return pdx_test_finish("test_cancel");
}
