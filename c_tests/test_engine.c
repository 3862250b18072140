/* The transfer engine through the C ABI: two native TCP engines in one
 * process on 127.0.0.1, moving bytes between each other's registered memory
 * (sync, batched, asynchronous, from several threads), probe and notify, and
 * every NULL / bad-handle / bad-length / bad-id case of the engine functions. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

#define WAIT_MS 30000u

/* A failing call: the expected status and a non-empty last error. */
#define CHECK_FAIL(call, expected)                                               \
  do {                                                                           \
    CHECK_STATUS(call, expected);                                                \
    CHECK(pdx_last_error_message() != NULL && pdx_last_error_message()[0] != 0); \
  } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static void fill_random(unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(rng() >> 24);
}

static uint64_t addr_of(const void *p) { return (uint64_t)(uintptr_t)p; }

static void clear_env(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  unsetenv("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE");
}

/* ------------------------------------------------------------------ init */

static void test_init_errors(void) {
  clear_env();
  pdx_engine *const sentinel = (pdx_engine *)(uintptr_t)0x5a5a50;
  pdx_engine *e = sentinel;

  CHECK_FAIL(pdx_engine_init(NULL, "tcp", NULL, &e), PDX_ERR_NULL_ARGUMENT);
  CHECK(e == sentinel);
  CHECK_FAIL(pdx_engine_init("127.0.0.1", "tcp", NULL, NULL), PDX_ERR_NULL_ARGUMENT);

  const char bad_utf8[] = {'1', '2', '7', (char)0xff, (char)0xfe, 0};
  CHECK_FAIL(pdx_engine_init(bad_utf8, "tcp", NULL, &e), PDX_ERR_INVALID_UTF8);
  CHECK_FAIL(pdx_engine_init("127.0.0.1", bad_utf8, NULL, &e), PDX_ERR_INVALID_UTF8);
  CHECK_FAIL(pdx_engine_init("127.0.0.1", "tcp", bad_utf8, &e), PDX_ERR_INVALID_UTF8);
  CHECK(e == sentinel);

  CHECK_FAIL(pdx_engine_init("127.0.0.1", "udp", NULL, &e), PDX_ERR_UNKNOWN_PROTOCOL);
  CHECK(strstr(pdx_last_error_message(), "udp") != NULL);
  CHECK(e == sentinel);

  /* rdma (explicit, or the default with no environment) needs Mooncake's
   * engine, which is not loaded here. */
  CHECK_FAIL(pdx_engine_init("127.0.0.1", "rdma", NULL, &e), PDX_ERR_BACKEND_UNAVAILABLE);
  CHECK(strstr(pdx_last_error_message(), "rdma") != NULL);
  CHECK_FAIL(pdx_engine_init("127.0.0.1", NULL, NULL, &e), PDX_ERR_BACKEND_UNAVAILABLE);
  CHECK(e == sentinel);

  /* MOONCAKE_PROTOCOL=tcp with no explicit protocol starts the native engine. */
  setenv("MOONCAKE_PROTOCOL", "tcp", 1);
  e = NULL;
  CHECK_OK(pdx_engine_init("127.0.0.1", NULL, NULL, &e));
  CHECK(e != NULL);
  CHECK_STR(pdx_engine_protocol(e), "tcp");
  pdx_engine_free(e);
  unsetenv("MOONCAKE_PROTOCOL");

  /* MC_FORCE_TCP overrides an explicit rdma. */
  setenv("MC_FORCE_TCP", "1", 1);
  e = NULL;
  CHECK_OK(pdx_engine_init("127.0.0.1", "rdma", "mlx5_0", &e));
  CHECK(e != NULL);
  CHECK_STR(pdx_engine_protocol(e), "tcp");
  pdx_engine_free(e);
  clear_env();

  pdx_engine_free(NULL); /* fine */
}

static void test_identity(pdx_engine *e) {
  const char *sid = pdx_engine_session_id(e);
  uint16_t port = pdx_engine_rpc_port(e);
  CHECK(sid != NULL);
  CHECK(port != 0);
  char expected[64];
  snprintf(expected, sizeof expected, "127.0.0.1:%u", (unsigned)port);
  CHECK_STR(sid, expected);
  CHECK_STR(pdx_engine_protocol(e), "tcp");
  /* Stable across calls. */
  CHECK(pdx_engine_session_id(e) == sid);
}

/* ----------------------------------------------------------- bad handles */

/* Every engine function with `bad` as the engine: NULL gives
 * PDX_ERR_NULL_ARGUMENT, anything else PDX_ERR_INVALID_HANDLE; out-params
 * stay untouched; nothing crashes. `peer` is a valid session. */
static void check_bad_engine(pdx_engine *bad, const char *peer) {
  pdx_status want = bad == NULL ? PDX_ERR_NULL_ARGUMENT : PDX_ERR_INVALID_HANDLE;
  unsigned char buf[16] = {0};
  void *locals[1] = {buf};
  uint64_t remotes[1] = {0x1000};
  size_t lens[1] = {sizeof buf};

  CHECK(pdx_engine_session_id(bad) == NULL);
  CHECK(pdx_last_error_message()[0] != 0);
  CHECK(pdx_engine_rpc_port(bad) == 0);
  CHECK(pdx_engine_protocol(bad) == NULL);

  CHECK_FAIL(pdx_register_memory(bad, buf, sizeof buf), want);
  CHECK_FAIL(pdx_unregister_memory(bad, buf), want);
  CHECK_FAIL(pdx_batch_register_memory(bad, locals, lens, 1), want);
  CHECK_FAIL(pdx_batch_unregister_memory(bad, locals, 1), want);
  CHECK_FAIL(pdx_transfer_sync_write(bad, peer, buf, 0x1000, sizeof buf), want);
  CHECK_FAIL(pdx_transfer_sync_read(bad, peer, buf, 0x1000, sizeof buf), want);
  CHECK_FAIL(pdx_batch_transfer_sync_write(bad, peer, locals, remotes, lens, 1), want);
  CHECK_FAIL(pdx_batch_transfer_sync_read(bad, peer, locals, remotes, lens, 1), want);

  uint64_t batch = 0x77;
  CHECK_FAIL(pdx_batch_submit(bad, peer, PDX_OPCODE_WRITE, locals, remotes, lens, 1, NULL, NULL, &batch), want);
  CHECK(batch == 0x77);
  pdx_batch_summary summary;
  memset(&summary, 0xab, sizeof summary);
  pdx_batch_summary before = summary;
  CHECK_FAIL(pdx_batch_status(bad, 0x100000001ull, &summary), want);
  CHECK(memcmp(&summary, &before, sizeof summary) == 0);
  int32_t state = 77;
  uint64_t bytes = 77;
  pdx_status err = 77;
  CHECK_FAIL(pdx_task_status(bad, 0x100000001ull, 0, &state, &bytes, &err), want);
  CHECK(state == 77 && bytes == 77 && err == 77);
  char text[8] = "xxxxxxx";
  size_t text_len = 77;
  CHECK_FAIL(pdx_task_error_message(bad, 0x100000001ull, 0, text, sizeof text, &text_len), want);
  CHECK(strcmp(text, "xxxxxxx") == 0 && text_len == 77);
  CHECK_FAIL(pdx_batch_wait(bad, 0x100000001ull, 0, &state), want);
  CHECK(state == 77);
  CHECK_FAIL(pdx_batch_free(bad, 0x100000001ull), want);
  CHECK_FAIL(pdx_send_probe(bad, peer), want);
  uint64_t first = 77;
  CHECK_FAIL(pdx_first_buffer_address(bad, peer, &first), want);
  CHECK(first == 77);
  CHECK_FAIL(pdx_send_notify(bad, peer, "n", "m"), want);
  pdx_notifications *const list_sentinel = (pdx_notifications *)(uintptr_t)0x4440;
  pdx_notifications *list = list_sentinel;
  CHECK_FAIL(pdx_notifications_drain(bad, &list), want);
  CHECK(list == list_sentinel);
}

static void test_bad_engines(const char *peer) {
  /* NULL. */
  check_bad_engine(NULL, peer);
  /* A stack address. */
  int on_stack = 0;
  check_bad_engine((pdx_engine *)(void *)&on_stack, peer);
  /* Made-up addresses. */
  check_bad_engine((pdx_engine *)(uintptr_t)0x1000, peer);
  check_bad_engine((pdx_engine *)(uintptr_t)0xdeadbeef0ull, peer);
  /* A heap block pdx never saw. */
  void *heap = malloc(64);
  memset(heap, 0x5a, 64);
  check_bad_engine((pdx_engine *)heap, peer);

  /* A freed engine: its handle is refused, freeing it again is ignored. */
  pdx_engine *gone = start_engine();
  char gone_session[64];
  snprintf(gone_session, sizeof gone_session, "%s", pdx_engine_session_id(gone));
  pdx_engine_free(gone);
  check_bad_engine(gone, peer);
  pdx_engine_free(gone);
  pdx_engine_free((pdx_engine *)(void *)&on_stack);
  pdx_engine_free((pdx_engine *)heap);
  free(heap);
}

/* --------------------------------------------------------- registration */

static void test_registration(pdx_engine *e) {
  enum { N = 4096 };
  unsigned char *mem = calloc(1, 4 * N);

  CHECK_FAIL(pdx_register_memory(e, NULL, N), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_register_memory(e, mem, 0), PDX_ERR_ADDRESS_OVERLAP);
  CHECK_OK(pdx_register_memory(e, mem, N));
  /* Same region, inside, straddling the start, straddling the end. */
  CHECK_FAIL(pdx_register_memory(e, mem, N), PDX_ERR_ADDRESS_OVERLAP);
  CHECK_FAIL(pdx_register_memory(e, mem + 10, 10), PDX_ERR_ADDRESS_OVERLAP);
  CHECK_FAIL(pdx_register_memory(e, mem + N - 1, 2), PDX_ERR_ADDRESS_OVERLAP);
  /* Adjacent regions are fine. */
  CHECK_OK(pdx_register_memory(e, mem + N, N));

  CHECK_FAIL(pdx_unregister_memory(e, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_unregister_memory(e, mem + 1), PDX_ERR_NOT_FOUND); /* not a start */
  CHECK_FAIL(pdx_unregister_memory(e, mem + 3 * N), PDX_ERR_NOT_FOUND);
  CHECK_OK(pdx_unregister_memory(e, mem + N));
  CHECK_FAIL(pdx_unregister_memory(e, mem + N), PDX_ERR_NOT_FOUND); /* twice */
  CHECK_OK(pdx_unregister_memory(e, mem));

  /* Batches: n == 0 with NULL arrays does nothing; n > 0 needs both arrays. */
  CHECK_OK(pdx_batch_register_memory(e, NULL, NULL, 0));
  CHECK_OK(pdx_batch_unregister_memory(e, NULL, 0));
  void *addrs[3] = {mem, mem + N, mem + 2 * N};
  size_t lens[3] = {N, N, N};
  CHECK_FAIL(pdx_batch_register_memory(e, NULL, lens, 3), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_register_memory(e, addrs, NULL, 3), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_unregister_memory(e, NULL, 3), PDX_ERR_NULL_ARGUMENT);

  /* All or none: a NULL entry, a zero length, overlapping entries. */
  void *with_null[3] = {mem, NULL, mem + 2 * N};
  CHECK_FAIL(pdx_batch_register_memory(e, with_null, lens, 3), PDX_ERR_NULL_ARGUMENT);
  size_t with_zero[3] = {N, 0, N};
  CHECK_FAIL(pdx_batch_register_memory(e, addrs, with_zero, 3), PDX_ERR_ADDRESS_OVERLAP);
  size_t overlapping[3] = {N + 1, N, N};
  CHECK_FAIL(pdx_batch_register_memory(e, addrs, overlapping, 3), PDX_ERR_ADDRESS_OVERLAP);
  void *dup[2] = {mem, mem};
  CHECK_FAIL(pdx_batch_register_memory(e, dup, lens, 2), PDX_ERR_ADDRESS_OVERLAP);
  /* Nothing of the failed batches was registered. */
  CHECK_FAIL(pdx_unregister_memory(e, mem), PDX_ERR_NOT_FOUND);
  CHECK_FAIL(pdx_unregister_memory(e, mem + 2 * N), PDX_ERR_NOT_FOUND);

  CHECK_OK(pdx_batch_register_memory(e, addrs, lens, 3));
  CHECK_FAIL(pdx_register_memory(e, mem + 2 * N + 5, 1), PDX_ERR_ADDRESS_OVERLAP);
  /* Unregister all or none: one unknown start leaves every region in place. */
  void *some_unknown[2] = {mem, mem + 3 * N};
  CHECK_FAIL(pdx_batch_unregister_memory(e, some_unknown, 2), PDX_ERR_NOT_FOUND);
  void *some_null[2] = {mem, NULL};
  CHECK_FAIL(pdx_batch_unregister_memory(e, some_null, 2), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_register_memory(e, mem, 1), PDX_ERR_ADDRESS_OVERLAP); /* still there */
  CHECK_OK(pdx_batch_unregister_memory(e, addrs, 3));
  CHECK_FAIL(pdx_batch_unregister_memory(e, addrs, 3), PDX_ERR_NOT_FOUND);

  /* Registering again after unregistering works. */
  CHECK_OK(pdx_register_memory(e, mem, 4 * N));
  CHECK_OK(pdx_unregister_memory(e, mem));
  free(mem);
}

/* ------------------------------------------------------------ transfers */

enum { TARGET_LEN = 1 << 20 };

struct pair {
  pdx_engine *a, *b; /* a initiates, b is the target */
  const char *b_session;
  unsigned char *target; /* registered in b */
};

static void test_sync(struct pair *p) {
  enum { LEN = 300000 };
  unsigned char *src = malloc(LEN), *back = malloc(LEN);
  fill_random(src, LEN);
  memset(back, 0, LEN);
  uint64_t remote = addr_of(p->target) + 12345;

  CHECK_OK(pdx_transfer_sync_write(p->a, p->b_session, src, remote, LEN));
  CHECK(memcmp(p->target + 12345, src, LEN) == 0);
  CHECK_OK(pdx_transfer_sync_read(p->a, p->b_session, back, remote, LEN));
  CHECK(memcmp(back, src, LEN) == 0);

  /* One byte, at the very end of the region. */
  unsigned char one = 0xc3, got = 0;
  uint64_t last = addr_of(p->target) + TARGET_LEN - 1;
  CHECK_OK(pdx_transfer_sync_write(p->a, p->b_session, &one, last, 1));
  CHECK(p->target[TARGET_LEN - 1] == 0xc3);
  CHECK_OK(pdx_transfer_sync_read(p->a, p->b_session, &got, last, 1));
  CHECK(got == 0xc3);

  /* Out of range: past the end, straddling the end, before the start,
   * unregistered memory, address 0. The target refuses them. */
  unsigned char before_end = p->target[TARGET_LEN - 1];
  CHECK_FAIL(pdx_transfer_sync_write(p->a, p->b_session, src, addr_of(p->target) + TARGET_LEN, 16),
             PDX_ERR_REMOTE_REJECTED);
  CHECK_FAIL(pdx_transfer_sync_write(p->a, p->b_session, src, addr_of(p->target) + TARGET_LEN - 8, 16),
             PDX_ERR_REMOTE_REJECTED);
  CHECK(p->target[TARGET_LEN - 1] == before_end); /* nothing written */
  CHECK_FAIL(pdx_transfer_sync_write(p->a, p->b_session, src, addr_of(p->target) - 16, 16),
             PDX_ERR_REMOTE_REJECTED);
  CHECK_FAIL(pdx_transfer_sync_write(p->a, p->b_session, src, addr_of(src), 16), PDX_ERR_REMOTE_REJECTED);
  CHECK_FAIL(pdx_transfer_sync_read(p->a, p->b_session, back, addr_of(p->target) + TARGET_LEN, 16),
             PDX_ERR_REMOTE_REJECTED);
  CHECK_FAIL(pdx_transfer_sync_read(p->a, p->b_session, back, 0, 16), PDX_ERR_REMOTE_REJECTED);
  /* The engine still works after refusals. */
  CHECK_OK(pdx_transfer_sync_read(p->a, p->b_session, back, remote, LEN));
  CHECK(memcmp(back, src, LEN) == 0);

  /* Argument errors. */
  const char bad_utf8[] = {'1', '2', '7', (char)0xc3, (char)0x28, 0};
  CHECK_FAIL(pdx_transfer_sync_write(p->a, NULL, src, remote, 16), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_transfer_sync_read(p->a, NULL, back, remote, 16), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_transfer_sync_write(p->a, bad_utf8, src, remote, 16), PDX_ERR_INVALID_UTF8);
  CHECK_FAIL(pdx_transfer_sync_read(p->a, bad_utf8, back, remote, 16), PDX_ERR_INVALID_UTF8);
  CHECK_FAIL(pdx_transfer_sync_write(p->a, p->b_session, NULL, remote, 16), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_transfer_sync_read(p->a, p->b_session, NULL, remote, 16), PDX_ERR_NULL_ARGUMENT);
  /* An address range that wraps around. */
  CHECK_FAIL(pdx_transfer_sync_write(p->a, p->b_session, src, UINT64_MAX - 4, 16), PDX_ERR_INVALID_ARGUMENT);
  free(src);
  free(back);
}

static void test_peer_errors(struct pair *p) {
  unsigned char buf[16] = {0};
  /* A port nobody listens on (the freed engine's port may be reused, so use
   * a port outside the engine range). */
  CHECK(pdx_send_probe(p->a, "127.0.0.1:1") != PDX_OK);
  CHECK(pdx_last_error_message()[0] != 0);
  CHECK(pdx_transfer_sync_write(p->a, "127.0.0.1:1", buf, 0x1000, sizeof buf) != PDX_OK);
  CHECK(pdx_last_error_message()[0] != 0);
  CHECK(pdx_send_notify(p->a, "127.0.0.1:1", "n", "m") != PDX_OK);
  CHECK(pdx_last_error_message()[0] != 0);
  /* Sessions that are not host:port. */
  CHECK(pdx_send_probe(p->a, "") != PDX_OK);
  CHECK(pdx_last_error_message()[0] != 0);
  CHECK(pdx_send_probe(p->a, "127.0.0.1:99999999") != PDX_OK);
  CHECK(pdx_last_error_message()[0] != 0);
  CHECK(pdx_transfer_sync_write(p->a, "127.0.0.1:notaport", buf, 0x1000, sizeof buf) != PDX_OK);
  CHECK(pdx_last_error_message()[0] != 0);
}

/* Hundreds of scattered entries: random sizes, placed in random order in
 * the target, written as one batch and read back as one batch. */
static void test_batch_sync(struct pair *p) {
  enum { COUNT = 600, SLOT = 1500 };
  unsigned char *src = malloc((size_t)COUNT * SLOT), *back = calloc(COUNT, SLOT);
  void *locals[COUNT], *back_locals[COUNT];
  uint64_t remotes[COUNT];
  size_t lens[COUNT];
  size_t order[COUNT];
  fill_random(src, (size_t)COUNT * SLOT);
  for (size_t i = 0; i < COUNT; i++) order[i] = i;
  for (size_t i = COUNT - 1; i > 0; i--) {
    size_t j = (size_t)(rng() % (i + 1)), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (size_t i = 0; i < COUNT; i++) {
    lens[i] = 1 + (size_t)(rng() % SLOT);
    locals[i] = src + i * SLOT;
    back_locals[i] = back + i * SLOT;
    remotes[i] = addr_of(p->target) + order[i] * SLOT + (SLOT - lens[i]);
  }
  CHECK_OK(pdx_batch_transfer_sync_write(p->a, p->b_session, locals, remotes, lens, COUNT));
  int landed = 1;
  for (size_t i = 0; i < COUNT; i++)
    if (memcmp((void *)(uintptr_t)remotes[i], locals[i], lens[i]) != 0) landed = 0;
  CHECK(landed);
  CHECK_OK(pdx_batch_transfer_sync_read(p->a, p->b_session, back_locals, remotes, lens, COUNT));
  int same = 1;
  for (size_t i = 0; i < COUNT; i++)
    if (memcmp(back_locals[i], locals[i], lens[i]) != 0) same = 0;
  CHECK(same);

  /* n == 0: nothing to do. */
  CHECK_OK(pdx_batch_transfer_sync_write(p->a, p->b_session, NULL, NULL, NULL, 0));
  CHECK_OK(pdx_batch_transfer_sync_read(p->a, p->b_session, NULL, NULL, NULL, 0));
  /* n > 0 with a NULL array. */
  CHECK_FAIL(pdx_batch_transfer_sync_write(p->a, p->b_session, NULL, remotes, lens, 3), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_transfer_sync_write(p->a, p->b_session, locals, NULL, lens, 3), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_transfer_sync_write(p->a, p->b_session, locals, remotes, NULL, 3), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_transfer_sync_read(p->a, p->b_session, NULL, remotes, lens, 3), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_transfer_sync_read(p->a, p->b_session, back_locals, NULL, lens, 3), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_transfer_sync_read(p->a, p->b_session, back_locals, remotes, NULL, 3), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_transfer_sync_write(p->a, NULL, locals, remotes, lens, 3), PDX_ERR_NULL_ARGUMENT);
  /* An entry with a NULL local buffer. */
  void *null_local[2] = {src, NULL};
  CHECK_FAIL(pdx_batch_transfer_sync_write(p->a, p->b_session, null_local, remotes, lens, 2), PDX_ERR_NULL_ARGUMENT);

  /* One entry out of range: the batch fails with REMOTE_REJECTED, the other
   * entries still land. */
  enum { SOME = 8 };
  unsigned char fresh[SOME][64];
  void *fl[SOME];
  uint64_t fr[SOME];
  size_t fn[SOME];
  fill_random(&fresh[0][0], sizeof fresh);
  for (size_t i = 0; i < SOME; i++) {
    fl[i] = fresh[i];
    fr[i] = addr_of(p->target) + 700000 + i * 64;
    fn[i] = 64;
  }
  fr[5] = addr_of(p->target) + TARGET_LEN - 10;
  CHECK_FAIL(pdx_batch_transfer_sync_write(p->a, p->b_session, fl, fr, fn, SOME), PDX_ERR_REMOTE_REJECTED);
  int others = 1;
  for (size_t i = 0; i < SOME; i++)
    if (i != 5 && memcmp((void *)(uintptr_t)fr[i], fresh[i], 64) != 0) others = 0;
  CHECK(others);
  CHECK_FAIL(pdx_batch_transfer_sync_read(p->a, p->b_session, fl, fr, fn, SOME), PDX_ERR_REMOTE_REJECTED);
  free(src);
  free(back);
}

/* --------------------------------------------------------------- async */

static void test_async(struct pair *p) {
  enum { COUNT = 256, SLOT = 1024 };
  unsigned char *src = malloc((size_t)COUNT * SLOT), *back = calloc(COUNT, SLOT);
  void *locals[COUNT], *back_locals[COUNT];
  uint64_t remotes[COUNT];
  size_t lens[COUNT];
  uint64_t total_bytes = 0;
  fill_random(src, (size_t)COUNT * SLOT);
  for (size_t i = 0; i < COUNT; i++) {
    lens[i] = 1 + (size_t)(rng() % SLOT);
    total_bytes += lens[i];
    locals[i] = src + i * SLOT;
    back_locals[i] = back + i * SLOT;
    /* reverse order in the target */
    remotes[i] = addr_of(p->target) + 2 * SLOT + (COUNT - 1 - i) * SLOT;
  }

  uint64_t batch = 0;
  CHECK_OK(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, COUNT, NULL, NULL, &batch));
  CHECK(batch != 0);
  pdx_batch_summary s;
  memset(&s, 0, sizeof s);
  CHECK_OK(pdx_batch_status(p->a, batch, &s));
  CHECK(s.total == COUNT);
  CHECK(s.state == PDX_TASK_PENDING || s.state == PDX_TASK_COMPLETED);
  CHECK(s.failed == 0);
  int32_t state = -1;
  CHECK_OK(pdx_batch_wait(p->a, batch, WAIT_MS, &state));
  CHECK(state == PDX_TASK_COMPLETED);
  CHECK_OK(pdx_batch_wait(p->a, batch, 0, NULL)); /* finished: immediate, NULL state fine */
  CHECK_OK(pdx_batch_status(p->a, batch, &s));
  CHECK(s.state == PDX_TASK_COMPLETED);
  CHECK(s.total == COUNT && s.completed == COUNT && s.failed == 0);
  CHECK(s.bytes == total_bytes);
  int tasks_ok = 1;
  for (size_t i = 0; i < COUNT; i++) {
    int32_t ts = -1;
    uint64_t tb = 0;
    pdx_status te = -1;
    if (pdx_task_status(p->a, batch, i, &ts, &tb, &te) != PDX_OK || ts != PDX_TASK_COMPLETED || tb != lens[i] ||
        te != PDX_OK)
      tasks_ok = 0;
  }
  CHECK(tasks_ok);
  CHECK_OK(pdx_task_status(p->a, batch, 0, NULL, NULL, NULL));
  char text[32] = "xxxx";
  size_t text_len = 99;
  CHECK_OK(pdx_task_error_message(p->a, batch, 3, text, sizeof text, &text_len));
  CHECK(text[0] == 0 && text_len == 0);
  CHECK_OK(pdx_task_error_message(p->a, batch, 3, NULL, 0, NULL));
  int landed = 1;
  for (size_t i = 0; i < COUNT; i++)
    if (memcmp((void *)(uintptr_t)remotes[i], locals[i], lens[i]) != 0) landed = 0;
  CHECK(landed);

  /* Task index out of range: out-params untouched. */
  int32_t ts = 55;
  uint64_t tb = 55;
  pdx_status te = 55;
  CHECK_FAIL(pdx_task_status(p->a, batch, COUNT, &ts, &tb, &te), PDX_ERR_INDEX_OUT_OF_RANGE);
  CHECK_FAIL(pdx_task_status(p->a, batch, SIZE_MAX, &ts, &tb, &te), PDX_ERR_INDEX_OUT_OF_RANGE);
  CHECK(ts == 55 && tb == 55 && te == 55);
  strcpy(text, "keep");
  text_len = 55;
  CHECK_FAIL(pdx_task_error_message(p->a, batch, COUNT, text, sizeof text, &text_len), PDX_ERR_INDEX_OUT_OF_RANGE);
  CHECK(strcmp(text, "keep") == 0 && text_len == 55);
  /* NULL out-param of batch_status; buf NULL with a length. */
  CHECK_FAIL(pdx_batch_status(p->a, batch, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_task_error_message(p->a, batch, 0, NULL, 8, &text_len), PDX_ERR_NULL_ARGUMENT);
  CHECK(text_len == 55);

  /* A batch id belongs to its engine. */
  CHECK_FAIL(pdx_batch_status(p->b, batch, &s), PDX_ERR_INVALID_HANDLE);

  CHECK_OK(pdx_batch_free(p->a, batch));

  /* Stale, zero and made-up ids. */
  uint64_t bogus[] = {batch, 0, 1, 0xffffffffffffffffull, 0xdeadbeef12345678ull, batch + 1,
                      batch + (1ull << 32), batch & 0xffffffffull};
  for (size_t k = 0; k < sizeof bogus / sizeof bogus[0]; k++) {
    uint64_t id = bogus[k];
    pdx_batch_summary untouched;
    memset(&untouched, 0xcd, sizeof untouched);
    pdx_batch_summary copy = untouched;
    CHECK_FAIL(pdx_batch_status(p->a, id, &untouched), PDX_ERR_INVALID_HANDLE);
    CHECK(memcmp(&untouched, &copy, sizeof copy) == 0);
    ts = 55, tb = 55, te = 55;
    CHECK_FAIL(pdx_task_status(p->a, id, 0, &ts, &tb, &te), PDX_ERR_INVALID_HANDLE);
    CHECK(ts == 55 && tb == 55 && te == 55);
    strcpy(text, "keep");
    text_len = 55;
    CHECK_FAIL(pdx_task_error_message(p->a, id, 0, text, sizeof text, &text_len), PDX_ERR_INVALID_HANDLE);
    CHECK(strcmp(text, "keep") == 0 && text_len == 55);
    state = 55;
    CHECK_FAIL(pdx_batch_wait(p->a, id, 10, &state), PDX_ERR_INVALID_HANDLE);
    CHECK(state == 55);
    CHECK_FAIL(pdx_batch_free(p->a, id), PDX_ERR_INVALID_HANDLE);
  }

  /* Read it back asynchronously. */
  CHECK_OK(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_READ, back_locals, remotes, lens, COUNT, NULL, NULL, &batch));
  CHECK_OK(pdx_batch_wait(p->a, batch, WAIT_MS, &state));
  CHECK(state == PDX_TASK_COMPLETED);
  int same = 1;
  for (size_t i = 0; i < COUNT; i++)
    if (memcmp(back_locals[i], locals[i], lens[i]) != 0) same = 0;
  CHECK(same);
  uint64_t second = 0;
  CHECK_OK(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, 4, NULL, NULL, &second));
  CHECK(second != batch && second != 0);
  CHECK_OK(pdx_batch_wait(p->a, second, WAIT_MS, NULL));
  CHECK_OK(pdx_batch_free(p->a, batch));
  CHECK_OK(pdx_batch_free(p->a, second));
  CHECK_FAIL(pdx_batch_free(p->a, second), PDX_ERR_INVALID_HANDLE);

  /* A failed task: one entry out of range. */
  remotes[7] = addr_of(p->target) + TARGET_LEN; /* just past the end */
  CHECK_OK(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, 16, NULL, NULL, &batch));
  CHECK_OK(pdx_batch_wait(p->a, batch, WAIT_MS, &state));
  CHECK(state == PDX_TASK_FAILED);
  CHECK_OK(pdx_batch_status(p->a, batch, &s));
  CHECK(s.state == PDX_TASK_FAILED && s.total == 16 && s.failed == 1 && s.completed == 15);
  ts = -1, te = 0, tb = 99;
  CHECK_OK(pdx_task_status(p->a, batch, 7, &ts, &tb, &te));
  CHECK(ts == PDX_TASK_FAILED);
  CHECK(te == PDX_ERR_REMOTE_REJECTED);
  CHECK(tb == 0);
  CHECK_OK(pdx_task_status(p->a, batch, 6, &ts, &tb, &te));
  CHECK(ts == PDX_TASK_COMPLETED && te == PDX_OK && tb == lens[6]);
  size_t need = 0;
  CHECK_OK(pdx_task_error_message(p->a, batch, 7, NULL, 0, &need));
  CHECK(need > 0);
  char *full = malloc(need + 1);
  memset(full, 'z', need + 1);
  size_t got_len = 0;
  CHECK_OK(pdx_task_error_message(p->a, batch, 7, full, need + 1, &got_len));
  CHECK(got_len == need && strlen(full) == need);
  CHECK(strstr(full, "rejected") != NULL);
  char small[8];
  memset(small, 'z', sizeof small);
  CHECK_OK(pdx_task_error_message(p->a, batch, 7, small, sizeof small, &got_len));
  CHECK(got_len == need && strlen(small) == sizeof small - 1 && memcmp(small, full, sizeof small - 1) == 0);
  char one[1] = {'z'};
  CHECK_OK(pdx_task_error_message(p->a, batch, 7, one, 1, NULL));
  CHECK(one[0] == 0);
  free(full);
  CHECK_OK(pdx_batch_free(p->a, batch));

  /* A read batch with an unregistered remote address. */
  remotes[7] = addr_of(src);
  CHECK_OK(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_READ, back_locals, remotes, lens, 16, NULL, NULL, &batch));
  CHECK_OK(pdx_batch_wait(p->a, batch, WAIT_MS, &state));
  CHECK(state == PDX_TASK_FAILED);
  CHECK_OK(pdx_task_status(p->a, batch, 7, &ts, NULL, &te));
  CHECK(ts == PDX_TASK_FAILED && te == PDX_ERR_REMOTE_REJECTED);
  CHECK_OK(pdx_batch_free(p->a, batch));
  remotes[7] = addr_of(p->target) + 2 * SLOT;

  /* Submit errors: nothing submitted, *out_batch untouched. */
  const char bad_utf8[] = {'x', (char)0x80, 0};
  uint64_t keep = 0x1234;
  batch = keep;
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, 2, locals, remotes, lens, 4, NULL, NULL, &batch),
             PDX_ERR_INVALID_ARGUMENT);
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, -1, locals, remotes, lens, 4, NULL, NULL, &batch),
             PDX_ERR_INVALID_ARGUMENT);
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, 4, "name", NULL, &batch),
             PDX_ERR_INVALID_ARGUMENT);
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, 4, NULL, "msg", &batch),
             PDX_ERR_INVALID_ARGUMENT);
  /* A notification's name or message need not be UTF-8 (test_notify_bytes); a session must. */
  CHECK_FAIL(pdx_batch_submit(p->a, NULL, PDX_OPCODE_WRITE, locals, remotes, lens, 4, NULL, NULL, &batch),
             PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_submit(p->a, bad_utf8, PDX_OPCODE_WRITE, locals, remotes, lens, 4, NULL, NULL, &batch),
             PDX_ERR_INVALID_UTF8);
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, NULL, remotes, lens, 4, NULL, NULL, &batch),
             PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, NULL, lens, 4, NULL, NULL, &batch),
             PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, NULL, 4, NULL, NULL, &batch),
             PDX_ERR_NULL_ARGUMENT);
  void *null_local[2] = {src, NULL};
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, null_local, remotes, lens, 2, NULL, NULL, &batch),
             PDX_ERR_NULL_ARGUMENT);
  CHECK(batch == keep);
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, 4, NULL, NULL, NULL),
             PDX_ERR_NULL_ARGUMENT);
  free(src);
  free(back);
}

/* -------------------------------------------------------- notifications */

/* Drain `e` and check it holds exactly the (name, msg) pairs given. */
static void expect_notifications(pdx_engine *e, size_t n, const char *const *names, const char *const *msgs) {
  pdx_notifications *list = NULL;
  CHECK_OK(pdx_notifications_drain(e, &list));
  CHECK(list != NULL);
  CHECK(pdx_notifications_count(list) == n);
  for (size_t i = 0; i < n && i < pdx_notifications_count(list); i++) {
    const char *name = NULL, *msg = NULL;
    CHECK_OK(pdx_notification_get(list, i, &name, &msg));
    CHECK_STR(name, names[i]);
    CHECK_STR(msg, msgs[i]);
  }
  const char *name = "keep", *msg = "keep";
  CHECK_FAIL(pdx_notification_get(list, n, &name, &msg), PDX_ERR_INDEX_OUT_OF_RANGE);
  CHECK_FAIL(pdx_notification_get(list, SIZE_MAX, &name, &msg), PDX_ERR_INDEX_OUT_OF_RANGE);
  CHECK(strcmp(name, "keep") == 0 && strcmp(msg, "keep") == 0);
  pdx_notifications_free(list);
}

static void test_notify(struct pair *p) {
  const char *a_session = pdx_engine_session_id(p->a);

  /* Nothing received yet. */
  expect_notifications(p->b, 0, NULL, NULL);

  CHECK_OK(pdx_send_notify(p->a, p->b_session, "req-1", "{\"done\": true}"));
  CHECK_OK(pdx_send_notify(p->a, p->b_session, "req-2", ""));
  CHECK_OK(pdx_send_notify(p->b, a_session, "back", "to a"));
  const char *names[] = {"req-1", "req-2"};
  const char *msgs[] = {"{\"done\": true}", ""};
  expect_notifications(p->b, 2, names, msgs);
  expect_notifications(p->b, 0, NULL, NULL); /* drained */
  const char *bn[] = {"back"}, *bm[] = {"to a"};
  expect_notifications(p->a, 1, bn, bm);

  /* With a batch: sent once every entry is confirmed. */
  enum { COUNT = 32 };
  unsigned char src[COUNT][100];
  void *locals[COUNT];
  uint64_t remotes[COUNT];
  size_t lens[COUNT];
  fill_random(&src[0][0], sizeof src);
  for (size_t i = 0; i < COUNT; i++) {
    locals[i] = src[i];
    remotes[i] = addr_of(p->target) + 500000 + i * 128;
    lens[i] = 100;
  }
  uint64_t batch = 0;
  int32_t state = -1;
  CHECK_OK(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, COUNT, "kv-ready", "room 7",
                            &batch));
  CHECK_OK(pdx_batch_wait(p->a, batch, WAIT_MS, &state));
  CHECK(state == PDX_TASK_COMPLETED);
  CHECK_OK(pdx_batch_free(p->a, batch));
  int landed = 1;
  for (size_t i = 0; i < COUNT; i++)
    if (memcmp((void *)(uintptr_t)remotes[i], src[i], 100) != 0) landed = 0;
  CHECK(landed);
  const char *kn[] = {"kv-ready"}, *km[] = {"room 7"};
  expect_notifications(p->b, 1, kn, km);

  /* A failed batch sends no notification. */
  remotes[3] = addr_of(p->target) + TARGET_LEN;
  CHECK_OK(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, COUNT, "never", "sent",
                            &batch));
  CHECK_OK(pdx_batch_wait(p->a, batch, WAIT_MS, &state));
  CHECK(state == PDX_TASK_FAILED);
  CHECK_OK(pdx_batch_free(p->a, batch));
  expect_notifications(p->b, 0, NULL, NULL);

  /* Argument errors (a name or message need not be UTF-8; a session must). */
  const char bad_utf8[] = {'n', (char)0xff, 0};
  CHECK_FAIL(pdx_send_notify(p->a, NULL, "n", "m"), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_send_notify(p->a, p->b_session, NULL, "m"), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_send_notify(p->a, p->b_session, "n", NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_send_notify(p->a, bad_utf8, "n", "m"), PDX_ERR_INVALID_UTF8);
  CHECK_FAIL(pdx_notifications_drain(p->a, NULL), PDX_ERR_NULL_ARGUMENT);
  expect_notifications(p->b, 0, NULL, NULL); /* none of those arrived */

  /* Bad notification lists. */
  int on_stack = 0;
  pdx_notifications *garbage = (pdx_notifications *)(void *)&on_stack;
  const char *name = "keep", *msg = "keep";
  CHECK(pdx_notifications_count(NULL) == 0);
  CHECK(pdx_notifications_count(garbage) == 0);
  CHECK_FAIL(pdx_notification_get(NULL, 0, &name, &msg), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_notification_get(garbage, 0, &name, &msg), PDX_ERR_INVALID_HANDLE);
  pdx_notifications *list = NULL;
  CHECK_OK(pdx_send_notify(p->a, p->b_session, "x", "y"));
  CHECK_OK(pdx_notifications_drain(p->b, &list));
  CHECK(pdx_notifications_count(list) == 1);
  CHECK_OK(pdx_notification_get(list, 0, NULL, NULL));
  CHECK_OK(pdx_notification_get(list, 0, NULL, &msg));
  CHECK_STR(msg, "y");
  CHECK_STR(name, "keep");
  pdx_notifications_free(list);
  CHECK(pdx_notifications_count(list) == 0); /* freed */
  msg = "keep";
  CHECK_FAIL(pdx_notification_get(list, 0, &name, &msg), PDX_ERR_INVALID_HANDLE);
  CHECK(strcmp(name, "keep") == 0 && strcmp(msg, "keep") == 0);
  pdx_notifications_free(list); /* twice: ignored */
  pdx_notifications_free(garbage);
  pdx_notifications_free(NULL);
}

/* Notifications are bytes: not UTF-8, NUL included (the *_bytes calls),
 * intact between pdx engines; one over the frame limit is refused before
 * anything is sent. */
static void test_notify_bytes(struct pair *p) {
  unsigned char every[256];
  for (int i = 0; i < 256; i++) every[i] = (unsigned char)i;
  const char push[] = "PUSH_REG:\x82\xa4name\xa1" "A\x8b";
  /* A C string that is not UTF-8 goes as it is. */
  CHECK_OK(pdx_send_notify(p->a, p->b_session, push, push));
  pdx_notify_bytes note = {(const uint8_t *)"n\0\xff", 3, every, sizeof every};
  CHECK_OK(pdx_send_notify_bytes(p->a, p->b_session, &note));
  unsigned char src[64];
  fill_random(src, sizeof src);
  void *locals[1] = {src};
  uint64_t remotes[1] = {addr_of(p->target) + 600000};
  size_t lens[1] = {sizeof src};
  uint64_t batch = 0;
  int32_t state = -1;
  pdx_notify_bytes ride = {(const uint8_t *)"kv", 2, (const uint8_t *)"\0room\0", 6};
  CHECK_OK(pdx_batch_submit_notify_bytes(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, 1, &ride,
                                         &batch));
  CHECK_OK(pdx_batch_wait(p->a, batch, WAIT_MS, &state));
  CHECK(state == PDX_TASK_COMPLETED);
  CHECK_OK(pdx_batch_free(p->a, batch));
  pdx_notify_bytes empty = {NULL, 0, NULL, 0};
  CHECK_OK(pdx_send_notify_bytes(p->a, p->b_session, &empty));

  pdx_notifications *list = NULL;
  CHECK_OK(pdx_notifications_drain(p->b, &list));
  CHECK(pdx_notifications_count(list) == 4);
  pdx_notify_bytes got[4];
  for (size_t i = 0; i < 4; i++) CHECK_OK(pdx_notification_get_bytes(list, i, &got[i]));
  CHECK(got[0].name_len == strlen(push) && memcmp(got[0].name, push, strlen(push)) == 0);
  CHECK(got[0].msg_len == strlen(push) && memcmp(got[0].msg, push, strlen(push)) == 0);
  CHECK(got[1].name_len == 3 && memcmp(got[1].name, "n\0\xff", 3) == 0);
  CHECK(got[1].msg_len == 256 && memcmp(got[1].msg, every, 256) == 0);
  CHECK(got[2].name_len == 2 && got[2].msg_len == 6 && memcmp(got[2].msg, "\0room\0", 6) == 0);
  CHECK(got[3].name_len == 0 && got[3].msg_len == 0 && got[3].name != NULL && got[3].msg != NULL);
  /* The C-string view: bytes as they are, a NUL shown as \u0000. */
  const char *name = NULL, *msg = NULL;
  CHECK_OK(pdx_notification_get(list, 0, &name, &msg));
  CHECK_STR(msg, push);
  CHECK_OK(pdx_notification_get(list, 2, &name, &msg));
  CHECK_STR(msg, "\\u0000room\\u0000");
  CHECK_OK(pdx_notification_get(list, 1, &name, NULL));
  CHECK_STR(name, "n\\u0000\xff");
  pdx_notify_bytes untouched = {NULL, 7, NULL, 7};
  CHECK_FAIL(pdx_notification_get_bytes(list, 4, &untouched), PDX_ERR_INDEX_OUT_OF_RANGE);
  CHECK(untouched.name_len == 7);
  CHECK_FAIL(pdx_notification_get_bytes(list, 0, NULL), PDX_ERR_NULL_ARGUMENT);
  pdx_notifications_free(list);

  /* Argument errors. */
  pdx_notify_bytes no_name = {NULL, 1, (const uint8_t *)"m", 1};
  CHECK_FAIL(pdx_send_notify_bytes(p->a, p->b_session, &no_name), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_send_notify_bytes(p->a, p->b_session, NULL), PDX_ERR_NULL_ARGUMENT);
  pdx_notify_bytes huge = {(const uint8_t *)"n", SIZE_MAX, (const uint8_t *)"m", 1};
  CHECK_FAIL(pdx_send_notify_bytes(p->a, p->b_session, &huge), PDX_ERR_INVALID_ARGUMENT);
  /* 8 MiB: refused before sending, naming the frame limit; no batch starts. */
  size_t big_len = 8u << 20;
  unsigned char *big = malloc(big_len);
  CHECK(big != NULL);
  memset(big, 0x8b, big_len);
  pdx_notify_bytes large = {(const uint8_t *)"kv", 2, big, big_len};
  CHECK_FAIL(pdx_send_notify_bytes(p->a, p->b_session, &large), PDX_ERR_INVALID_ARGUMENT);
  CHECK(strstr(pdx_last_error_message(), "handshake frame limit of 1048576 bytes") != NULL);
  batch = 7;
  CHECK_FAIL(pdx_batch_submit_notify_bytes(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, 1, &large,
                                           &batch),
             PDX_ERR_INVALID_ARGUMENT);
  CHECK(batch == 7);
  free(big);
  expect_notifications(p->b, 0, NULL, NULL); /* none of those arrived */
}

static void test_probe(struct pair *p) {
  CHECK_OK(pdx_send_probe(p->a, p->b_session));
  CHECK_OK(pdx_send_probe(p->b, pdx_engine_session_id(p->a)));
  CHECK_OK(pdx_send_probe(p->a, pdx_engine_session_id(p->a))); /* itself */
  const char bad_utf8[] = {'1', (char)0xfe, 0};
  CHECK_FAIL(pdx_send_probe(p->a, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_send_probe(p->a, bad_utf8), PDX_ERR_INVALID_UTF8);
}

/* The first buffer a segment advertises: a peer's (from its descriptor),
 * the engine's own, 0 for one with none; an unknown peer is an error and
 * leaves the out-param alone. */
static void test_first_buffer(struct pair *p) {
  uint64_t addr = 77;
  CHECK_OK(pdx_first_buffer_address(p->a, p->b_session, &addr));
  CHECK(addr == addr_of(p->target));
  addr = 77;
  CHECK_OK(pdx_first_buffer_address(p->b, p->b_session, &addr)); /* its own */
  CHECK(addr == addr_of(p->target));
  CHECK_OK(pdx_first_buffer_address(p->b, pdx_engine_session_id(p->a), &addr)); /* registers nothing */
  CHECK(addr == 0);
  addr = 77;
  CHECK(pdx_first_buffer_address(p->a, "127.0.0.1:1", &addr) != PDX_OK);
  CHECK(addr == 77);
  CHECK_FAIL(pdx_first_buffer_address(p->a, p->b_session, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_FAIL(pdx_first_buffer_address(p->a, NULL, &addr), PDX_ERR_NULL_ARGUMENT);
}

/* ------------------------------------------------------ pending batches */

/* A peer that accepts connections (in the kernel backlog) but never answers
 * keeps a batch in flight: wait times out, free is refused, status says
 * pending. Closing the listener resets the connection and the task fails. */
static void test_pending(struct pair *p) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  CHECK(listen(fd, 16) == 0);
  CHECK(getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
  char silent[64];
  snprintf(silent, sizeof silent, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));

  unsigned char src[64] = {1, 2, 3};
  void *locals[2] = {src, src + 32};
  uint64_t remotes[2] = {0x10000, 0x20000};
  size_t lens[2] = {32, 32};
  uint64_t batch = 0;
  CHECK_OK(pdx_batch_submit(p->a, silent, PDX_OPCODE_WRITE, locals, remotes, lens, 2, NULL, NULL, &batch));
  int32_t state = 77;
  CHECK_FAIL(pdx_batch_wait(p->a, batch, 50, &state), PDX_ERR_TIMEOUT);
  CHECK(state == 77);
  CHECK_FAIL(pdx_batch_free(p->a, batch), PDX_ERR_BUSY);
  pdx_batch_summary s;
  CHECK_OK(pdx_batch_status(p->a, batch, &s)); /* not freed */
  CHECK(s.state == PDX_TASK_PENDING && s.total == 2 && s.completed == 0 && s.failed == 0 && s.bytes == 0);
  int32_t ts = -1;
  uint64_t tb = 99;
  pdx_status te = -1;
  CHECK_OK(pdx_task_status(p->a, batch, 1, &ts, &tb, &te));
  CHECK(ts == PDX_TASK_PENDING && tb == 0 && te == PDX_OK);
  size_t len = 99;
  CHECK_OK(pdx_task_error_message(p->a, batch, 1, NULL, 0, &len));
  CHECK(len == 0);
  /* The other engine is not held up by it. */
  CHECK_OK(pdx_send_probe(p->a, p->b_session));

  close(fd); /* resets the pending connection */
  CHECK_OK(pdx_batch_wait(p->a, batch, WAIT_MS, &state));
  CHECK(state == PDX_TASK_FAILED);
  CHECK_OK(pdx_batch_status(p->a, batch, &s));
  CHECK(s.state == PDX_TASK_FAILED && s.failed == 2 && s.completed == 0);
  CHECK_OK(pdx_task_status(p->a, batch, 0, &ts, &tb, &te));
  CHECK(ts == PDX_TASK_FAILED && te != PDX_OK && te != PDX_ERR_REMOTE_REJECTED);
  CHECK_OK(pdx_task_error_message(p->a, batch, 0, NULL, 0, &len));
  CHECK(len > 0);
  CHECK_OK(pdx_batch_free(p->a, batch));
}

/* -------------------------------------------------------------- threads */

enum { THREADS = 4, ROUNDS = 40, CHUNK = 8192 };

struct worker {
  struct pair *p;
  int index;
  int failures;
};

static void *worker_main(void *arg) {
  struct worker *w = arg;
  unsigned char src[CHUNK], back[CHUNK];
  uint64_t base = addr_of(w->p->target) + 800000 + (uint64_t)w->index * CHUNK;
  for (int r = 0; r < ROUNDS; r++) {
    for (size_t i = 0; i < CHUNK; i++) src[i] = (unsigned char)(i * 31 + (size_t)r * 7 + (size_t)w->index * 101);
    size_t len = CHUNK - (size_t)r * 13;
    if (pdx_transfer_sync_write(w->p->a, w->p->b_session, src, base, len) != PDX_OK) w->failures++;
    memset(back, 0, sizeof back);
    if (pdx_transfer_sync_read(w->p->a, w->p->b_session, back, base, len) != PDX_OK) w->failures++;
    if (memcmp(src, back, len) != 0) w->failures++;
    if (pdx_send_probe(w->p->a, w->p->b_session) != PDX_OK) w->failures++;
  }
  return NULL;
}

static void test_threads(struct pair *p) {
  pthread_t threads[THREADS];
  struct worker workers[THREADS];
  for (int i = 0; i < THREADS; i++) {
    workers[i] = (struct worker){p, i, 0};
    CHECK(pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(threads[i], NULL);
    CHECK(workers[i].failures == 0);
  }
}

/* Misaligned out-params and arrays are refused, not dereferenced. */
static void test_misaligned(struct pair *p) {
  uint64_t storage[8];
  memset(storage, 0x11, sizeof storage);
  unsigned char *raw = (unsigned char *)storage;
  unsigned char before[sizeof storage];
  memcpy(before, storage, sizeof storage);
  unsigned char src[16] = {0};
  void *locals[1] = {src};
  uint64_t remotes[1] = {addr_of(p->target)};
  size_t lens[1] = {sizeof src};
  CHECK_FAIL(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, 1, NULL, NULL,
                              (uint64_t *)(void *)(raw + 1)),
             PDX_ERR_INVALID_ARGUMENT);
  CHECK_FAIL(pdx_batch_transfer_sync_write(p->a, p->b_session, locals, (const uint64_t *)(void *)(raw + 3), lens, 1),
             PDX_ERR_INVALID_ARGUMENT);
  CHECK_FAIL(pdx_batch_register_memory(p->a, locals, (const size_t *)(void *)(raw + 5), 1), PDX_ERR_INVALID_ARGUMENT);
  uint64_t batch = 0;
  CHECK_OK(pdx_batch_submit(p->a, p->b_session, PDX_OPCODE_WRITE, locals, remotes, lens, 1, NULL, NULL, &batch));
  CHECK_OK(pdx_batch_wait(p->a, batch, WAIT_MS, NULL));
  CHECK_FAIL(pdx_batch_wait(p->a, batch, 0, (int32_t *)(void *)(raw + 2)), PDX_ERR_INVALID_ARGUMENT);
  CHECK_FAIL(pdx_task_status(p->a, batch, 0, NULL, (uint64_t *)(void *)(raw + 4), NULL), PDX_ERR_INVALID_ARGUMENT);
  CHECK_FAIL(pdx_batch_status(p->a, batch, (pdx_batch_summary *)(void *)(raw + 4)), PDX_ERR_INVALID_ARGUMENT);
  CHECK(memcmp(before, storage, sizeof storage) == 0);
  CHECK_OK(pdx_batch_free(p->a, batch));
}

/* One thread keeps writing through an engine while another frees it: every
 * call returns (OK before, an error during), and once the free returned the
 * handle is refused. */
struct racer {
  pdx_engine *e;
  const char *session;
  uint64_t remote;
  volatile int freed;
  int bad_after_free;
  int saw_invalid_handle;
};

static void *racer_main(void *arg) {
  struct racer *r = arg;
  unsigned char src[4096];
  memset(src, 0x3c, sizeof src);
  for (long i = 0; i < 1000000; i++) {
    int freed = __atomic_load_n(&r->freed, __ATOMIC_ACQUIRE);
    pdx_status st = pdx_transfer_sync_write(r->e, r->session, src, r->remote, sizeof src);
    if (st == PDX_ERR_INVALID_HANDLE) {
      r->saw_invalid_handle = 1;
      break;
    }
    if (freed) {
      r->bad_after_free = 1; /* after the free returned, only INVALID_HANDLE is right */
      break;
    }
  }
  return NULL;
}

static void test_free_while_in_use(struct pair *p) {
  struct racer r;
  memset(&r, 0, sizeof r);
  r.e = start_engine();
  r.session = p->b_session;
  r.remote = addr_of(p->target) + 900000;
  pthread_t t;
  CHECK(pthread_create(&t, NULL, racer_main, &r) == 0);
  unsigned char probe_buf[8] = {0};
  /* Let it get going: a few writes of our own through the same engine. */
  for (int i = 0; i < 20; i++) CHECK_OK(pdx_transfer_sync_write(r.e, p->b_session, probe_buf, r.remote + 8192, 8));
  pdx_engine_free(r.e);
  __atomic_store_n(&r.freed, 1, __ATOMIC_RELEASE);
  pthread_join(t, NULL);
  CHECK(r.saw_invalid_handle);
  CHECK(!r.bad_after_free);
  CHECK_OK(pdx_send_probe(p->a, p->b_session)); /* the target is fine */
}

/* ------------------------------------------------------------- teardown */

static void test_free_with_peer_gone(struct pair *p) {
  /* A third engine goes away; talking to it fails cleanly, and the surviving
   * engines keep working. */
  pdx_engine *c = start_engine();
  char c_session[64];
  snprintf(c_session, sizeof c_session, "%s", pdx_engine_session_id(c));
  unsigned char mem[256];
  CHECK_OK(pdx_register_memory(c, mem, sizeof mem));
  unsigned char src[64];
  fill_random(src, sizeof src);
  CHECK_OK(pdx_transfer_sync_write(p->a, c_session, src, addr_of(mem), sizeof src));
  CHECK(memcmp(mem, src, sizeof src) == 0);
  pdx_engine_free(c);
  CHECK(pdx_transfer_sync_write(p->a, c_session, src, addr_of(mem), sizeof src) != PDX_OK);
  CHECK(pdx_last_error_message()[0] != 0);
  CHECK(pdx_send_probe(p->a, c_session) != PDX_OK);
  CHECK_OK(pdx_send_probe(p->a, p->b_session));
}

int main(void) {
  test_init_errors();

  struct pair p;
  p.a = start_engine();
  p.b = start_engine();
  test_identity(p.a);
  test_identity(p.b);
  CHECK(strcmp(pdx_engine_session_id(p.a), pdx_engine_session_id(p.b)) != 0);
  p.b_session = pdx_engine_session_id(p.b);
  p.target = calloc(1, TARGET_LEN);
  CHECK_OK(pdx_register_memory(p.b, p.target, TARGET_LEN));

  test_bad_engines(p.b_session);
  test_registration(p.a);
  test_sync(&p);
  test_batch_sync(&p);
  test_async(&p);
  test_notify(&p);
  test_notify_bytes(&p);
  test_probe(&p);
  test_first_buffer(&p);
  test_threads(&p);
  test_pending(&p);
  test_misaligned(&p);
  test_free_while_in_use(&p);
  test_peer_errors(&p);
  test_free_with_peer_gone(&p);

  CHECK_OK(pdx_unregister_memory(p.b, p.target));
  pdx_engine_free(p.a);
  pdx_engine_free(p.b);
  free(p.target);
  return pdx_test_finish("test_engine");
}
