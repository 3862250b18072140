/* The ABI of pdx's transfer_engine_c.h pinned against the facts of
 * Mooncake's C API (x86-64, LP64): every size, offset and value, and every
 * function's exact type (each is assigned to a pointer of the type Mooncake
 * declares, so a drifting prototype is a compile error under -Werror, and a
 * missing export a link error). */
#include "harness.h"

#include <stddef.h>
#include <stdint.h>

#define PIN_SIZE(t, n) _Static_assert(sizeof(t) == (n), "sizeof " #t)
#define PIN_OFF(t, f, n) _Static_assert(offsetof(t, f) == (n), "offsetof " #t "." #f)

PIN_SIZE(segment_id_t, 4);
PIN_SIZE(segment_handle_t, 4);
PIN_SIZE(batch_id_t, 8);
PIN_SIZE(transfer_engine_t, 8);
PIN_SIZE(transport_t, 8);

PIN_SIZE(struct transfer_request, 40);
PIN_OFF(struct transfer_request, opcode, 0);
PIN_OFF(struct transfer_request, source, 8);
PIN_OFF(struct transfer_request, target_id, 16);
PIN_OFF(struct transfer_request, target_offset, 24);
PIN_OFF(struct transfer_request, length, 32);
PIN_SIZE(transfer_request_t, 40);

PIN_SIZE(struct transfer_status, 16);
PIN_OFF(struct transfer_status, status, 0);
PIN_OFF(struct transfer_status, transferred_bytes, 8);
PIN_SIZE(transfer_status_t, 16);

PIN_SIZE(struct notify_msg, 16);
PIN_OFF(struct notify_msg, name, 0);
PIN_OFF(struct notify_msg, msg, 8);
PIN_SIZE(notify_msg_t, 16);

PIN_SIZE(struct buffer_entry, 16);
PIN_OFF(struct buffer_entry, addr, 0);
PIN_OFF(struct buffer_entry, length, 8);
PIN_SIZE(buffer_entry_t, 16);

PIN_SIZE(struct segment_desc, 48);
PIN_OFF(struct segment_desc, type, 0);
PIN_OFF(struct segment_desc, desc_, 8);
PIN_OFF(struct segment_desc, desc_.rdma.addr, 8);
PIN_OFF(struct segment_desc, desc_.rdma.size, 16);
PIN_OFF(struct segment_desc, desc_.rdma.location, 24);
PIN_OFF(struct segment_desc, desc_.nvmeof.file_path, 8);
PIN_OFF(struct segment_desc, desc_.nvmeof.ip, 32);
PIN_OFF(struct segment_desc, desc_.nvmeof.port, 40);
PIN_SIZE(segment_desc_t, 48);

PIN_SIZE(struct nic_load_stat, 80);
PIN_OFF(struct nic_load_stat, device_name, 0);
PIN_OFF(struct nic_load_stat, inflight_bytes, 64);
PIN_OFF(struct nic_load_stat, ewma_bandwidth_bps, 72);
PIN_SIZE(nic_load_stat_t, 80);

_Static_assert(LOCAL_SEGMENT == 0, "LOCAL_SEGMENT");
_Static_assert(INVALID_BATCH == UINT64_MAX, "INVALID_BATCH");
_Static_assert(OPCODE_READ == 0 && OPCODE_WRITE == 1, "opcodes");
_Static_assert(STATUS_WAITING == 0 && STATUS_PENDING == 1 && STATUS_INVALID == 2 && STATUS_CANCELED == 3 &&
                   STATUS_COMPLETED == 4 && STATUS_TIMEOUT == 5 && STATUS_FAILED == 6,
               "status values");

/* Each function with Mooncake's declared type. */
static transfer_engine_t (*const p_create)(const char *, const char *, const char *, uint64_t, int) =
    createTransferEngine;
static void (*const p_destroy)(transfer_engine_t) = destroyTransferEngine;
static int (*const p_ip_port)(transfer_engine_t, char *, size_t) = getLocalIpAndPort;
static int (*const p_discover)(transfer_engine_t) = discoverTopology;
static transport_t (*const p_install)(transfer_engine_t, const char *, void **) = installTransport;
static int (*const p_uninstall)(transfer_engine_t, const char *) = uninstallTransport;
static int32_t (*const p_open)(transfer_engine_t, const char *) = openSegment;
static int32_t (*const p_open_nc)(transfer_engine_t, const char *) = openSegmentNoCache;
static int (*const p_close)(transfer_engine_t, int32_t) = closeSegment;
static int (*const p_remove_local)(transfer_engine_t, const char *) = removeLocalSegment;
static int (*const p_reg)(transfer_engine_t, void *, size_t, const char *, int) = registerLocalMemory;
static int (*const p_unreg)(transfer_engine_t, void *) = unregisterLocalMemory;
static int (*const p_reg_batch)(transfer_engine_t, buffer_entry_t *, size_t, const char *) = registerLocalMemoryBatch;
static int (*const p_unreg_batch)(transfer_engine_t, void **, size_t) = unregisterLocalMemoryBatch;
static uint64_t (*const p_alloc)(transfer_engine_t, size_t) = allocateBatchID;
static int (*const p_submit)(transfer_engine_t, uint64_t, struct transfer_request *, size_t) = submitTransfer;
static int (*const p_submit_n)(transfer_engine_t, uint64_t, struct transfer_request *, size_t, notify_msg_t) =
    submitTransferWithNotify;
static notify_msg_t *(*const p_get_notifs)(transfer_engine_t, int *) = getNotifsFromEngine;
static int (*const p_free_notifs)(notify_msg_t *, int) = freeNotifsMsgBuf;
static int (*const p_gen_notify)(transfer_engine_t, uint64_t, notify_msg_t) = genNotifyInEngine;
static int (*const p_status)(transfer_engine_t, uint64_t, size_t, struct transfer_status *) = getTransferStatus;
static int (*const p_free_batch)(transfer_engine_t, uint64_t) = freeBatchID;
static int (*const p_sync)(transfer_engine_t) = syncSegmentCache;
static int (*const p_nic)(transfer_engine_t, nic_load_stat_t *, size_t *) = getNicLoadStats;
static void (*const p_graceful)(transfer_engine_t) = enableGracefulShutdown;
static int (*const p_links)(transfer_engine_t, char *, size_t, int) = showLinks;
static int (*const p_efa)(transfer_engine_t, const char *) = warmupEfaSegment;

int main(void) {
  typedef void (*any_fn)(void);
  const any_fn all[] = {
      (any_fn)p_create,
      (any_fn)p_destroy,
      (any_fn)p_ip_port,
      (any_fn)p_discover,
      (any_fn)p_install,
      (any_fn)p_uninstall,
      (any_fn)p_open,
      (any_fn)p_open_nc,
      (any_fn)p_close,
      (any_fn)p_remove_local,
      (any_fn)p_reg,
      (any_fn)p_unreg,
      (any_fn)p_reg_batch,
      (any_fn)p_unreg_batch,
      (any_fn)p_alloc,
      (any_fn)p_submit,
      (any_fn)p_submit_n,
      (any_fn)p_get_notifs,
      (any_fn)p_free_notifs,
      (any_fn)p_gen_notify,
      (any_fn)p_status,
      (any_fn)p_free_batch,
      (any_fn)p_sync,
      (any_fn)p_nic,
      (any_fn)p_graceful,
      (any_fn)p_links,
      (any_fn)p_efa,
  };
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CHECK(all[i] != NULL);
  CHECK_EQ(sizeof all / sizeof all[0], 27);
  /* The same facts at run time (a build without static asserts still checks). */
  CHECK_EQ(sizeof(struct transfer_request), 40);
  CHECK_EQ(offsetof(struct nic_load_stat, ewma_bandwidth_bps), 72);
  CHECK(pdx_last_error_message() != NULL);
  return mc_finish("test_mc_abi");
}
