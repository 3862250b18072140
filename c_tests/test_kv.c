/* The KV API through the C ABI: page plans against a reference planner
 * written from SGLang's rule (random fragmented and contiguous page maps,
 * every byte verified at the target), heterogeneous-TP head slices verified
 * head by head, every bad input, layer-wise submits whose notification
 * arrives only after every layer landed, and the same on the Mooncake
 * backend against its test double. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#ifndef FAKE_TE_LIB
#error "CMake passes FAKE_TE_LIB, the path of the Mooncake test double"
#endif

#define WAIT_MS 30000u
#define MAX_BUFFERS 16

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}
static size_t below(size_t n) { return n == 0 ? 0 : (size_t)(rng() % n); }
static uint64_t addr_of(const void *p) { return (uint64_t)(uintptr_t)p; }

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* One side: a registered pool holding `n` buffers of `pages` pages each. */
typedef struct {
  unsigned char *pool;
  size_t bytes;
  pdx_kv_buffer buf[MAX_BUFFERS];
} side;

static void side_init(side *s, size_t n, const uint64_t *page_bytes, uint64_t pages) {
  s->bytes = 0;
  for (size_t i = 0; i < n; i++) s->bytes += (size_t)(page_bytes[i] * pages);
  s->pool = malloc(s->bytes);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    s->buf[i].base = addr_of(s->pool + at);
    s->buf[i].page_bytes = page_bytes[i];
    s->buf[i].pages = pages;
    at += (size_t)(page_bytes[i] * pages);
  }
}

static void fill(side *s, unsigned char salt) {
  for (size_t i = 0; i < s->bytes; i++) s->pool[i] = (unsigned char)(rng() >> 29) ^ salt;
}

/* A random page map of `n` pairs from a pool of `pool` pages: distinct
 * destination pages; fragmented (shuffled) or contiguous with a few breaks. */
static void random_map(int32_t *src, int32_t *dst, size_t n, size_t pool, int contiguous) {
  int32_t *a = malloc(pool * sizeof *a), *b = malloc(pool * sizeof *b);
  for (size_t i = 0; i < pool; i++) a[i] = b[i] = (int32_t)i;
  if (!contiguous) {
    for (size_t i = pool; i > 1; i--) {
      size_t j = below(i), k = below(i);
      int32_t t = a[i - 1]; a[i - 1] = a[j]; a[j] = t;
      t = b[i - 1]; b[i - 1] = b[k]; b[k] = t;
    }
    memcpy(src, a, n * sizeof *src);
    memcpy(dst, b, n * sizeof *dst);
  } else {
    size_t s0 = below(pool - n + 1), d0 = below(pool - n + 1);
    for (size_t i = 0; i < n; i++) src[i] = (int32_t)(s0 + i), dst[i] = (int32_t)(d0 + i);
    for (size_t k = 0, breaks = below(4); n > 1 && k < breaks; k++) { /* src may repeat: fine for WRITE */
      size_t i = below(n), j = below(n);
      int32_t t = src[i]; src[i] = src[j]; src[j] = t;
    }
  }
  free(a);
  free(b);
}

/* SGLang's planner (conn.py): break where either side's step is not 1, one
 * block per run per buffer. Applies the blocks to `shadow` (a copy of the
 * remote pool) and returns how many there are. */
static size_t reference_apply(const side *l, const side *r, size_t nb, const int32_t *src, const int32_t *dst,
                              size_t n, unsigned char *shadow) {
  size_t blocks = 0;
  for (size_t b = 0; b < nb; b++) {
    size_t start = 0;
    for (size_t i = 1; i <= n; i++) {
      if (i < n && src[i] - src[i - 1] == 1 && dst[i] - dst[i - 1] == 1) continue;
      uint64_t pb = l->buf[b].page_bytes;
      const unsigned char *from = (const unsigned char *)(uintptr_t)(l->buf[b].base + (uint64_t)src[start] * pb);
      size_t to = (size_t)(r->buf[b].base - addr_of(r->pool) + (uint64_t)dst[start] * pb);
      memcpy(shadow + to, from, (size_t)((i - start) * pb));
      blocks++;
      start = i;
    }
  }
  return blocks;
}

typedef struct {
  pdx_engine *a, *b;
  char session_b[128];
} pair;

static void pair_start(pair *p, const char *protocol) {
  CHECK_OK(pdx_engine_init("127.0.0.1", protocol, NULL, &p->a));
  CHECK_OK(pdx_engine_init("127.0.0.1", protocol, NULL, &p->b));
  if (p->a == NULL || p->b == NULL) {
    fprintf(stderr, "cannot start engines: %s\n", pdx_last_error_message());
    exit(1);
  }
  snprintf(p->session_b, sizeof p->session_b, "%s", pdx_engine_session_id(p->b));
}

static void pair_stop(pair *p) {
  pdx_engine_free(p->a);
  pdx_engine_free(p->b);
}

static size_t drain_count(pdx_engine *e, const char *name, const char *msg) {
  pdx_notifications *list = NULL;
  CHECK_OK(pdx_notifications_drain(e, &list));
  size_t n = pdx_notifications_count(list), match = 0;
  for (size_t i = 0; i < n; i++) {
    const char *nm = NULL, *m = NULL;
    CHECK_OK(pdx_notification_get(list, i, &nm, &m));
    if (nm && m && strcmp(nm, name) == 0 && strcmp(m, msg) == 0) match++;
  }
  pdx_notifications_free(list);
  return match;
}

/* Random maps vs the reference: request counts and every byte. */
static void test_random_maps(pair *p, int rounds, int use_submit) {
  for (int round = 0; round < rounds; round++) {
    size_t nb = 1 + below(4), pool = 1 + below(96), n = below(pool + 1);
    uint64_t pb[MAX_BUFFERS];
    for (size_t i = 0; i < nb; i++) pb[i] = 16u * (1 + below(8));
    side l, r;
    side_init(&l, nb, pb, pool);
    side_init(&r, nb, pb, pool);
    fill(&l, 0x11);
    fill(&r, 0x77);
    CHECK_OK(pdx_register_memory(p->a, l.pool, l.bytes));
    CHECK_OK(pdx_register_memory(p->b, r.pool, r.bytes));
    int32_t *src = malloc((n + 1) * sizeof *src), *dst = malloc((n + 1) * sizeof *dst);
    random_map(src, dst, n, pool, round % 2);
    unsigned char *shadow = malloc(r.bytes);
    memcpy(shadow, r.pool, r.bytes);
    size_t want = reference_apply(&l, &r, nb, src, dst, n, shadow);

    pdx_kv_plan *plan = NULL;
    CHECK_OK(pdx_kv_plan_new(l.buf, r.buf, nb, src, dst, n, NULL, &plan));
    size_t got = 0;
    CHECK_OK(pdx_kv_plan_requests(plan, 0, nb, &got));
    CHECK(got == want);
    if (n > 0 && !use_submit) {
      CHECK_OK(pdx_kv_transfer_sync(p->a, p->session_b, plan, PDX_OPCODE_WRITE));
    } else if (n > 0) {
      uint64_t ids[MAX_BUFFERS];
      for (size_t b = 0; b < nb; b++)
        CHECK_OK(pdx_kv_submit(p->a, p->session_b, plan, b, b + 1, PDX_OPCODE_WRITE, NULL, NULL, NULL, &ids[b]));
      for (size_t b = 0; b < nb; b++) {
        int32_t state = -1;
        CHECK_OK(pdx_batch_wait(p->a, ids[b], WAIT_MS, &state));
        CHECK(state == PDX_TASK_COMPLETED);
        CHECK_OK(pdx_batch_free(p->a, ids[b]));
      }
    }
    CHECK(memcmp(r.pool, shadow, r.bytes) == 0);
    pdx_kv_plan_free(plan);
    CHECK_OK(pdx_unregister_memory(p->a, l.pool));
    CHECK_OK(pdx_unregister_memory(p->b, r.pool));
    free(src);
    free(dst);
    free(shadow);
    free(l.pool);
    free(r.pool);
  }
}

/* A READ fills local pages from remote ones, through the same plan. */
static void test_read(pair *p) {
  uint64_t pb[2] = {64, 32};
  side l, r;
  side_init(&l, 2, pb, 8);
  side_init(&r, 2, pb, 8);
  memset(l.pool, 0, l.bytes);
  fill(&r, 0x5a);
  CHECK_OK(pdx_register_memory(p->a, l.pool, l.bytes));
  CHECK_OK(pdx_register_memory(p->b, r.pool, r.bytes));
  int32_t src[3] = {7, 0, 1}, dst[3] = {2, 3, 4};
  pdx_kv_plan *plan = NULL;
  CHECK_OK(pdx_kv_plan_new(l.buf, r.buf, 2, src, dst, 3, NULL, &plan));
  CHECK_OK(pdx_kv_transfer_sync(p->a, p->session_b, plan, PDX_OPCODE_READ));
  for (size_t b = 0; b < 2; b++)
    for (size_t i = 0; i < 3; i++)
      CHECK(memcmp((void *)(uintptr_t)(l.buf[b].base + (uint64_t)src[i] * pb[b]),
                   (void *)(uintptr_t)(r.buf[b].base + (uint64_t)dst[i] * pb[b]), (size_t)pb[b]) == 0);
  pdx_kv_plan_free(plan);
  /* Repeated local pages: fine to write from, refused to read into. */
  int32_t rep_src[2] = {1, 1}, rep_dst[2] = {0, 5};
  CHECK_OK(pdx_kv_plan_new(l.buf, r.buf, 2, rep_src, rep_dst, 2, NULL, &plan));
  CHECK_OK(pdx_kv_transfer_sync(p->a, p->session_b, plan, PDX_OPCODE_WRITE));
  CHECK_STATUS(pdx_kv_transfer_sync(p->a, p->session_b, plan, PDX_OPCODE_READ), PDX_ERR_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("a READ would write local page 1 twice (src_pages[0] and src_pages[1])");
  uint64_t id = 7;
  CHECK_STATUS(pdx_kv_submit(p->a, p->session_b, plan, 0, 1, PDX_OPCODE_READ, NULL, NULL, NULL, &id),
               PDX_ERR_INVALID_ARGUMENT);
  CHECK(id == 7);
  pdx_kv_plan_free(plan);
  CHECK_OK(pdx_unregister_memory(p->a, l.pool));
  CHECK_OK(pdx_unregister_memory(p->b, r.pool));
  free(l.pool);
  free(r.pool);
}

/* Heterogeneous TP: a head slice per token, verified head by head. */
static void test_heads(pair *p) {
  /* local heads, remote heads, local first, remote first, count */
  const uint32_t shapes[][5] = {{8, 2, 2, 0, 2}, {8, 2, 6, 0, 2}, {2, 8, 0, 4, 2}, {2, 8, 0, 6, 2},
                                {4, 4, 0, 0, 4}, {8, 8, 1, 3, 4}};
  const uint32_t tpps[] = {1, 4, 16};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    for (size_t t = 0; t < sizeof tpps / sizeof tpps[0]; t++) {
      pdx_kv_heads h = {tpps[t], shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4], 8};
      uint64_t pool = 24, nb = 2;
      uint64_t lpb[2], rpb[2];
      lpb[0] = lpb[1] = (uint64_t)h.tokens_per_page * h.local_heads * h.head_bytes;
      rpb[0] = rpb[1] = (uint64_t)h.tokens_per_page * h.remote_heads * h.head_bytes;
      side l, r;
      side_init(&l, nb, lpb, pool);
      side_init(&r, nb, rpb, pool);
      fill(&l, 0x21);
      fill(&r, 0x43);
      unsigned char *before = malloc(r.bytes);
      memcpy(before, r.pool, r.bytes);
      CHECK_OK(pdx_register_memory(p->a, l.pool, l.bytes));
      CHECK_OK(pdx_register_memory(p->b, r.pool, r.bytes));
      size_t n = 1 + below(pool);
      int32_t src[24], dst[24];
      random_map(src, dst, n, pool, (int)(s + t) % 2);
      pdx_kv_plan *plan = NULL;
      CHECK_OK(pdx_kv_plan_new(l.buf, r.buf, nb, src, dst, n, &h, &plan));
      size_t got = 0, whole = 0;
      CHECK_OK(pdx_kv_plan_requests(plan, 0, nb, &got));
      if (h.count == h.local_heads && h.count == h.remote_heads) {
        pdx_kv_plan *pages_plan = NULL;
        CHECK_OK(pdx_kv_plan_new(l.buf, r.buf, nb, src, dst, n, NULL, &pages_plan));
        CHECK_OK(pdx_kv_plan_requests(pages_plan, 0, nb, &whole));
        CHECK(got == whole); /* whole tokens: no more requests than without heads */
        pdx_kv_plan_free(pages_plan);
      } else {
        CHECK(got == nb * n * h.tokens_per_page); /* one piece per token slot */
      }
      CHECK_OK(pdx_kv_transfer_sync(p->a, p->session_b, plan, PDX_OPCODE_WRITE));
      /* Head by head: sent heads equal their source, all others unchanged. */
      size_t bad = 0;
      for (size_t b = 0; b < nb; b++) {
        for (size_t i = 0; i < n; i++) {
          for (uint32_t tok = 0; tok < h.tokens_per_page; tok++) {
            for (uint32_t hd = 0; hd < h.remote_heads; hd++) {
              uint64_t roff = r.buf[b].base - addr_of(r.pool) + (uint64_t)dst[i] * rpb[b] +
                              ((uint64_t)tok * h.remote_heads + hd) * h.head_bytes;
              const unsigned char *want = before + roff;
              if (hd >= h.remote_first && hd < h.remote_first + h.count) {
                uint32_t lh = h.local_first + (hd - h.remote_first);
                want = (const unsigned char *)(uintptr_t)(l.buf[b].base + (uint64_t)src[i] * lpb[b] +
                                                          ((uint64_t)tok * h.local_heads + lh) * h.head_bytes);
              }
              if (memcmp(r.pool + roff, want, (size_t)h.head_bytes) != 0) bad++;
            }
          }
        }
      }
      CHECK(bad == 0);
      /* Pages not in the map are untouched: count bytes that changed. */
      size_t changed = 0;
      for (size_t i = 0; i < r.bytes; i++) changed += r.pool[i] != before[i];
      CHECK(changed <= nb * n * h.tokens_per_page * h.count * h.head_bytes);
      pdx_kv_plan_free(plan);
      CHECK_OK(pdx_unregister_memory(p->a, l.pool));
      CHECK_OK(pdx_unregister_memory(p->b, r.pool));
      free(before);
      free(l.pool);
      free(r.pool);
    }
  }
}

#define SENTINEL ((pdx_kv_plan *)(uintptr_t)0x5e57)

/* A failing plan_new: status, exact message, *out untouched. */
#define PLAN_FAILS(l, r, nb, s, d, n, h, status, text)                          \
  do {                                                                           \
    pdx_kv_plan *out_ = SENTINEL;                                                \
    CHECK_STATUS(pdx_kv_plan_new(l, r, nb, s, d, n, h, &out_), status);          \
    CHECK(out_ == SENTINEL);                                                     \
    CHECK_LAST_ERROR(text);                                                      \
  } while (0)

static void test_bad_inputs(pair *p) {
  static unsigned char lmem[4096], rmem[4096];
  pdx_kv_buffer l[2] = {{addr_of(lmem), 256, 8}, {addr_of(lmem + 2048), 256, 8}};
  pdx_kv_buffer r[2] = {{addr_of(rmem), 256, 8}, {addr_of(rmem + 2048), 256, 8}};
  int32_t s[3] = {0, 1, 2}, d[3] = {4, 5, 6};
  pdx_kv_plan *out = SENTINEL;
  CHECK_STATUS(pdx_kv_plan_new(l, r, 2, s, d, 3, NULL, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_LAST_ERROR("out is NULL");
  PLAN_FAILS(NULL, r, 2, s, d, 3, NULL, PDX_ERR_NULL_ARGUMENT, "local is NULL but its length is 2");
  PLAN_FAILS(l, NULL, 2, s, d, 3, NULL, PDX_ERR_NULL_ARGUMENT, "remote is NULL but its length is 2");
  PLAN_FAILS(l, r, 2, NULL, d, 3, NULL, PDX_ERR_NULL_ARGUMENT, "src_pages is NULL but its length is 3");
  PLAN_FAILS(l, r, 2, s, NULL, 3, NULL, PDX_ERR_NULL_ARGUMENT, "dst_pages is NULL but its length is 3");
  PLAN_FAILS(l, r, 0, s, d, 3, NULL, PDX_ERR_INVALID_ARGUMENT, "buffers is 0: a plan needs at least one buffer");
  PLAN_FAILS(l, r, SIZE_MAX / 64, s, d, 3, NULL, PDX_ERR_INVALID_ARGUMENT,
             "buffers is 288230376151711743, over the limit of 65536");
  PLAN_FAILS(l, r, 2, s, d, (size_t)1 << 40, NULL, PDX_ERR_INVALID_ARGUMENT,
             "pages is 1099511627776, over the limit of 67108864");
  int32_t neg[3] = {0, -3, 2}, big[3] = {0, 1, 8}, rep[3] = {4, 5, 4};
  PLAN_FAILS(l, r, 2, neg, d, 3, NULL, PDX_ERR_INVALID_ARGUMENT, "src_pages[1] is -3, below 0");
  PLAN_FAILS(l, r, 2, s, big, 3, NULL, PDX_ERR_INVALID_ARGUMENT, "dst_pages[2] is 8, not below remote[0].pages 8");
  PLAN_FAILS(l, r, 2, s, rep, 3, NULL, PDX_ERR_INVALID_ARGUMENT,
             "dst_pages[2] is 4, as is dst_pages[0]: two writes to one page");
  pdx_kv_buffer z[2] = {l[0], {addr_of(lmem + 2048), 0, 8}};
  PLAN_FAILS(z, r, 2, s, d, 3, NULL, PDX_ERR_INVALID_ARGUMENT, "local[1].page_bytes is 0");
  pdx_kv_buffer nb0[2] = {r[0], {0, 256, 8}};
  PLAN_FAILS(l, nb0, 2, s, d, 3, NULL, PDX_ERR_INVALID_ARGUMENT, "remote[1].base is 0");
  pdx_kv_buffer wrap[2] = {{UINT64_MAX - 1000, 256, 8}, l[1]};
  PLAN_FAILS(wrap, r, 2, s, d, 3, NULL, PDX_ERR_INVALID_ARGUMENT,
             "local[0]: base 0xfffffffffffffc17 + pages 8 x page_bytes 256 overflows 64 bits");
  pdx_kv_buffer odd[2] = {r[0], {addr_of(rmem + 2048), 128, 8}};
  PLAN_FAILS(l, odd, 2, s, d, 3, NULL, PDX_ERR_INVALID_ARGUMENT,
             "local[1].page_bytes 256 differs from remote[1].page_bytes 128: whole pages need equal sizes (pass "
             "heads for a head slice)");
  /* Head slices: 4 tokens x 8 heads x 8 bytes = 256 here, 4 x 2 x 8 = 64 there. */
  pdx_kv_buffer r2[2] = {{addr_of(rmem), 64, 8}, {addr_of(rmem + 2048), 64, 8}};
  pdx_kv_heads h = {4, 8, 2, 6, 0, 2, 8};
  CHECK_OK(pdx_kv_plan_new(l, r2, 2, s, d, 3, &h, &out));
  pdx_kv_plan_free(out);
  pdx_kv_heads hb = h;
  hb.local_first = 7;
  PLAN_FAILS(l, r2, 2, s, d, 3, &hb, PDX_ERR_INVALID_ARGUMENT,
             "heads.local_first 7 + heads.count 2 = 9 is above heads.local_heads 8: the slice leaves the token");
  hb = h;
  hb.remote_first = 1;
  PLAN_FAILS(l, r2, 2, s, d, 3, &hb, PDX_ERR_INVALID_ARGUMENT,
             "heads.remote_first 1 + heads.count 2 = 3 is above heads.remote_heads 2: the slice leaves the token");
  hb = h;
  hb.tokens_per_page = 0;
  PLAN_FAILS(l, r2, 2, s, d, 3, &hb, PDX_ERR_INVALID_ARGUMENT, "heads.tokens_per_page is 0");
  hb = h;
  hb.head_bytes = 16;
  PLAN_FAILS(l, r2, 2, s, d, 3, &hb, PDX_ERR_INVALID_ARGUMENT,
             "local[0].page_bytes is 256 but heads.tokens_per_page 4 x heads.local_heads 8 x heads.head_bytes 16 = 512");

  /* A good plan for the range, opcode, handle and engine checks. */
  pdx_kv_plan *plan = NULL;
  CHECK_OK(pdx_kv_plan_new(l, r, 2, s, d, 3, NULL, &plan));
  size_t reqs = 99;
  CHECK_STATUS(pdx_kv_plan_requests(plan, 1, 1, &reqs), PDX_ERR_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("first_buffer 1 is not below end_buffer 1");
  CHECK_STATUS(pdx_kv_plan_requests(plan, 0, 3, &reqs), PDX_ERR_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("end_buffer 3 is past the plan's 2 buffers");
  CHECK_STATUS(pdx_kv_plan_requests(plan, 0, 2, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK(reqs == 99);
  CHECK_OK(pdx_kv_plan_requests(plan, 0, 2, &reqs));
  CHECK(reqs == 2);

  uint64_t id = 42;
  const char *sb = p->session_b;
  CHECK_STATUS(pdx_kv_submit(p->a, sb, plan, 0, 2, 2, NULL, NULL, NULL, &id), PDX_ERR_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("opcode 2 is neither PDX_OPCODE_READ (0) nor PDX_OPCODE_WRITE (1)");
  CHECK_STATUS(pdx_kv_transfer_sync(p->a, sb, plan, -1), PDX_ERR_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("opcode -1 is neither PDX_OPCODE_READ (0) nor PDX_OPCODE_WRITE (1)");
  CHECK_STATUS(pdx_kv_submit(p->a, sb, plan, 2, 2, PDX_OPCODE_WRITE, NULL, NULL, NULL, &id),
               PDX_ERR_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("first_buffer 2 is not below end_buffer 2");
  CHECK_STATUS(pdx_kv_submit(p->a, sb, plan, 1, 5, PDX_OPCODE_WRITE, NULL, NULL, NULL, &id),
               PDX_ERR_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("end_buffer 5 is past the plan's 2 buffers");
  CHECK_STATUS(pdx_kv_submit(p->a, sb, plan, 0, 2, PDX_OPCODE_WRITE, NULL, "only-name", NULL, &id),
               PDX_ERR_INVALID_ARGUMENT);
  CHECK_LAST_ERROR("notify_name and notify_msg must both be NULL or both be set");
  /* An event needs a CUDA driver in the process (none is loaded here); the
   * ordering itself is tested in test_cuda, against the driver stand-in. */
  int event = 0;
  CHECK_STATUS(pdx_kv_submit(p->a, sb, plan, 0, 2, PDX_OPCODE_WRITE, &event, NULL, NULL, &id),
               PDX_ERR_DEVICE_UNAVAILABLE);
  CHECK(strstr(pdx_last_error_message(), "no CUDA driver is loaded") != NULL);
  CHECK_STATUS(pdx_kv_submit(p->a, NULL, plan, 0, 2, PDX_OPCODE_WRITE, NULL, NULL, NULL, &id),
               PDX_ERR_NULL_ARGUMENT);
  CHECK_LAST_ERROR("session is NULL");
  CHECK_STATUS(pdx_kv_submit(p->a, sb, plan, 0, 2, PDX_OPCODE_WRITE, NULL, NULL, NULL, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_LAST_ERROR("out_batch is NULL");
  CHECK_STATUS(pdx_kv_submit(NULL, sb, plan, 0, 2, PDX_OPCODE_WRITE, NULL, NULL, NULL, &id), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_kv_submit(p->a, sb, NULL, 0, 2, PDX_OPCODE_WRITE, NULL, NULL, NULL, &id), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_kv_transfer_sync(p->a, sb, NULL, PDX_OPCODE_WRITE), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_kv_plan_requests(NULL, 0, 1, &reqs), PDX_ERR_NULL_ARGUMENT);
  CHECK(id == 42);
  /* Memory the peer has not registered: the peer refuses every request. */
  CHECK_STATUS(pdx_kv_transfer_sync(p->a, sb, plan, PDX_OPCODE_WRITE), PDX_ERR_REMOTE_REJECTED);
  CHECK_OK(pdx_kv_submit(p->a, sb, plan, 0, 2, PDX_OPCODE_WRITE, NULL, NULL, NULL, &id));
  int32_t state = -1;
  CHECK_OK(pdx_batch_wait(p->a, id, WAIT_MS, &state));
  CHECK(state == PDX_TASK_FAILED);
  CHECK_OK(pdx_batch_free(p->a, id));
  id = 42;

  /* Freed, twice-freed and made-up plans are errors, never crashes. */
  pdx_kv_plan_free(NULL);
  pdx_kv_plan_free(plan);
  CHECK_STATUS(pdx_kv_plan_requests(plan, 0, 1, &reqs), PDX_ERR_INVALID_HANDLE);
  CHECK(strstr(pdx_last_error_message(), "pdx_kv_plan handle") != NULL);
  CHECK_STATUS(pdx_kv_submit(p->a, sb, plan, 0, 1, PDX_OPCODE_WRITE, NULL, NULL, NULL, &id), PDX_ERR_INVALID_HANDLE);
  CHECK_STATUS(pdx_kv_transfer_sync(p->a, sb, plan, PDX_OPCODE_WRITE), PDX_ERR_INVALID_HANDLE);
  pdx_kv_plan_free(plan); /* twice: recorded, no crash */
  CHECK(strstr(pdx_last_error_message(), "is not live") != NULL);
  pdx_kv_plan_free((pdx_kv_plan *)(uintptr_t)0xdeadbeef);
  CHECK_STATUS(pdx_kv_plan_requests((pdx_kv_plan *)(uintptr_t)0x1234, 0, 1, &reqs), PDX_ERR_INVALID_HANDLE);
  CHECK(id == 42 && reqs == 2);

  /* Notification outcomes: unknown batch. */
  pdx_status st = 1;
  CHECK_STATUS(pdx_kv_notify_wait(p->a, 0x1234, 0, &st), PDX_ERR_NOT_FOUND);
  CHECK(st == 1);
}

/* Layer-wise: layer 0 is large and slow, the last layer tiny and carrying
 * the notification; when the notification arrives every layer has landed. */
static void test_layerwise(pair *p, int hang_double) {
  enum { LAYERS = 6 };
  uint64_t pb[2 * LAYERS];
  uint64_t pages = 32;
  for (size_t i = 0; i < 2 * LAYERS; i++) pb[i] = i < 2 && !hang_double ? (1u << 20) : 512; /* 2 x 32 MiB first */
  side l, r;
  side_init(&l, 2 * LAYERS, pb, pages);
  side_init(&r, 2 * LAYERS, pb, pages);
  fill(&l, 0x3c);
  memset(r.pool, 0, r.bytes);
  CHECK_OK(pdx_register_memory(p->a, l.pool, l.bytes));
  CHECK_OK(pdx_register_memory(p->b, r.pool, r.bytes));
  int32_t src[32], dst[32];
  for (int i = 0; i < 32; i++) src[i] = i, dst[i] = 31 - i; /* 32 runs of one page */
  pdx_kv_plan *plan = NULL;
  CHECK_OK(pdx_kv_plan_new(l.buf, r.buf, 2 * LAYERS, src, dst, 32, NULL, &plan));
  unsigned char *want = malloc(r.bytes);
  memset(want, 0, r.bytes);
  reference_apply(&l, &r, 2 * LAYERS, src, dst, 32, want);
  CHECK(drain_count(p->b, "kv_done", "room-7") == 0);

  if (hang_double) setenv("FAKE_TE_HANG", "1", 1);
  uint64_t ids[LAYERS];
  for (size_t layer = 0; layer < LAYERS; layer++) {
    int last = layer == LAYERS - 1;
    CHECK_OK(pdx_kv_submit(p->a, p->session_b, plan, 2 * layer, 2 * layer + 2, PDX_OPCODE_WRITE, NULL,
                           last ? "kv_done" : NULL, last ? "room-7" : NULL, &ids[layer]));
  }
  if (hang_double) {
    /* The double copies at submit but reports every task PENDING while
     * FAKE_TE_HANG is set: nothing has landed, so nothing is notified. */
    sleep_ms(300);
    pdx_status st = 1;
    CHECK_STATUS(pdx_kv_notify_wait(p->a, ids[LAYERS - 1], 0, &st), PDX_ERR_TIMEOUT);
    CHECK(drain_count(p->b, "kv_done", "room-7") == 0);
    unsetenv("FAKE_TE_HANG");
  }
  /* Poll for the notification; when it is there, every byte is too. */
  size_t seen = 0;
  for (int i = 0; i < 30000 && seen == 0; i++) {
    seen = drain_count(p->b, "kv_done", "room-7");
    if (seen == 0) sleep_ms(1);
  }
  CHECK(seen == 1);
  CHECK(memcmp(r.pool, want, r.bytes) == 0);
  pdx_status st = 1;
  CHECK_OK(pdx_kv_notify_wait(p->a, ids[LAYERS - 1], WAIT_MS, &st));
  CHECK(st == PDX_OK);
  for (size_t layer = 0; layer < LAYERS; layer++) {
    int32_t state = -1;
    CHECK_OK(pdx_batch_wait(p->a, ids[layer], WAIT_MS, &state));
    CHECK(state == PDX_TASK_COMPLETED);
    CHECK_OK(pdx_batch_free(p->a, ids[layer]));
  }
  sleep_ms(50);
  CHECK(drain_count(p->b, "kv_done", "room-7") == 0); /* exactly once */

  /* A second request through the same plan: its notification waits for its
   * own layers; a submit without a notification delivers none. */
  uint64_t id2;
  CHECK_OK(pdx_kv_submit(p->a, p->session_b, plan, 0, 2 * LAYERS, PDX_OPCODE_WRITE, NULL, NULL, NULL, &id2));
  CHECK_OK(pdx_batch_wait(p->a, id2, WAIT_MS, NULL));
  CHECK_OK(pdx_batch_free(p->a, id2));
  CHECK(drain_count(p->b, "kv_done", "room-7") == 0);

  /* A notification as bytes (msgpack with a NUL and bytes that are not
   * UTF-8) arrives whole after its layers. */
  static const unsigned char packed[] = {0x82, 0xa4, 'r', 'o', 'o', 'm', 0x00, 0xa1, 0x8b, 0xff};
  pdx_notify_bytes note = {(const uint8_t *)"kv_done", 7, packed, sizeof packed};
  uint64_t id3 = 7;
  if (hang_double) {
    /* Mooncake's C API takes C strings: a NUL is refused before anything starts. */
    CHECK_STATUS(pdx_kv_submit_notify_bytes(p->a, p->session_b, plan, 0, 2 * LAYERS, PDX_OPCODE_WRITE, NULL, &note,
                                            &id3),
                 PDX_ERR_INVALID_ARGUMENT);
    CHECK(strstr(pdx_last_error_message(), "NUL byte") != NULL && id3 == 7);
    note.msg_len = 6; /* the bytes before it, still not UTF-8 */
  }
  CHECK_OK(pdx_kv_submit_notify_bytes(p->a, p->session_b, plan, 0, 2 * LAYERS, PDX_OPCODE_WRITE, NULL, &note, &id3));
  int32_t nst = -1;
  CHECK_OK(pdx_kv_notify_wait(p->a, id3, WAIT_MS, &nst));
  CHECK(nst == PDX_OK);
  CHECK_OK(pdx_batch_free(p->a, id3));
  pdx_notifications *list = NULL;
  size_t whole = 0;
  for (double until = now_s() + 10; whole == 0 && now_s() < until; sleep_ms(5)) {
    CHECK_OK(pdx_notifications_drain(p->b, &list));
    for (size_t i = 0; i < pdx_notifications_count(list); i++) {
      pdx_notify_bytes got;
      CHECK_OK(pdx_notification_get_bytes(list, i, &got));
      whole += got.msg_len == note.msg_len && memcmp(got.msg, packed, note.msg_len) == 0;
    }
    pdx_notifications_free(list);
  }
  CHECK(whole == 1);

  /* A failed layer holds the notification back for good. */
  pdx_kv_buffer bad_r[2] = {r.buf[0], r.buf[1]};
  static unsigned char unregistered[1 << 12];
  bad_r[0].base = addr_of(unregistered);
  bad_r[0].page_bytes = bad_r[1].page_bytes = 64;
  pdx_kv_buffer small_l[2] = {l.buf[2], l.buf[3]};
  small_l[0].page_bytes = small_l[1].page_bytes = 64;
  pdx_kv_plan *broken = NULL;
  CHECK_OK(pdx_kv_plan_new(small_l, bad_r, 2, src, dst, 32, NULL, &broken));
  uint64_t f0, f1;
  if (hang_double) setenv("FAKE_TE_FAIL_TASKS", "1", 1);
  CHECK_OK(pdx_kv_submit(p->a, p->session_b, broken, 0, 1, PDX_OPCODE_WRITE, NULL, NULL, NULL, &f0));
  if (hang_double) unsetenv("FAKE_TE_FAIL_TASKS");
  CHECK_OK(pdx_kv_submit(p->a, p->session_b, broken, 1, 2, PDX_OPCODE_WRITE, NULL, "kv_done", "room-8", &f1));
  st = PDX_OK;
  CHECK_OK(pdx_kv_notify_wait(p->a, f1, WAIT_MS, &st));
  CHECK(st != PDX_OK);
  CHECK(strstr(pdx_last_error_message(), "failed") != NULL);
  int32_t state = -1;
  CHECK_OK(pdx_batch_wait(p->a, f0, WAIT_MS, &state));
  CHECK(state == PDX_TASK_FAILED);
  CHECK_OK(pdx_batch_wait(p->a, f1, WAIT_MS, &state));
  CHECK(state == PDX_TASK_COMPLETED);
  CHECK(drain_count(p->b, "kv_done", "room-8") == 0);
  CHECK_OK(pdx_batch_free(p->a, f0));
  CHECK_OK(pdx_batch_free(p->a, f1));
  pdx_kv_plan_free(broken);

  pdx_kv_plan_free(plan);
  CHECK_OK(pdx_unregister_memory(p->a, l.pool));
  CHECK_OK(pdx_unregister_memory(p->b, r.pool));
  free(want);
  free(l.pool);
  free(r.pool);
}

/* Freeing the engine while a notification waits for its layers: the
 * in-flight work fails, the waiting ends, nothing crashes or leaks a use. */
static void test_free_while_pending(const char *protocol) {
  pair p;
  pair_start(&p, protocol);
  uint64_t pb[2] = {1u << 20, 1u << 20};
  side l, r;
  side_init(&l, 2, pb, 32);
  side_init(&r, 2, pb, 32);
  memset(l.pool, 1, l.bytes);
  CHECK_OK(pdx_register_memory(p.a, l.pool, l.bytes));
  CHECK_OK(pdx_register_memory(p.b, r.pool, r.bytes));
  int32_t pages[32];
  for (int i = 0; i < 32; i++) pages[i] = i;
  pdx_kv_plan *plan = NULL;
  CHECK_OK(pdx_kv_plan_new(l.buf, r.buf, 2, pages, pages, 32, NULL, &plan));
  uint64_t ids[2];
  CHECK_OK(pdx_kv_submit(p.a, p.session_b, plan, 0, 1, PDX_OPCODE_WRITE, NULL, NULL, NULL, &ids[0]));
  CHECK_OK(pdx_kv_submit(p.a, p.session_b, plan, 1, 2, PDX_OPCODE_WRITE, NULL, "kv_done", "room-9", &ids[1]));
  pdx_engine_free(p.a);
  pdx_status st = 1;
  CHECK_STATUS(pdx_kv_notify_wait(p.a, ids[1], 0, &st), PDX_ERR_INVALID_HANDLE);
  sleep_ms(200);
  CHECK(drain_count(p.b, "kv_done", "room-9") <= 1);
  pdx_kv_plan_free(plan);
  pdx_engine_free(p.b);
  free(l.pool);
  free(r.pool);
}

int main(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  unsetenv("PDX_TCP_ENGINE");
  pair p;
  pair_start(&p, "tcp");
  test_bad_inputs(&p);
  test_random_maps(&p, 60, 0);
  test_random_maps(&p, 20, 1);
  test_read(&p);
  test_heads(&p);
  test_layerwise(&p, 0);
  pair_stop(&p);
  test_free_while_pending("tcp");

  /* The same plans on the Mooncake backend, against its test double. */
  setenv("PDX_MOONCAKE_LIB", FAKE_TE_LIB, 1);
  pair m;
  pair_start(&m, "rdma");
  test_random_maps(&m, 20, 0);
  test_random_maps(&m, 10, 1);
  test_heads(&m);
  test_layerwise(&m, 1);
  pair_stop(&m);
  return pdx_test_finish("test_kv");
}
