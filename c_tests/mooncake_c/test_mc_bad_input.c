/* Bad input to pdx's libtransfer_engine.so gets an error, never a crash:
 * NULL, destroyed and made-up engines; NULL pointers and strings; unknown
 * batches, tasks and segments; unregistered memory; a batch over its size;
 * notifications without strings. Each failure returns the code Mooncake
 * returns for it (negative for the int calls, positive for the status
 * calls, NULL / INVALID_BATCH) and leaves its reason in
 * pdx_last_error_message(). Also: a transport pdx does not serve needs
 * Mooncake's library named by path (never this library itself), and with
 * one named (the test double of Mooncake's C API) it runs there. */
#include "harness.h"

#include <stdint.h>

#ifndef MC_SELF_LIB
#error "CMake passes MC_SELF_LIB, the path of libtransfer_engine.so under test"
#endif

#define REGION (1u << 20)

static transfer_engine_t start(void) {
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
  if (e == NULL) {
    fprintf(stderr, "createTransferEngine: %s\n", pdx_last_error_message());
    exit(1);
  }
  return e;
}

static void bad_engines(void) {
  void *bogus = (void *)(uintptr_t)0x1234;
  transfer_engine_t engines[] = {NULL, bogus};
  for (int i = 0; i < 2; i++) {
    transfer_engine_t e = engines[i];
    char buf[64] = "untouched";
    CHECK_EQ(getLocalIpAndPort(e, buf, sizeof buf), -1);
    CHECK(strcmp(buf, "untouched") == 0);
    CHECK_REASON("engine");
    CHECK_EQ(discoverTopology(e), -1);
    CHECK(installTransport(e, "tcp", NULL) == NULL);
    CHECK_EQ(uninstallTransport(e, "tcp"), -1);
    CHECK_EQ(openSegment(e, "127.0.0.1:1"), -1);
    CHECK_EQ(openSegmentNoCache(e, "127.0.0.1:1"), -1);
    CHECK_EQ(closeSegment(e, 1), -1);
    CHECK_EQ(removeLocalSegment(e, "x"), -1);
    CHECK_EQ(syncSegmentCache(e), -1);
    CHECK_EQ(warmupEfaSegment(e, "x"), -1);
    CHECK_EQ(registerLocalMemory(e, buf, sizeof buf, "*", 1), -1);
    CHECK_EQ(unregisterLocalMemory(e, buf), -1);
    CHECK(allocateBatchID(e, 1) == INVALID_BATCH);
    struct transfer_request r = {OPCODE_WRITE, buf, 1, 0, 1};
    CHECK_EQ(submitTransfer(e, 1, &r, 1), 1);
    transfer_status_t s = {77, 77};
    CHECK_EQ(getTransferStatus(e, 1, 0, &s), 1);
    CHECK(s.status == 77 && s.transferred_bytes == 77);
    CHECK_EQ(freeBatchID(e, 1), 1);
    int size = 5;
    CHECK(getNotifsFromEngine(e, &size) == NULL);
    CHECK_EQ(size, 0);
    notify_msg_t m = {(char *)"n", (char *)"m"};
    CHECK_EQ(genNotifyInEngine(e, 1, m), -1);
    nic_load_stat_t st[1];
    size_t count = 1;
    CHECK_EQ(getNicLoadStats(e, st, &count), -1);
    CHECK_EQ(showLinks(e, buf, sizeof buf, 0), -1);
    enableGracefulShutdown(e);
    destroyTransferEngine(e);
  }
}

static void bad_creates(void) {
  CHECK(createTransferEngine(NULL, "127.0.0.1", "", 0, 1) == NULL);
  CHECK_REASON("metadata_conn_string is NULL");
  CHECK(createTransferEngine("P2PHANDSHAKE", NULL, "", 0, 1) == NULL);
  CHECK_REASON("local_server_name is NULL");
  CHECK(createTransferEngine("P2PHANDSHAKE", "", "", 0, 1) == NULL);
  CHECK_REASON("empty");
  CHECK(createTransferEngine("P2PHANDSHAKE", "[::1", "", 0, 1) == NULL);
  CHECK_REASON("'['");
}

static void transports(void) {
  transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", NULL, 0, 0);
  CHECK(e != NULL);
  char buf[64];
  /* Nothing installed yet. */
  CHECK_EQ(registerLocalMemory(e, buf, sizeof buf, "*", 1), -1);
  CHECK_REASON("installTransport");
  CHECK(installTransport(e, NULL, NULL) == NULL);
  CHECK_REASON("proto is NULL");
  unsetenv("PDX_MOONCAKE_LIB");
  unsetenv("MC_FORCE_TCP"); /* it would turn "rdma" into "tcp", as everywhere in pdx */
  CHECK(installTransport(e, "rdma", NULL) == NULL);
  CHECK_REASON("PDX_MOONCAKE_LIB");
  setenv("PDX_MOONCAKE_LIB", "libtransfer_engine.so", 1); /* a file name, not a path */
  CHECK(installTransport(e, "rdma", NULL) == NULL);
  CHECK_REASON("named by its path");
  setenv("PDX_MOONCAKE_LIB", MC_SELF_LIB, 1); /* this very library */
  CHECK(installTransport(e, "rdma", NULL) == NULL);
  CHECK_REASON("pdx's own");
  unsetenv("PDX_MOONCAKE_LIB");
  setenv("MC_FORCE_TCP", "1", 1);
  transport_t t = installTransport(e, "tcp", NULL);
  CHECK(t != NULL);
  CHECK(installTransport(e, "tcp", NULL) == t);
  CHECK(installTransport(e, "efa", NULL) == NULL);
  CHECK_REASON("already runs");
  CHECK_EQ(uninstallTransport(e, "rdma"), -1);
  CHECK_EQ(uninstallTransport(e, NULL), -1);
  CHECK_EQ(uninstallTransport(e, "tcp"), 0);
  CHECK_EQ(openSegment(e, "127.0.0.1:1"), -1);
  CHECK(installTransport(e, "tcp", NULL) != NULL);
  destroyTransferEngine(e);
  destroyTransferEngine(e); /* twice: ignored */
  CHECK_EQ(discoverTopology(e), -1);
  CHECK_REASON("not a live engine");
}

static void bad_calls(void) {
  transfer_engine_t e = start(), peer = start();
  static char mem[REGION], other[REGION];
  char name[64], peer_name[64];
  CHECK_EQ(getLocalIpAndPort(e, name, sizeof name), 0);
  CHECK_EQ(getLocalIpAndPort(peer, peer_name, sizeof peer_name), 0);
  CHECK_EQ(getLocalIpAndPort(e, NULL, 8), -1);
  CHECK_EQ(getLocalIpAndPort(e, NULL, 0), 0);
  char tiny[4];
  CHECK_EQ(getLocalIpAndPort(e, tiny, sizeof tiny), 0); /* cut, as snprintf cuts */
  CHECK(strcmp(tiny, "127") == 0);
  CHECK_EQ(discoverTopology(e), 0);
  CHECK_EQ(warmupEfaSegment(e, "x"), 0);
  CHECK_EQ(removeLocalSegment(e, NULL), -1);

  /* Segments. */
  CHECK_EQ(openSegment(e, NULL), -1);
  CHECK_REASON("segment_name is NULL");
  CHECK_EQ(openSegment(e, ""), -1);
  CHECK_EQ(openSegment(e, "127.0.0.1:1"), -102);
  CHECK_REASON("127.0.0.1:1");
  CHECK_EQ(openSegment(e, "no-such-host.invalid:1234"), -101);
  CHECK_EQ(openSegment(e, "127.0.0.1:notaport"), -1);
  CHECK_EQ(closeSegment(e, 999), -1);
  CHECK_EQ(closeSegment(e, LOCAL_SEGMENT), 0);
  int seg = openSegment(e, peer_name);
  CHECK(seg > 0);
  CHECK_EQ(syncSegmentCache(e), 0);

  /* Memory. */
  CHECK_EQ(registerLocalMemory(e, NULL, 16, "*", 1), -1);
  CHECK_EQ(registerLocalMemory(e, mem, 0, "*", 1), -1);
  CHECK_EQ(registerLocalMemory(e, mem, sizeof mem, NULL, 1), -1);
  CHECK_REASON("location is NULL");
  CHECK_EQ(registerLocalMemory(e, mem, sizeof mem, "gpu:0", 1), -1);
  CHECK_EQ(registerLocalMemory(e, mem, sizeof mem, "cpu:0", 1), 0);
  CHECK_EQ(registerLocalMemory(e, mem + 16, 16, "*", 1), -7);
  CHECK_REASON("overlaps");
  CHECK_EQ(unregisterLocalMemory(e, mem + 1), -3);
  CHECK_EQ(unregisterLocalMemory(e, NULL), -1);
  CHECK_EQ(registerLocalMemoryBatch(e, NULL, 2, "*"), -1);
  buffer_entry_t twice[2] = {{other, 64}, {other + 32, 64}};
  CHECK_EQ(registerLocalMemoryBatch(e, twice, 2, "*"), -7);
  CHECK_EQ(unregisterLocalMemory(e, other), -3); /* all or none: nothing was registered */
  void *addrs[2] = {mem, other};
  CHECK_EQ(unregisterLocalMemoryBatch(e, addrs, 2), -3);
  CHECK_EQ(unregisterLocalMemoryBatch(e, NULL, 1), -1);
  CHECK_EQ(registerLocalMemory(peer, other, sizeof other, "*", 1), 0);

  /* Batches and tasks. */
  CHECK(allocateBatchID(e, SIZE_MAX) == INVALID_BATCH);
  CHECK_REASON("over the limit");
  uint64_t b = allocateBatchID(e, 2);
  CHECK(b != INVALID_BATCH && b != 0);
  struct transfer_request ok = {OPCODE_WRITE, mem, seg, (uint64_t)(uintptr_t)other, 64};
  struct transfer_request r;
  CHECK_EQ(submitTransfer(e, b ^ 0x5555, &ok, 1), 1);
  CHECK_REASON("not a batch of this engine");
  CHECK_EQ(submitTransfer(e, INVALID_BATCH, &ok, 1), 1);
  CHECK_EQ(submitTransfer(e, b, NULL, 1), 1);
  r = ok;
  r.opcode = 7;
  CHECK_EQ(submitTransfer(e, b, &r, 1), 1);
  CHECK_REASON("opcode 7");
  r = ok;
  r.source = NULL;
  CHECK_EQ(submitTransfer(e, b, &r, 1), 1);
  r = ok;
  r.source = other; /* registered at the peer, not here */
  CHECK_EQ(submitTransfer(e, b, &r, 1), 3);
  CHECK_REASON("not inside one registered region");
  r = ok;
  r.length = sizeof mem + 1; /* runs past the region */
  CHECK_EQ(submitTransfer(e, b, &r, 1), 3);
  r = ok;
  r.target_id = 77;
  CHECK_EQ(submitTransfer(e, b, &r, 1), 1);
  CHECK_REASON("segment 77 is not open");
  struct transfer_request three[3] = {ok, ok, ok};
  CHECK_EQ(submitTransfer(e, b, three, 3), 2);
  CHECK_REASON("room for 2");
  notify_msg_t no_name = {NULL, (char *)"m"};
  CHECK_EQ(submitTransferWithNotify(e, b, &ok, 1, no_name), 1);
  notify_msg_t m = {(char *)"n", (char *)"m"};
  CHECK_EQ(submitTransferWithNotify(e, b, &ok, 0, m), 1);
  CHECK_REASON("must not be empty");
  transfer_status_t s = {77, 77};
  CHECK_EQ(getTransferStatus(e, b, 0, &s), 1); /* nothing submitted: no task 0 */
  CHECK(s.status == 77);
  /* A write outside the peer's registered memory: the task fails (the
   * call itself succeeds), with the reason. */
  r = ok;
  r.target_offset = (uint64_t)(uintptr_t)other + sizeof other;
  CHECK_EQ(submitTransfer(e, b, &r, 1), 0);
  CHECK_EQ(submitTransfer(e, b, &ok, 1), 0);
  double deadline = mc_now() + 30;
  int states[2] = {STATUS_WAITING, STATUS_WAITING};
  while ((states[0] < STATUS_COMPLETED || states[1] < STATUS_COMPLETED) && mc_now() < deadline) {
    for (int t = 0; t < 2; t++) {
      CHECK_EQ(getTransferStatus(e, b, (size_t)t, &s), 0);
      states[t] = s.status;
    }
  }
  CHECK_EQ(states[0], STATUS_FAILED);
  CHECK_EQ(states[1], STATUS_COMPLETED);
  CHECK_EQ(getTransferStatus(e, b, 0, &s), 0);
  CHECK_REASON("task 0");
  CHECK_EQ(getTransferStatus(e, b, 2, &s), 1);
  CHECK_EQ(getTransferStatus(e, b, 0, NULL), 1);
  CHECK_EQ(freeBatchID(e, b), 0);
  CHECK_EQ(freeBatchID(e, b), 1); /* freed */
  CHECK_EQ(getTransferStatus(e, b, 1, &s), 1);
  CHECK_EQ(freeBatchID(peer, allocateBatchID(e, 1)), 1); /* another engine's batch */

  /* Notifications. */
  int size = 3;
  CHECK(getNotifsFromEngine(e, NULL) == NULL);
  CHECK(getNotifsFromEngine(e, &size) == NULL);
  CHECK_EQ(size, 0);
  CHECK_EQ(freeNotifsMsgBuf(NULL, 0), 0);
  CHECK_EQ(freeNotifsMsgBuf(NULL, 3), -1);
  CHECK_EQ(freeNotifsMsgBuf(NULL, -1), -1);
  CHECK_EQ(genNotifyInEngine(e, 999, m), -200);
  CHECK_REASON("segment 999 is not open");
  CHECK_EQ(genNotifyInEngine(e, UINT64_MAX, m), -200);
  CHECK_EQ(genNotifyInEngine(e, (uint64_t)seg, no_name), -1);
  notify_msg_t no_msg = {(char *)"n", NULL};
  CHECK_EQ(genNotifyInEngine(e, (uint64_t)seg, no_msg), -1);

  /* Reporting. */
  nic_load_stat_t st[2];
  size_t count = 2;
  CHECK_EQ(getNicLoadStats(e, NULL, &count), -1);
  CHECK_EQ(getNicLoadStats(e, st, NULL), -1);
  CHECK_EQ(getNicLoadStats(e, st, &count), 0);
  CHECK_EQ(count, 0); /* one address, no rails */
  char links[4096];
  CHECK_EQ(showLinks(e, NULL, 8, 0), -1);
  CHECK_EQ(showLinks(e, links, 0, 0), -1);
  CHECK_EQ(showLinks(e, links, sizeof links, 1), 0);
  CHECK(links[0] == '{' && strstr(links, peer_name) != NULL);
  CHECK_EQ(showLinks(e, links, sizeof links, 0), 0);
  CHECK(strstr(links, name) != NULL);

  CHECK_EQ(unregisterLocalMemory(e, mem), 0);
  CHECK_EQ(unregisterLocalMemory(e, mem), -3);
  enableGracefulShutdown(e);
  destroyTransferEngine(e);
  destroyTransferEngine(peer);
}

#ifdef FAKE_TE_LIB
/* With Mooncake's library named by path (here the test double of its C
 * API), another protocol installs and moves bytes there. */
static void delegated(void) {
  setenv("PDX_MOONCAKE_LIB", FAKE_TE_LIB, 1);
  unsetenv("MC_FORCE_TCP");
  transfer_engine_t a = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 0);
  transfer_engine_t b = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 0);
  CHECK(a != NULL && b != NULL);
  CHECK(installTransport(a, "rdma", NULL) != NULL);
  CHECK(installTransport(b, "rdma", NULL) != NULL);
  static char src[4096], dst[4096];
  memset(src, 'r', sizeof src);
  CHECK_EQ(registerLocalMemory(a, src, sizeof src, "cpu:0", 1), 0);
  CHECK_EQ(registerLocalMemory(b, dst, sizeof dst, "cpu:0", 1), 0);
  char bname[64];
  CHECK_EQ(getLocalIpAndPort(b, bname, sizeof bname), 0);
  int seg = openSegment(a, bname);
  CHECK(seg > 0);
  uint64_t batch = allocateBatchID(a, 4);
  struct transfer_request r = {OPCODE_WRITE, src, seg, (uint64_t)(uintptr_t)dst, sizeof src};
  CHECK_EQ(submitTransfer(a, batch, &r, 1), 0);
  transfer_status_t s = {0, 0};
  double deadline = mc_now() + 10;
  do {
    CHECK_EQ(getTransferStatus(a, batch, 0, &s), 0);
  } while (s.status == STATUS_WAITING && mc_now() < deadline);
  CHECK_EQ(s.status, STATUS_COMPLETED);
  CHECK(memcmp(src, dst, sizeof src) == 0);
  CHECK_EQ(freeBatchID(a, batch), 0);
  destroyTransferEngine(a);
  destroyTransferEngine(b);
  unsetenv("PDX_MOONCAKE_LIB");
}
#endif

int main(void) {
  setenv("MC_FORCE_TCP", "1", 1);
  bad_engines();
  bad_creates();
  transports();
  bad_calls();
#ifdef FAKE_TE_LIB
  delegated();
#endif
  return mc_finish("test_mc_bad_input");
}
