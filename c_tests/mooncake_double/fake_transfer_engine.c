/*
 * TEST DOUBLE of Mooncake's Transfer Engine C API (transfer_engine_c.h).
 *
 * This is NOT Mooncake. It is a small shared library built only for the pdx
 * C tests and loaded by pdx through PDX_MOONCAKE_LIB, to prove that pdx
 * marshals Mooncake's C API correctly: strings, arrays, batch ids, status
 * polling and errors. Written from the documented declarations.
 *
 * What it does:
 *  - Engines live in one process. Each gets the name "host:port" (port from
 *    a counter); openSegment(name) finds another fake engine by that name,
 *    and transfers memcpy between the two engines' registered memory.
 *  - Batch ids are pointers cast to uint64_t, as in Mooncake. Every id pdx
 *    passes back is checked against the live batches; an unknown id (or
 *    INVALID_BATCH) counts as a violation instead of crashing.
 *  - Tasks report PENDING for the first poll(s) and then their final status,
 *    so pdx has to poll.
 *  - It records calls (count per function name) and the last strings/arrays
 *    it was given; the test reads them through the fake_te_* functions.
 *
 * Failure injection (environment, read at each call):
 *  - FAKE_TE_PROTOCOLS: comma list of protocols installTransport accepts
 *    (default "tcp,rdma"); others give NULL.
 *  - FAKE_TE_FAIL_TASKS=1: every submitted task ends FAILED.
 *  - FAKE_TE_HANG=1: submitted tasks stay PENDING while the variable is set.
 *  - FAKE_TE_FAIL_ALLOC=1: allocateBatchID returns INVALID_BATCH.
 *  - a hostname containing "fail-create": createTransferEngine returns NULL.
 *  Remote ranges outside the target's registered memory end FAILED, and a
 *  source range outside the engine's own registered memory makes
 *  submitTransfer return 3 (AddressNotRegistered), as RDMA does.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENGINES 16
#define MAX_REGIONS 64
#define MAX_NOTIFS 64
#define MAX_BATCHES 256
#define MAX_CALLS 64
#define INVALID_BATCH UINT64_MAX

/* --- the documented types (layouts as in transfer_engine_c.h) --- */
struct transfer_request {
  int opcode;
  void *source;
  int32_t target_id;
  uint64_t target_offset;
  uint64_t length;
};
struct transfer_status {
  int status;
  uint64_t transferred_bytes;
};
struct buffer_entry {
  void *addr;
  size_t length;
};
struct notify_msg {
  char *name;
  char *msg;
};
typedef struct notify_msg notify_msg_t;
typedef struct buffer_entry buffer_entry_t;

enum { ST_WAITING = 0, ST_PENDING = 1, ST_COMPLETED = 4, ST_FAILED = 6 };

struct region {
  uintptr_t addr;
  size_t len;
};

struct engine {
  int live;
  char name[128];
  char host[96];
  struct region regions[MAX_REGIONS];
  int nregions;
  char *notif_name[MAX_NOTIFS];
  char *notif_msg[MAX_NOTIFS];
  int nnotifs;
};

struct task {
  int final_status;
  int polls_left;
  int hang;
  uint64_t length;
};

struct batch {
  uint64_t magic;
  struct engine *owner;
  size_t capacity;
  size_t count;
  struct task *tasks;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct engine engines[MAX_ENGINES];
static struct batch *batches[MAX_BATCHES];
static int next_port = 20001;
static int violations;
static char last_topology[4096];
static char last_protocol[64];
static char last_location[64];
static char last_metadata[128];
static char last_server_name[128];
static size_t last_batch_register_count;
static struct {
  char name[48];
  int count;
} calls[MAX_CALLS];

static void record(const char *fn) {
  for (int i = 0; i < MAX_CALLS; i++) {
    if (calls[i].name[0] == 0) {
      snprintf(calls[i].name, sizeof calls[i].name, "%s", fn);
      calls[i].count = 1;
      return;
    }
    if (strcmp(calls[i].name, fn) == 0) {
      calls[i].count++;
      return;
    }
  }
}

static int env_on(const char *name) {
  const char *v = getenv(name);
  return v != NULL && strcmp(v, "1") == 0;
}

static struct engine *engine_of(void *e) {
  for (int i = 0; i < MAX_ENGINES; i++)
    if (&engines[i] == e && engines[i].live) return &engines[i];
  violations++;
  return NULL;
}

static struct batch *batch_of(struct engine *e, uint64_t id) {
  if (id == INVALID_BATCH || id == 0) {
    violations++;
    return NULL;
  }
  for (int i = 0; i < MAX_BATCHES; i++)
    if (batches[i] != NULL && (uint64_t)(uintptr_t)batches[i] == id && batches[i]->owner == e) return batches[i];
  violations++;
  return NULL;
}

static int inside(struct engine *e, uintptr_t addr, uint64_t len) {
  for (int i = 0; i < e->nregions; i++)
    if (addr >= e->regions[i].addr && addr + len <= e->regions[i].addr + e->regions[i].len) return 1;
  return 0;
}

static int overlaps(struct engine *e, uintptr_t addr, size_t len) {
  for (int i = 0; i < e->nregions; i++)
    if (addr < e->regions[i].addr + e->regions[i].len && e->regions[i].addr < addr + len) return 1;
  return 0;
}

static void push_notif(struct engine *t, const char *name, const char *msg) {
  if (t->nnotifs >= MAX_NOTIFS) return;
  t->notif_name[t->nnotifs] = strdup(name ? name : "");
  t->notif_msg[t->nnotifs] = strdup(msg ? msg : "");
  t->nnotifs++;
}

/* --- inspection, for the tests only --- */
int fake_te_calls(const char *fn) {
  pthread_mutex_lock(&mu);
  int n = 0;
  for (int i = 0; i < MAX_CALLS; i++)
    if (strcmp(calls[i].name, fn) == 0) n = calls[i].count;
  pthread_mutex_unlock(&mu);
  return n;
}
int fake_te_violations(void) { return violations; }
int fake_te_live_batches(void) {
  int n = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_BATCHES; i++) n += batches[i] != NULL;
  pthread_mutex_unlock(&mu);
  return n;
}
int fake_te_live_engines(void) {
  int n = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_ENGINES; i++) n += engines[i].live;
  pthread_mutex_unlock(&mu);
  return n;
}
const char *fake_te_last_topology(void) { return last_topology; }
const char *fake_te_last_protocol(void) { return last_protocol; }
const char *fake_te_last_location(void) { return last_location; }
const char *fake_te_last_metadata(void) { return last_metadata; }
const char *fake_te_last_server_name(void) { return last_server_name; }
size_t fake_te_last_batch_register_count(void) { return last_batch_register_count; }

/* --- the C API --- */
void *createTransferEngine(const char *metadata_conn_string, const char *local_server_name,
                           const char *ip_or_host_name, uint64_t rpc_port, int auto_discover) {
  (void)rpc_port;
  (void)auto_discover;
  pthread_mutex_lock(&mu);
  record("createTransferEngine");
  snprintf(last_metadata, sizeof last_metadata, "%s", metadata_conn_string ? metadata_conn_string : "(null)");
  snprintf(last_server_name, sizeof last_server_name, "%s", local_server_name ? local_server_name : "(null)");
  struct engine *e = NULL;
  if (local_server_name != NULL && ip_or_host_name != NULL && strstr(local_server_name, "fail-create") == NULL) {
    for (int i = 0; i < MAX_ENGINES && e == NULL; i++)
      if (!engines[i].live) e = &engines[i];
  }
  if (e != NULL) {
    memset(e, 0, sizeof *e);
    e->live = 1;
    snprintf(e->host, sizeof e->host, "%s", ip_or_host_name);
    snprintf(e->name, sizeof e->name, "%s:%d", ip_or_host_name, next_port++);
  }
  pthread_mutex_unlock(&mu);
  return e;
}

void destroyTransferEngine(void *engine) {
  pthread_mutex_lock(&mu);
  record("destroyTransferEngine");
  struct engine *e = engine_of(engine);
  if (e != NULL) {
    for (int i = 0; i < e->nnotifs; i++) {
      free(e->notif_name[i]);
      free(e->notif_msg[i]);
    }
    for (int i = 0; i < MAX_BATCHES; i++)
      if (batches[i] != NULL && batches[i]->owner == e) {
        free(batches[i]->tasks);
        free(batches[i]);
        batches[i] = NULL;
      }
    e->live = 0;
  }
  pthread_mutex_unlock(&mu);
}

int getLocalIpAndPort(void *engine, char *buf_out, size_t buf_len) {
  pthread_mutex_lock(&mu);
  record("getLocalIpAndPort");
  struct engine *e = engine_of(engine);
  if (e != NULL) snprintf(buf_out, buf_len, "%s", e->name);
  pthread_mutex_unlock(&mu);
  return e ? 0 : -1;
}

void *installTransport(void *engine, const char *proto, void **args) {
  pthread_mutex_lock(&mu);
  record("installTransport");
  struct engine *e = engine_of(engine);
  snprintf(last_protocol, sizeof last_protocol, "%s", proto ? proto : "(null)");
  snprintf(last_topology, sizeof last_topology, "%s", args != NULL && args[0] != NULL ? (const char *)args[0] : "");
  const char *allowed = getenv("FAKE_TE_PROTOCOLS");
  if (allowed == NULL) allowed = "tcp,rdma";
  void *result = NULL;
  if (e != NULL && proto != NULL) {
    char list[256];
    snprintf(list, sizeof list, "%s", allowed);
    char *save = NULL;
    for (char *p = strtok_r(list, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save))
      if (strcmp(p, proto) == 0) result = e;
  }
  pthread_mutex_unlock(&mu);
  return result;
}

int uninstallTransport(void *engine, const char *proto) {
  (void)engine;
  (void)proto;
  pthread_mutex_lock(&mu);
  record("uninstallTransport");
  pthread_mutex_unlock(&mu);
  return 0;
}

int discoverTopology(void *engine) {
  pthread_mutex_lock(&mu);
  record("discoverTopology");
  int ok = engine_of(engine) != NULL;
  pthread_mutex_unlock(&mu);
  return ok ? 0 : -1;
}

static int32_t open_segment(void *engine, const char *name, const char *fn) {
  pthread_mutex_lock(&mu);
  record(fn);
  int32_t id = -1; /* ERR_INVALID_ARGUMENT, as Mooncake's C layer returns */
  if (engine_of(engine) != NULL && name != NULL)
    for (int i = 0; i < MAX_ENGINES; i++)
      if (engines[i].live && strcmp(engines[i].name, name) == 0) id = i + 1;
  pthread_mutex_unlock(&mu);
  return id;
}

int32_t openSegment(void *engine, const char *segment_name) { return open_segment(engine, segment_name, "openSegment"); }
int32_t openSegmentNoCache(void *engine, const char *segment_name) {
  return open_segment(engine, segment_name, "openSegmentNoCache");
}

int closeSegment(void *engine, int32_t segment_id) {
  (void)engine;
  (void)segment_id;
  pthread_mutex_lock(&mu);
  record("closeSegment");
  pthread_mutex_unlock(&mu);
  return 0;
}

static int register_one(struct engine *e, void *addr, size_t length) {
  if (length == 0 || addr == NULL) return -1;              /* ERR_INVALID_ARGUMENT */
  if (overlaps(e, (uintptr_t)addr, length)) return -7;     /* ERR_ADDRESS_OVERLAPPED */
  if (e->nregions >= MAX_REGIONS) return -302;             /* ERR_MEMORY */
  e->regions[e->nregions].addr = (uintptr_t)addr;
  e->regions[e->nregions].len = length;
  e->nregions++;
  return 0;
}

static int unregister_one(struct engine *e, void *addr) {
  for (int i = 0; i < e->nregions; i++)
    if (e->regions[i].addr == (uintptr_t)addr) {
      e->regions[i] = e->regions[--e->nregions];
      return 0;
    }
  return -3; /* ERR_ADDRESS_NOT_REGISTERED */
}

int registerLocalMemory(void *engine, void *addr, size_t length, const char *location, int remote_accessible) {
  (void)remote_accessible;
  pthread_mutex_lock(&mu);
  record("registerLocalMemory");
  snprintf(last_location, sizeof last_location, "%s", location ? location : "(null)");
  struct engine *e = engine_of(engine);
  int rc = e == NULL || location == NULL ? -1 : register_one(e, addr, length);
  pthread_mutex_unlock(&mu);
  return rc;
}

int unregisterLocalMemory(void *engine, void *addr) {
  pthread_mutex_lock(&mu);
  record("unregisterLocalMemory");
  struct engine *e = engine_of(engine);
  int rc = e == NULL ? -1 : unregister_one(e, addr);
  pthread_mutex_unlock(&mu);
  return rc;
}

int registerLocalMemoryBatch(void *engine, buffer_entry_t *buffer_list, size_t buffer_len, const char *location) {
  pthread_mutex_lock(&mu);
  record("registerLocalMemoryBatch");
  last_batch_register_count = buffer_len;
  snprintf(last_location, sizeof last_location, "%s", location ? location : "(null)");
  struct engine *e = engine_of(engine);
  int rc = e == NULL || location == NULL ? -1 : 0;
  size_t done = 0;
  for (; rc == 0 && done < buffer_len; done++) rc = register_one(e, buffer_list[done].addr, buffer_list[done].length);
  if (rc != 0 && e != NULL) /* all or none */
    for (size_t i = 0; i + 1 < done; i++) unregister_one(e, buffer_list[i].addr);
  pthread_mutex_unlock(&mu);
  return rc;
}

int unregisterLocalMemoryBatch(void *engine, void **addr_list, size_t addr_len) {
  pthread_mutex_lock(&mu);
  record("unregisterLocalMemoryBatch");
  struct engine *e = engine_of(engine);
  int rc = e == NULL ? -1 : 0;
  for (size_t i = 0; e != NULL && i < addr_len; i++) {
    int r = unregister_one(e, addr_list[i]);
    if (r != 0 && rc == 0) rc = r;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

uint64_t allocateBatchID(void *engine, size_t batch_size) {
  pthread_mutex_lock(&mu);
  record("allocateBatchID");
  struct engine *e = engine_of(engine);
  uint64_t id = INVALID_BATCH;
  if (e != NULL && batch_size > 0 && !env_on("FAKE_TE_FAIL_ALLOC")) {
    for (int i = 0; i < MAX_BATCHES; i++)
      if (batches[i] == NULL) {
        struct batch *b = calloc(1, sizeof *b);
        b->magic = 0xba7c4;
        b->owner = e;
        b->capacity = batch_size;
        b->tasks = calloc(batch_size, sizeof *b->tasks);
        batches[i] = b;
        id = (uint64_t)(uintptr_t)b;
        break;
      }
  }
  pthread_mutex_unlock(&mu);
  return id;
}

static int submit(void *engine, uint64_t batch_id, struct transfer_request *entries, size_t count,
                  const notify_msg_t *notify) {
  struct engine *e = engine_of(engine);
  struct batch *b = e ? batch_of(e, batch_id) : NULL;
  if (b == NULL || entries == NULL) return 1;    /* InvalidArgument */
  if (b->count + count > b->capacity) return 2;  /* TooManyRequests */
  for (size_t i = 0; i < count; i++)
    if (!inside(e, (uintptr_t)entries[i].source, entries[i].length)) return 3; /* AddressNotRegistered */
  int fail_all = env_on("FAKE_TE_FAIL_TASKS"), hang = env_on("FAKE_TE_HANG"), all_ok = 1;
  struct engine *target = NULL;
  for (size_t i = 0; i < count; i++) {
    struct transfer_request *r = &entries[i];
    struct task *t = &b->tasks[b->count + i];
    int32_t seg = r->target_id;
    target = seg >= 1 && seg <= MAX_ENGINES && engines[seg - 1].live ? &engines[seg - 1] : NULL;
    t->length = r->length;
    t->polls_left = 1;
    t->hang = hang;
    if (target == NULL || fail_all || !inside(target, (uintptr_t)r->target_offset, r->length) ||
        (r->opcode != 0 && r->opcode != 1)) {
      t->final_status = ST_FAILED;
      all_ok = 0;
      continue;
    }
    void *remote = (void *)(uintptr_t)r->target_offset;
    if (r->opcode == 1)
      memmove(remote, r->source, r->length);
    else
      memmove(r->source, remote, r->length);
    t->final_status = ST_COMPLETED;
  }
  b->count += count;
  if (notify != NULL && all_ok && target != NULL) push_notif(target, notify->name, notify->msg);
  return 0;
}

int submitTransfer(void *engine, uint64_t batch_id, struct transfer_request *entries, size_t count) {
  pthread_mutex_lock(&mu);
  record("submitTransfer");
  int rc = submit(engine, batch_id, entries, count, NULL);
  pthread_mutex_unlock(&mu);
  return rc;
}

#ifndef FAKE_TE_OMIT_NOTIFY /* the "partial" variant lacks this symbol */
int submitTransferWithNotify(void *engine, uint64_t batch_id, struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg) {
  pthread_mutex_lock(&mu);
  record("submitTransferWithNotify");
  int rc = submit(engine, batch_id, entries, count, &notify_msg);
  pthread_mutex_unlock(&mu);
  return rc;
}
#endif

int getTransferStatus(void *engine, uint64_t batch_id, size_t task_id, struct transfer_status *status) {
  pthread_mutex_lock(&mu);
  record("getTransferStatus");
  struct engine *e = engine_of(engine);
  struct batch *b = e ? batch_of(e, batch_id) : NULL;
  int rc = 0;
  if (b == NULL || status == NULL || task_id >= b->count) {
    rc = 1; /* InvalidArgument */
  } else {
    struct task *t = &b->tasks[task_id];
    if (t->hang && !env_on("FAKE_TE_HANG")) t->hang = 0;
    if (t->hang || t->polls_left > 0) {
      if (t->polls_left > 0) t->polls_left--;
      status->status = ST_PENDING;
      status->transferred_bytes = 0;
    } else {
      status->status = t->final_status;
      status->transferred_bytes = t->final_status == ST_COMPLETED ? t->length : 0;
    }
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

int freeBatchID(void *engine, uint64_t batch_id) {
  pthread_mutex_lock(&mu);
  record("freeBatchID");
  struct engine *e = engine_of(engine);
  struct batch *b = e ? batch_of(e, batch_id) : NULL;
  int rc = 0;
  if (b == NULL) {
    rc = 1;
  } else {
    for (size_t i = 0; i < b->count; i++)
      if (b->tasks[i].hang && env_on("FAKE_TE_HANG")) rc = 4; /* BatchBusy */
    if (rc == 0) {
      for (int i = 0; i < MAX_BATCHES; i++)
        if (batches[i] == b) batches[i] = NULL;
      free(b->tasks);
      free(b);
    }
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

notify_msg_t *getNotifsFromEngine(void *engine, int *size) {
  pthread_mutex_lock(&mu);
  record("getNotifsFromEngine");
  struct engine *e = engine_of(engine);
  notify_msg_t *out = NULL;
  *size = 0;
  if (e != NULL && e->nnotifs > 0) {
    out = malloc(sizeof *out * (size_t)e->nnotifs);
    for (int i = 0; i < e->nnotifs; i++) {
      out[i].name = e->notif_name[i];
      out[i].msg = e->notif_msg[i];
    }
    *size = e->nnotifs;
    e->nnotifs = 0;
  }
  pthread_mutex_unlock(&mu);
  return out;
}

int freeNotifsMsgBuf(notify_msg_t *msg, int size) {
  pthread_mutex_lock(&mu);
  record("freeNotifsMsgBuf");
  pthread_mutex_unlock(&mu);
  for (int i = 0; i < size; i++) {
    free(msg[i].name);
    free(msg[i].msg);
  }
  free(msg);
  return 0;
}

int genNotifyInEngine(void *engine, uint64_t target_id, notify_msg_t notify_msg) {
  pthread_mutex_lock(&mu);
  record("genNotifyInEngine");
  int rc = -200; /* ERR_METADATA: unknown segment */
  if (engine_of(engine) != NULL && target_id >= 1 && target_id <= MAX_ENGINES && engines[target_id - 1].live) {
    push_notif(&engines[target_id - 1], notify_msg.name, notify_msg.msg);
    rc = 0;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}
