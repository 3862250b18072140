/* The Mooncake backend through the real pdx C ABI, against the TEST DOUBLE of
 * Mooncake's C API (c_tests/mooncake_double/fake_transfer_engine.c) loaded
 * through PDX_MOONCAKE_LIB. Proves the marshalling: strings, arrays, batch
 * ids, status polling, errors. The test reads what the double recorded by
 * opening the same library (dlopen returns the instance pdx loaded). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#include "harness.h"

#ifndef FAKE_TE_LIB
#error "CMake passes FAKE_TE_LIB, the path of the test double"
#endif

static int (*te_calls)(const char *);
static int (*te_violations)(void);
static int (*te_live_batches)(void);
static int (*te_live_engines)(void);
static const char *(*te_last_topology)(void);
static const char *(*te_last_protocol)(void);
static const char *(*te_last_metadata)(void);
static const char *(*te_last_server_name)(void);
static size_t (*te_last_batch_register_count)(void);
static const char *(*te_last_location)(void);

static void open_double(void) {
  void *h = dlopen(FAKE_TE_LIB, RTLD_NOW);
  if (h == NULL) {
    fprintf(stderr, "cannot open the test double %s: %s\n", FAKE_TE_LIB, dlerror());
    exit(2);
  }
  *(void **)&te_calls = dlsym(h, "fake_te_calls");
  *(void **)&te_violations = dlsym(h, "fake_te_violations");
  *(void **)&te_live_batches = dlsym(h, "fake_te_live_batches");
  *(void **)&te_live_engines = dlsym(h, "fake_te_live_engines");
  *(void **)&te_last_topology = dlsym(h, "fake_te_last_topology");
  *(void **)&te_last_protocol = dlsym(h, "fake_te_last_protocol");
  *(void **)&te_last_metadata = dlsym(h, "fake_te_last_metadata");
  *(void **)&te_last_server_name = dlsym(h, "fake_te_last_server_name");
  *(void **)&te_last_batch_register_count = dlsym(h, "fake_te_last_batch_register_count");
  *(void **)&te_last_location = dlsym(h, "fake_te_last_location");
  if (!te_calls || !te_violations || !te_live_batches || !te_live_engines || !te_last_topology ||
      !te_last_protocol || !te_last_metadata || !te_last_server_name || !te_last_batch_register_count ||
      !te_last_location) {
    fprintf(stderr, "the test double lacks its inspection functions\n");
    exit(2);
  }
}

static int contains(const char *s, const char *part) { return s != NULL && strstr(s, part) != NULL; }

static void reason(const char *name, char *buf, size_t len) {
  size_t n = 0;
  CHECK_OK(pdx_backend_unavailable_reason(name, buf, len, &n));
  CHECK(n == strlen(buf) || n >= len);
}

static void test_availability_and_loader_errors(void) {
  char why[1024];
  CHECK(pdx_backend_available("tcp") == 1);
  CHECK(pdx_backend_available(NULL) == 0);
  CHECK(pdx_backend_available("infiniband") == 0);

  setenv("PDX_MOONCAKE_LIB", "/nonexistent/libtransfer_engine.so", 1);
  CHECK(pdx_backend_available("mooncake") == 0);
  reason("mooncake", why, sizeof why);
  CHECK(contains(why, "'/nonexistent/libtransfer_engine.so'"));
  CHECK(contains(why, "PDX_MOONCAKE_LIB"));
  pdx_engine *e = (pdx_engine *)(uintptr_t)0x77;
  CHECK_STATUS(pdx_engine_init("127.0.0.1", "rdma", NULL, &e), PDX_ERR_BACKEND_UNAVAILABLE);
  CHECK(contains(pdx_last_error_message(), "protocol 'rdma'"));
  CHECK(contains(pdx_last_error_message(), "/nonexistent/libtransfer_engine.so"));
  CHECK(e == (pdx_engine *)(uintptr_t)0x77);

  setenv("PDX_MOONCAKE_LIB", FAKE_TE_PARTIAL_LIB, 1);
  CHECK(pdx_backend_available("mooncake") == 0);
  reason("mooncake", why, sizeof why);
  CHECK(contains(why, "'submitTransferWithNotify'"));
  CHECK(contains(why, FAKE_TE_PARTIAL_LIB));

  setenv("PDX_MOONCAKE_LIB", FAKE_TE_LIB, 1);
  CHECK(pdx_backend_available("mooncake") == 1);
  reason("mooncake", why, sizeof why);
  CHECK_STR(why, "");
  /* Length query without a buffer. */
  size_t n = 1;
  CHECK_OK(pdx_backend_unavailable_reason("nope", NULL, 0, &n));
  CHECK(n > 10);
  CHECK_STATUS(pdx_backend_unavailable_reason(NULL, why, sizeof why, &n), PDX_ERR_NULL_ARGUMENT);
}

static void test_init_failures(void) {
  pdx_engine *e = NULL;
  /* The library cannot do efa: fail at once, naming protocol and library. */
  CHECK_STATUS(pdx_engine_init("127.0.0.1", "efa", "rdmap0s6", &e), PDX_ERR_BACKEND_UNAVAILABLE);
  CHECK(contains(pdx_last_error_message(), "'efa'"));
  CHECK(contains(pdx_last_error_message(), FAKE_TE_LIB));
  CHECK(contains(pdx_last_error_message(), "installTransport returned NULL"));
  CHECK_STR(te_last_protocol(), "efa");
  CHECK(e == NULL);
  CHECK(te_live_engines() == 0); /* the half-made engine was destroyed */

  CHECK_STATUS(pdx_engine_init("fail-create.example", "rdma", NULL, &e), PDX_ERR_BACKEND_UNAVAILABLE);
  CHECK(contains(pdx_last_error_message(), "createTransferEngine"));

  /* With efa built in, efa works. */
  setenv("FAKE_TE_PROTOCOLS", "tcp,rdma,efa", 1);
  CHECK_OK(pdx_engine_init("127.0.0.1", "efa", NULL, &e));
  CHECK_STR(pdx_engine_protocol(e), "efa");
  pdx_engine_free(e);
  unsetenv("FAKE_TE_PROTOCOLS");
  CHECK(te_live_engines() == 0);

  /* An unknown PDX_TCP_ENGINE value is refused. */
  setenv("PDX_TCP_ENGINE", "fast", 1);
  CHECK_STATUS(pdx_engine_init("127.0.0.1", "tcp", NULL, &e), PDX_ERR_INVALID_VALUE);
  CHECK(contains(pdx_last_error_message(), "PDX_TCP_ENGINE"));
  /* PDX_TCP_ENGINE=mooncake runs tcp on Mooncake's engine. */
  setenv("PDX_TCP_ENGINE", "mooncake", 1);
  CHECK_OK(pdx_engine_init("127.0.0.1", "tcp", NULL, &e));
  CHECK_STR(te_last_protocol(), "tcp");
  CHECK_STR(pdx_engine_protocol(e), "tcp");
  pdx_engine_free(e);
  unsetenv("PDX_TCP_ENGINE");
}

static void wait_done(pdx_engine *e, uint64_t id, int32_t expect) {
  pdx_batch_summary s;
  memset(&s, 0, sizeof s);
  int polls = 0;
  do {
    CHECK_OK(pdx_batch_status(e, id, &s));
  } while (s.state == PDX_TASK_PENDING && ++polls < 100000);
  CHECK(s.state == expect);
  int32_t state = -1;
  CHECK_OK(pdx_batch_wait(e, id, 1000, &state));
  CHECK(state == expect);
}

static void test_transfers(void) {
  pdx_engine *a = NULL, *b = NULL;
  int discover_before = te_calls("discoverTopology");
  CHECK_OK(pdx_engine_init("127.0.0.1", "rdma", "mlx5_0, mlx5_1", &a));
  CHECK_STR(te_last_metadata(), "P2PHANDSHAKE");
  CHECK_STR(te_last_server_name(), "127.0.0.1");
  CHECK_STR(te_last_protocol(), "rdma");
  CHECK(contains(te_last_topology(), "\"cpu:0\":[[\"mlx5_0\",\"mlx5_1\"],[]]"));
  CHECK(te_calls("discoverTopology") == discover_before); /* devices given: no discovery */
  CHECK_OK(pdx_engine_init("127.0.0.1", "rdma", NULL, &b));
  CHECK_STR(te_last_topology(), "");
  CHECK(te_calls("discoverTopology") == discover_before + 1);
  CHECK_STR(pdx_engine_protocol(a), "rdma");
  const char *sa = pdx_engine_session_id(a), *sb = pdx_engine_session_id(b);
  CHECK(contains(sa, "127.0.0.1:") && contains(sb, "127.0.0.1:") && strcmp(sa, sb) != 0);
  char expect_sid[64];
  snprintf(expect_sid, sizeof expect_sid, "127.0.0.1:%u", (unsigned)pdx_engine_rpc_port(b));
  CHECK_STR(sb, expect_sid);

  static unsigned char src[4096], dst1[2048], dst2[2048], back[4096];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 7 + 3);
  CHECK_OK(pdx_register_memory(a, src, sizeof src));
  CHECK_STR(te_last_location(), "*");
  /* An explicit location reaches Mooncake as given. */
  CHECK_OK(pdx_register_memory_at(a, back, sizeof back, "cpu:1"));
  CHECK_STR(te_last_location(), "cpu:1");
  void *bufs[2] = {dst1, dst2};
  size_t lens[2] = {sizeof dst1, sizeof dst2};
  CHECK_OK(pdx_batch_register_memory(b, bufs, lens, 2));
  CHECK(te_last_batch_register_count() == 2);
  CHECK_STR(te_last_location(), "*");
  CHECK_STATUS(pdx_register_memory(b, dst1 + 10, 10), PDX_ERR_ADDRESS_OVERLAP);
  CHECK_STATUS(pdx_register_memory(b, dst1, 0), PDX_ERR_ADDRESS_OVERLAP);
  CHECK_STATUS(pdx_unregister_memory(b, dst1 + 1), PDX_ERR_NOT_FOUND);

  /* Sync write then read back. */
  CHECK_OK(pdx_transfer_sync_write(a, sb, src, (uint64_t)(uintptr_t)dst1, 1024));
  CHECK(memcmp(dst1, src, 1024) == 0);
  CHECK_OK(pdx_transfer_sync_read(a, sb, back, (uint64_t)(uintptr_t)dst1, 1024));
  CHECK(memcmp(back, src, 1024) == 0);

  /* Arrays: three entries, one of length zero (never submitted). */
  void *locals[3] = {src + 100, src + 200, src + 300};
  uint64_t remotes[3] = {(uint64_t)(uintptr_t)dst2, (uint64_t)(uintptr_t)(dst2 + 500), (uint64_t)(uintptr_t)(dst1 + 1500)};
  size_t blens[3] = {400, 0, 300};
  CHECK_OK(pdx_batch_transfer_sync_write(a, sb, locals, remotes, blens, 3));
  CHECK(memcmp(dst2, src + 100, 400) == 0 && memcmp(dst1 + 1500, src + 300, 300) == 0);

  /* Errors: remote range not registered (task FAILED), local range not
   * registered (submit refused), unknown peer. */
  CHECK_STATUS(pdx_transfer_sync_write(a, sb, src, (uint64_t)(uintptr_t)(dst1 + 2000), 100), PDX_ERR_CONNECTION_LOST);
  CHECK(contains(pdx_last_error_message(), "FAILED"));
  static unsigned char stray[64];
  CHECK_STATUS(pdx_transfer_sync_write(a, sb, stray, (uint64_t)(uintptr_t)dst1, 64), PDX_ERR_ADDRESS_NOT_REGISTERED);
  CHECK(contains(pdx_last_error_message(), "submitTransfer"));
  CHECK_STATUS(pdx_transfer_sync_write(a, "10.9.9.9:1", src, (uint64_t)(uintptr_t)dst1, 8), PDX_ERR_PEER_UNREACHABLE);
  CHECK(contains(pdx_last_error_message(), "10.9.9.9:1"));

  /* Async batch with a notification. */
  uint64_t id = 0;
  CHECK_OK(pdx_batch_submit(a, sb, PDX_OPCODE_WRITE, locals, remotes, blens, 3, "kv", "room-42", &id));
  CHECK(id != 0);
  wait_done(a, id, PDX_TASK_COMPLETED);
  pdx_batch_summary s;
  CHECK_OK(pdx_batch_status(a, id, &s));
  CHECK(s.total == 3 && s.completed == 3 && s.failed == 0 && s.bytes == 700);
  int32_t st = -1;
  uint64_t bytes = 0;
  pdx_status err = -99;
  CHECK_OK(pdx_task_status(a, id, 1, &st, &bytes, &err));
  CHECK(st == PDX_TASK_COMPLETED && bytes == 0 && err == PDX_OK);
  CHECK_STATUS(pdx_task_status(a, id, 3, &st, NULL, NULL), PDX_ERR_INDEX_OUT_OF_RANGE);
  CHECK_OK(pdx_batch_free(a, id));
  CHECK_STATUS(pdx_batch_status(a, id, &s), PDX_ERR_INVALID_HANDLE);
  CHECK_STATUS(pdx_batch_free(a, id), PDX_ERR_INVALID_HANDLE);
  CHECK_STATUS(pdx_batch_free(a, 0), PDX_ERR_INVALID_HANDLE);
  CHECK_STATUS(pdx_batch_status(a, 0xdeadbeef, &s), PDX_ERR_INVALID_HANDLE);
  pdx_notifications *nl = NULL;
  CHECK_OK(pdx_notifications_drain(b, &nl));
  CHECK(pdx_notifications_count(nl) == 1);
  const char *nn = NULL, *nm = NULL;
  CHECK_OK(pdx_notification_get(nl, 0, &nn, &nm));
  CHECK_STR(nn, "kv");
  CHECK_STR(nm, "room-42");
  pdx_notifications_free(nl);

  /* In flight: wait times out, free is Busy; once done, both succeed. */
  setenv("FAKE_TE_HANG", "1", 1);
  CHECK_OK(pdx_batch_submit(a, sb, PDX_OPCODE_READ, locals, remotes, blens, 3, NULL, NULL, &id));
  CHECK_STATUS(pdx_batch_wait(a, id, 5, &st), PDX_ERR_TIMEOUT);
  CHECK_STATUS(pdx_batch_free(a, id), PDX_ERR_BUSY);
  /* Mooncake's classic API has no cancel: refused, saying so; nothing changes. */
  size_t cancelled = 99;
  CHECK_STATUS(pdx_batch_cancel(a, id, &cancelled), PDX_ERR_INVALID_ARGUMENT);
  CHECK(strstr(pdx_last_error_message(), "has no cancel") != NULL);
  CHECK(cancelled == 99);
  int32_t task_state = -1;
  CHECK_STATUS(pdx_task_cancel(a, id, 0, &task_state), PDX_ERR_INVALID_ARGUMENT);
  CHECK(task_state == -1);
  CHECK_STATUS(pdx_batch_cancel(a, id + 1, NULL), PDX_ERR_INVALID_HANDLE);
  CHECK_OK(pdx_batch_status(a, id, &s));
  CHECK(s.state == PDX_TASK_PENDING && s.completed == 1); /* the zero-length entry */
  unsetenv("FAKE_TE_HANG");
  wait_done(a, id, PDX_TASK_COMPLETED);
  CHECK_OK(pdx_batch_free(a, id));

  /* Injected task failure: the batch fails, each task carries its error. */
  setenv("FAKE_TE_FAIL_TASKS", "1", 1);
  CHECK_OK(pdx_batch_submit(a, sb, PDX_OPCODE_WRITE, locals, remotes, blens, 3, NULL, NULL, &id));
  wait_done(a, id, PDX_TASK_FAILED);
  CHECK_OK(pdx_task_status(a, id, 0, &st, NULL, &err));
  CHECK(st == PDX_TASK_FAILED && err == PDX_ERR_CONNECTION_LOST);
  char msg[512];
  size_t mlen = 0;
  CHECK_OK(pdx_task_error_message(a, id, 2, msg, sizeof msg, &mlen));
  CHECK(mlen > 0 && contains(msg, "FAILED") && contains(msg, sb));
  CHECK_OK(pdx_batch_free(a, id));
  unsetenv("FAKE_TE_FAIL_TASKS");

  /* allocateBatchID failing (INVALID_BATCH) is never passed back. */
  setenv("FAKE_TE_FAIL_ALLOC", "1", 1);
  CHECK_STATUS(pdx_batch_submit(a, sb, PDX_OPCODE_WRITE, locals, remotes, blens, 3, NULL, NULL, &id), PDX_ERR_BUSY);
  CHECK(contains(pdx_last_error_message(), "INVALID_BATCH"));
  unsetenv("FAKE_TE_FAIL_ALLOC");

  /* Notifications and probes. */
  CHECK_OK(pdx_send_notify(b, sa, "ping", "{\"x\":1}"));
  CHECK_OK(pdx_notifications_drain(a, &nl));
  CHECK(pdx_notifications_count(nl) == 1);
  CHECK_OK(pdx_notification_get(nl, 0, &nn, &nm));
  CHECK_STR(nn, "ping");
  CHECK_STR(nm, "{\"x\":1}");
  pdx_notifications_free(nl);
  CHECK_STATUS(pdx_send_notify(b, "10.9.9.9:1", "n", "m"), PDX_ERR_PEER_UNREACHABLE);
  int probes = te_calls("openSegmentNoCache");
  CHECK_OK(pdx_send_probe(a, sb));
  CHECK(te_calls("openSegmentNoCache") == probes + 1);
  CHECK_STATUS(pdx_send_probe(a, "10.9.9.9:1"), PDX_ERR_PEER_UNREACHABLE);

  CHECK_OK(pdx_batch_unregister_memory(b, bufs, 2));
  CHECK_OK(pdx_unregister_memory(a, src));
  CHECK(te_live_batches() == 0);
  pdx_engine_free(a);
  pdx_engine_free(b);
  CHECK(te_live_engines() == 0);
  CHECK(te_violations() == 0); /* no bogus engine or batch id ever reached Mooncake */
}

int main(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  unsetenv("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE");
  unsetenv("PDX_TCP_ENGINE");
  unsetenv("FAKE_TE_PROTOCOLS");
  test_availability_and_loader_errors(); /* loads the double into pdx */
  open_double();
  test_init_failures();
  test_transfers();
  return pdx_test_finish("test_mooncake_backend");
}
