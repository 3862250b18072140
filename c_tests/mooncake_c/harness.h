/* Assertion harness of the tests of pdx's libtransfer_engine.so (Mooncake's
 * C API): counts checks, prints a failing expression with pdx's last error,
 * exits non-zero. These tests include only transfer_engine_c.h and link only
 * libtransfer_engine.so, as a Mooncake C API program does. */
#ifndef PDX_MC_TEST_HARNESS_H
#define PDX_MC_TEST_HARNESS_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transfer_engine_c.h"

static int mc_checks = 0;
static int mc_failures = 0;

#define CHECK(cond)                                                                                   \
  do {                                                                                                \
    mc_checks++;                                                                                      \
    if (!(cond)) {                                                                                    \
      mc_failures++;                                                                                  \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond,        \
              pdx_last_error_message());                                                              \
    }                                                                                                 \
  } while (0)

#define CHECK_EQ(actual, expected)                                                                    \
  do {                                                                                                \
    long long a_ = (long long)(actual), e_ = (long long)(expected);                                   \
    mc_checks++;                                                                                      \
    if (a_ != e_) {                                                                                   \
      mc_failures++;                                                                                  \
      fprintf(stderr, "%s:%d: %s is %lld, expected %lld (last error: %s)\n", __FILE__, __LINE__,      \
              #actual, a_, e_, pdx_last_error_message());                                             \
    }                                                                                                 \
  } while (0)

/* The last error mentions `needle`. */
#define CHECK_REASON(needle)                                                                          \
  do {                                                                                                \
    const char *m_ = pdx_last_error_message();                                                        \
    mc_checks++;                                                                                      \
    if (m_ == NULL || strstr(m_, (needle)) == NULL) {                                                 \
      mc_failures++;                                                                                  \
      fprintf(stderr, "%s:%d: last error \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__,       \
              m_ ? m_ : "(null)", (needle));                                                          \
    }                                                                                                 \
  } while (0)

static inline double mc_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static inline void mc_sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static int mc_finish(const char *name) {
  printf("%s: %d checks, %d failed\n", name, mc_checks, mc_failures);
  return mc_failures == 0 ? 0 : 1;
}

#endif
