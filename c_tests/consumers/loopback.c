/* A C consumer of an installed pdx (built by scripts/test-install.sh with
 * pkg-config): two native TCP engines on 127.0.0.1, one registers a buffer,
 * the other writes into it and reads it back. Exits non-zero on any error. */
#include <pdx.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN (1u << 20)

static int fail(const char *what, pdx_status s) {
  fprintf(stderr, "%s: %s: %s\n", what, pdx_status_str(s), pdx_last_error_message());
  return 1;
}

int main(void) {
  char expected[32];
  snprintf(expected, sizeof expected, "pdx/%d.%d.%d", PDX_VERSION_MAJOR, PDX_VERSION_MINOR, PDX_VERSION_PATCH);
  if (strcmp(pdx_version(), expected) != 0) {
    fprintf(stderr, "header is %s but the library is %s\n", expected, pdx_version());
    return 1;
  }
  unsigned char *pool = calloc(LEN, 1), *src = malloc(LEN), *back = calloc(LEN, 1);
  if (!pool || !src || !back) return 1;
  for (size_t i = 0; i < LEN; i++) src[i] = (unsigned char)(i * 131u + 7u);

  pdx_engine *target = NULL, *initiator = NULL;
  pdx_status s;
  if ((s = pdx_engine_init("127.0.0.1", "tcp", NULL, &target)) != PDX_OK) return fail("init target", s);
  if ((s = pdx_engine_init("127.0.0.1", "tcp", NULL, &initiator)) != PDX_OK) return fail("init initiator", s);
  if ((s = pdx_register_memory(target, pool, LEN)) != PDX_OK) return fail("register", s);
  const char *session = pdx_engine_session_id(target);
  uint64_t remote = (uint64_t)(uintptr_t)pool;
  if ((s = pdx_transfer_sync_write(initiator, session, src, remote, LEN)) != PDX_OK) return fail("write", s);
  if ((s = pdx_transfer_sync_read(initiator, session, back, remote, LEN)) != PDX_OK) return fail("read", s);
  if (memcmp(pool, src, LEN) != 0 || memcmp(back, src, LEN) != 0) {
    fprintf(stderr, "bytes differ after the round trip\n");
    return 1;
  }
  printf("c consumer: %s, wrote and read back %u bytes through %s\n", pdx_version(), LEN, session);
  pdx_engine_free(initiator);
  pdx_engine_free(target); /* session belonged to it */
  free(pool);
  free(src);
  free(back);
  return 0;
}
