/*
 * transfer_engine_c.h: Mooncake's C API as pdx's libtransfer_engine.so serves it.
 *
 * Programs written against Mooncake Transfer Engine's C API compile against
 * this header and link -ltransfer_engine unchanged; the library underneath
 * is pdx's native TCP engine (Mooncake's wire protocol, so pdx and Mooncake
 * peers exchange data and notifications). Names, types, struct layouts and
 * values are Mooncake's (LP64); the comments are pdx's. See
 * docs/mooncake-c-api.md for what is served and what is not.
 *
 * Conventions:
 * - Strings passed in are read during the call only.
 * - Errors: the calls that report one of Mooncake's status codes
 *   (submitTransfer, submitTransferWithNotify, getTransferStatus,
 *   freeBatchID) return it as a positive number; the other int calls return
 *   it negated (-1 invalid argument, -3 address not registered, -102
 *   socket, ...). createTransferEngine and installTransport return NULL,
 *   allocateBatchID INVALID_BATCH. Every failure is logged and its reason is
 *   left in pdx_last_error_message() (per thread; see there for how long
 *   the text lives).
 * - A NULL, destroyed or made-up engine, batch or segment is an error, never
 *   a crash.
 */
#ifndef PDX_TRANSFER_ENGINE_C_H
#define PDX_TRANSFER_ENGINE_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Segment ids (openSegment's result) and batch ids. As in Mooncake these
 * are macros, not typedefs. */
#define segment_handle_t int32_t
#define segment_id_t int32_t
#define batch_id_t uint64_t

/* The engine's own segment. */
#define LOCAL_SEGMENT (0)
/* allocateBatchID's answer when it cannot give a batch. */
#define INVALID_BATCH UINT64_MAX

/* transfer_request.opcode */
#define OPCODE_READ (0)  /* peer memory at target_offset -> source */
#define OPCODE_WRITE (1) /* source -> peer memory at target_offset */

/* One entry of a batch (40 bytes). */
struct transfer_request {
    int opcode;             /* OPCODE_READ or OPCODE_WRITE */
    void *source;           /* local memory, registered with registerLocalMemory */
    segment_id_t target_id; /* an id from openSegment (or LOCAL_SEGMENT) */
    uint64_t target_offset; /* the absolute address in the peer's process */
    uint64_t length;        /* bytes */
};
typedef struct transfer_request transfer_request_t;

/* A notification: who sent it and what it says (16 bytes). Each string is
 * bytes up to its NUL, UTF-8 or not: sent as they are, they reach a pdx
 * peer intact and a Mooncake peer's queue intact (what Mooncake does to
 * bytes it sends: docs/mooncake-c-api.md). Bytes after a NUL cannot pass
 * this API. */
struct notify_msg {
    char *name;
    char *msg;
};
typedef struct notify_msg notify_msg_t;

/* transfer_status.status */
#define STATUS_WAITING (0)   /* in flight */
#define STATUS_PENDING (1)   /* in flight */
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4) /* every byte confirmed at the target */
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

/* One task's state (16 bytes). */
struct transfer_status {
    int status;                 /* a STATUS_* value */
    uint64_t transferred_bytes; /* bytes moved so far */
};

/* A segment's description (48 bytes); declared for source compatibility,
 * taken by no call. */
struct segment_desc {
    int type;
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path;
            const char *subsystem_name;
            const char *proto;
            const char *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};

typedef struct transfer_status transfer_status_t;

/* One buffer to register (16 bytes). */
struct buffer_entry {
    void *addr;
    size_t length;
};
typedef struct buffer_entry buffer_entry_t;
typedef struct segment_desc segment_desc_t;

/* Opaque handles. */
typedef void *transfer_engine_t;
typedef void *transport_t;

/* ------------------------------------------------------------- engine */

/* Create an engine. metadata_conn_string: "P2PHANDSHAKE" (peers find each
 * other by "ip:rpc_port"), Mooncake's HTTP metadata server
 * ("http://host:port/metadata") or etcd ("etcd://host:port"). The engine
 * runs on the host of local_server_name (else ip_or_host_name); its ports
 * are picked in MC_MIN_RPC_PORT..MC_MAX_RPC_PORT. With auto_discover
 * non-zero the transport is installed now: tcp (pdx's engine) unless the
 * machine has RDMA devices, MC_FORCE_TCP is unset and PDX_MOONCAKE_LIB
 * names Mooncake's own library. NULL on failure. */
transfer_engine_t createTransferEngine(const char *metadata_conn_string, const char *local_server_name,
                                       const char *ip_or_host_name, uint64_t rpc_port, int auto_discover);

/* Nothing to discover for TCP; 0. */
int discoverTopology(transfer_engine_t engine);

/* snprintf "ip:rpc_port" into buf_out: the name peers pass to openSegment. 0. */
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

/* "tcp": pdx's native engine. Another protocol runs on Mooncake's own
 * library, named by its path in PDX_MOONCAKE_LIB, or fails saying so. One
 * transport per engine. args is not used. NULL on failure. The memory the
 * engine registered is served by the new transport at once. */
transport_t installTransport(transfer_engine_t engine, const char *proto, void **args);
/* Stop the transport; 0. Batches keep their tasks' states (a task still in
 * flight reads STATUS_FAILED) and their ids, which no later transport
 * reuses; registered memory stays registered for the next transport
 * (registering such a region again, same address and length, returns 0
 * where Mooncake returns -7). */
int uninstallTransport(transfer_engine_t engine, const char *proto);

/* ----------------------------------------------------------- segments */

/* The id of a peer's segment ("ip:rpc_port"): reached once, then cached,
 * the same id for the same name until closeSegment. Negative on failure
 * (-101 unknown host, -102 unreachable, ...). */
segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);
/* openSegment, reaching the peer again even when the segment is open. */
segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name);
int closeSegment(transfer_engine_t engine, segment_id_t segment_id);
/* No EFA here: 0. */
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);
/* 0; the engine's descriptor is withdrawn when it is destroyed. */
int removeLocalSegment(transfer_engine_t engine, const char *segment_name);

/* Free the engine (NULL is ignored). */
void destroyTransferEngine(transfer_engine_t engine);

/* ------------------------------------------------------------- memory */

/* Register [addr, addr+length): peers may read and write it, and it may be
 * the source of requests. location: "*" (find out), "cpu:N", "cuda:N". */
int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length, const char *location,
                        int remote_accessible);
/* 0; -3 (address not registered) when no region this engine registered
 * starts at addr. */
int unregisterLocalMemory(transfer_engine_t engine, void *addr);
/* All or none. */
int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list, size_t buffer_len,
                             const char *location);
int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len);

/* ------------------------------------------------------------ batches */

/* A batch with room for batch_size tasks; INVALID_BATCH on failure. */
batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);

/* Queue count requests; their task ids follow those already submitted to
 * the batch (0, 1, ... across submits). 0, or a positive status code
 * (1 invalid argument, 2 over the batch's size, 3 unregistered source). */
int submitTransfer(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries, size_t count);

/* submitTransfer, and once the whole batch has completed one notification
 * {name, msg} reaches the target of the first entry. A notification whose
 * handshake frame would be over the peer's limit (MC_HANDSHAKE_MAX_LENGTH,
 * 1 MiB by default, which a peer enforces by closing the connection) is
 * refused with 1 before anything starts, saying so. */
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries,
                             size_t count, notify_msg_t notify_msg);

/* Drain the notifications received: a malloc'ed array of *size entries with
 * malloc'ed strings (the bytes as they arrived, cut at the first NUL, as
 * Mooncake's are), or NULL when there is none. Release with
 * freeNotifsMsgBuf. */
notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);
int freeNotifsMsgBuf(notify_msg_t *msg, int size);

/* A notification with no transfer, to an opened segment id; 0. -1, before
 * sending, when its frame would be over the peer's limit (as for
 * submitTransferWithNotify). */
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg);

/* Task task_id's state; *status is written only when 0 is returned. */
int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      struct transfer_status *status);

/* 0: freed. Tasks still in flight are cancelled first; once 0 is returned
 * nothing reads or writes their local memory any more (pdx; Mooncake answers
 * 4, batch busy, and keeps the batch, as pdx does with
 * PDX_FREE_BATCH_IN_FLIGHT=busy or when a cancel cannot be made sure of). */
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

/* Reach every open segment again. */
int syncSegmentCache(transfer_engine_t engine);

/* ---------------------------------------------------------- reporting */

/* One NIC's load (80 bytes). */
struct nic_load_stat {
    char device_name[64];
    uint64_t inflight_bytes;
    double ewma_bandwidth_bps;
};
typedef struct nic_load_stat nic_load_stat_t;

/* Copy up to *count entries, then set *count to how many exist: the rails
 * of multi-rail TCP that are up (PDX_TCP_RAILS), none without rails. */
int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats, size_t *count);

/* destroyTransferEngine then waits (30 s at most) for batches in flight. */
void enableGracefulShutdown(transfer_engine_t engine);

/* snprintf a text (json == 0) or JSON account of the engine and its open
 * segments into buf_out. */
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json);

/* -------------------------------------------------------- pdx's extra */

/* Why the last failing call on this thread failed; never NULL ("" when
 * none). The text belongs to the library and stays valid, unchanged, until
 * the next call on the same thread that records a reason: any call that
 * fails, and also getTransferStatus when it reports STATUS_FAILED (it
 * returns 0, and the failed task's reason replaces the text). Then, or
 * when the thread ends, the pointer is no longer valid. Other calls that
 * succeed leave the text as it is, so it may describe an older failure:
 * read it right after the call that failed, and copy it to keep it.
 * Another thread's calls never change it. */
const char *pdx_last_error_message(void);

#ifdef __cplusplus
}
#endif

#endif /* PDX_TRANSFER_ENGINE_C_H */
