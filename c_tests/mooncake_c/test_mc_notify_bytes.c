/* Notifications through pdx's libtransfer_engine.so are bytes:
 *
 * - a name and a message that are not UTF-8 (every byte 0x01-0xff, vLLM's
 *   `PUSH_REG:` + msgpack) reach the peer intact, by genNotifyInEngine and
 *   riding on a batch (one pdx batch, and the batch of two submits whose
 *   notification this layer sends itself);
 * - an 8 MiB notification is refused before anything is sent, naming the
 *   peer's frame limit (MC_HANDSHAKE_MAX_LENGTH), not a reset connection;
 *   the batch it would ride on starts nothing; the peer is unaffected;
 * - pdx_last_error_message(): a call that succeeds but reports a FAILED
 *   task replaces the text; other successful calls leave it as it was. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>

#include "harness.h"

#define REGION 65536

struct pair {
  transfer_engine_t a, b;
  char a_name[64], b_name[64];
  int seg, back; /* a -> b, b -> a */
  uint8_t *a_mem, *b_mem;
};

static void pair_start(struct pair *p) {
  p->a = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  p->b = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  if (p->a == NULL || p->b == NULL) {
    fprintf(stderr, "createTransferEngine: %s\n", pdx_last_error_message());
    exit(1);
  }
  CHECK_EQ(getLocalIpAndPort(p->a, p->a_name, sizeof p->a_name), 0);
  CHECK_EQ(getLocalIpAndPort(p->b, p->b_name, sizeof p->b_name), 0);
  p->a_mem = calloc(1, REGION);
  p->b_mem = calloc(1, REGION);
  CHECK_EQ(registerLocalMemory(p->a, p->a_mem, REGION, "*", 1), 0);
  CHECK_EQ(registerLocalMemory(p->b, p->b_mem, REGION, "*", 1), 0);
  p->seg = openSegment(p->a, p->b_name);
  p->back = openSegment(p->b, p->a_name);
  CHECK(p->seg > 0 && p->back > 0);
}

static void pair_stop(struct pair *p) {
  CHECK_EQ(unregisterLocalMemory(p->a, p->a_mem), 0);
  CHECK_EQ(unregisterLocalMemory(p->b, p->b_mem), 0);
  destroyTransferEngine(p->a);
  destroyTransferEngine(p->b);
  free(p->a_mem);
  free(p->b_mem);
}

/* Wait for one notification at `e` and check its bytes. */
static void expect_one(transfer_engine_t e, const char *name, const char *msg) {
  double deadline = mc_now() + 30;
  int size = 0;
  notify_msg_t *m = NULL;
  while (size == 0 && mc_now() < deadline) {
    m = getNotifsFromEngine(e, &size);
    if (size == 0) mc_sleep_ms(1);
  }
  CHECK_EQ(size, 1);
  if (size >= 1) {
    CHECK_EQ(strlen(m[0].name), strlen(name));
    CHECK_EQ(strlen(m[0].msg), strlen(msg));
    CHECK(strcmp(m[0].name, name) == 0);
    CHECK(memcmp(m[0].msg, msg, strlen(msg) + 1) == 0);
  }
  CHECK_EQ(freeNotifsMsgBuf(m, size), 0);
}

static void expect_none(transfer_engine_t e) {
  int size = -1;
  notify_msg_t *m = getNotifsFromEngine(e, &size);
  CHECK(m == NULL);
  CHECK_EQ(size, 0);
}

/* Poll every task of `batch` to its end; how many completed. */
static int completed(transfer_engine_t e, uint64_t batch, size_t tasks) {
  int done = 0;
  for (size_t t = 0; t < tasks; t++) {
    transfer_status_t s = {-1, 0};
    double deadline = mc_now() + 30;
    do {
      CHECK_EQ(getTransferStatus(e, batch, t, &s), 0);
    } while ((s.status == STATUS_WAITING || s.status == STATUS_PENDING) && mc_now() < deadline);
    done += s.status == STATUS_COMPLETED;
  }
  return done;
}

static void bytes_arrive_intact(void) {
  struct pair p;
  pair_start(&p);
  char every[256], name[] = "n\xff\x80\xc3";
  for (int i = 0; i < 255; i++) every[i] = (char)(255 - i); /* 0xff .. 0x01 */
  every[255] = 0;
  /* vLLM's NixlPushConnector: "PUSH_REG:" then msgpack (no NUL in this one). */
  const char push[] = "PUSH_REG:\x82\xa4name\xa1" "A\xa4mems\x92\xcd\x10\x8b\xce\xff\xff\xff\xff";

  notify_msg_t m = {name, every};
  CHECK_EQ(genNotifyInEngine(p.a, (uint64_t)p.seg, m), 0);
  expect_one(p.b, name, every);
  notify_msg_t reg = {(char *)"Agent1", (char *)push};
  CHECK_EQ(genNotifyInEngine(p.b, (uint64_t)p.back, reg), 0);
  expect_one(p.a, "Agent1", push);

  /* Riding on one pdx batch. */
  uint64_t batch = allocateBatchID(p.a, 4);
  transfer_request_t r = {OPCODE_WRITE, p.a_mem, p.seg, (uint64_t)(uintptr_t)p.b_mem, 4096};
  notify_msg_t ride = {(char *)"Agent1", (char *)push};
  CHECK_EQ(submitTransferWithNotify(p.a, batch, &r, 1, ride), 0);
  CHECK_EQ(completed(p.a, batch, 1), 1);
  expect_one(p.b, "Agent1", push);
  CHECK_EQ(freeBatchID(p.a, batch), 0);

  /* Sent by this layer once both submits of the batch completed. */
  batch = allocateBatchID(p.a, 4);
  CHECK_EQ(submitTransfer(p.a, batch, &r, 1), 0);
  notify_msg_t later = {name, every};
  CHECK_EQ(submitTransferWithNotify(p.a, batch, &r, 1, later), 0);
  CHECK_EQ(completed(p.a, batch, 2), 2);
  CHECK_EQ(freeBatchID(p.a, batch), 0);
  expect_one(p.b, name, every);
  expect_none(p.b);
  pair_stop(&p);
}

static void too_large_is_refused_before_sending(void) {
  struct pair p;
  pair_start(&p);
  size_t len = 8u << 20;
  char *big = malloc(len + 1);
  CHECK(big != NULL);
  memset(big, 'x', len);
  big[len] = 0;
  notify_msg_t m = {(char *)"kv", big};
  CHECK_EQ(genNotifyInEngine(p.a, (uint64_t)p.seg, m), -1);
  CHECK_REASON("handshake frame limit of 1048576 bytes");
  CHECK_REASON("MC_HANDSHAKE_MAX_LENGTH");

  uint64_t batch = allocateBatchID(p.a, 4);
  memset(p.a_mem, 7, 4096);
  transfer_request_t r = {OPCODE_WRITE, p.a_mem, p.seg, (uint64_t)(uintptr_t)p.b_mem, 4096};
  CHECK_EQ(submitTransferWithNotify(p.a, batch, &r, 1, m), 1);
  CHECK_REASON("MC_HANDSHAKE_MAX_LENGTH");
  transfer_status_t s;
  CHECK_EQ(getTransferStatus(p.a, batch, 0, &s), 1); /* no task was queued */
  CHECK(p.b_mem[0] == 0);
  /* The batch, the engines and the peer are as they were. */
  notify_msg_t small = {(char *)"kv", (char *)"after"};
  CHECK_EQ(submitTransferWithNotify(p.a, batch, &r, 1, small), 0);
  CHECK_EQ(completed(p.a, batch, 1), 1);
  CHECK(p.b_mem[0] == 7);
  CHECK_EQ(freeBatchID(p.a, batch), 0);
  expect_one(p.b, "kv", "after");
  expect_none(p.b);
  free(big);
  pair_stop(&p);
}

static void last_error_lives_until_the_next_reason(void) {
  struct pair p;
  pair_start(&p);
  CHECK_EQ(openSegment(p.a, ""), -1);
  const char *first = pdx_last_error_message();
  CHECK(strstr(first, "segment name is empty") != NULL);
  /* Calls that succeed leave it as it was (the same text, the same pointer). */
  char name[64];
  CHECK_EQ(getLocalIpAndPort(p.a, name, sizeof name), 0);
  uint64_t batch = allocateBatchID(p.a, 2);
  transfer_request_t ok = {OPCODE_WRITE, p.a_mem, p.seg, (uint64_t)(uintptr_t)p.b_mem, 64};
  CHECK_EQ(submitTransfer(p.a, batch, &ok, 1), 0);
  CHECK_EQ(completed(p.a, batch, 1), 1);
  CHECK(pdx_last_error_message() == first);
  CHECK(strstr(first, "segment name is empty") != NULL);
  /* getTransferStatus returns 0 for a FAILED task and its reason replaces the text. */
  transfer_request_t bad = {OPCODE_WRITE, p.a_mem, p.seg, (uint64_t)(uintptr_t)p.b_mem + REGION, 64};
  CHECK_EQ(submitTransfer(p.a, batch, &bad, 1), 0);
  transfer_status_t s = {-1, 0};
  double deadline = mc_now() + 30;
  do {
    CHECK_EQ(getTransferStatus(p.a, batch, 1, &s), 0);
  } while ((s.status == STATUS_WAITING || s.status == STATUS_PENDING) && mc_now() < deadline);
  CHECK_EQ(s.status, STATUS_FAILED);
  CHECK_REASON("task 1 of batch");
  CHECK(strstr(pdx_last_error_message(), "segment name is empty") == NULL);
  CHECK_EQ(freeBatchID(p.a, batch), 0);
  pair_stop(&p);
}

int main(void) {
  setenv("MC_FORCE_TCP", "1", 1);
  bytes_arrive_intact();
  too_large_is_refused_before_sending();
  last_error_lives_until_the_next_reason();
  return mc_finish("test_mc_notify_bytes");
}
