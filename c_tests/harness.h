/* Tiny assertion harness for the pdx C tests: no dependencies, counts checks,
 * prints a failing expression with the last pdx error, exits non-zero. */
#ifndef PDX_C_TEST_HARNESS_H
#define PDX_C_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pdx.h"

static int pdx_checks = 0;
static int pdx_failures = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    pdx_checks++;                                                                \
    if (!(cond)) {                                                               \
      pdx_failures++;                                                            \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,    \
              __LINE__, #cond, pdx_last_error_message());                        \
    }                                                                            \
  } while (0)

#define CHECK_STATUS(call, expected)                                             \
  do {                                                                           \
    pdx_status got_ = (call);                                                    \
    pdx_checks++;                                                                \
    if (got_ != (expected)) {                                                    \
      pdx_failures++;                                                            \
      fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d; last error: %s\n", \
              __FILE__, __LINE__, #call, (int)got_, pdx_status_str(got_),        \
              (int)(expected), pdx_last_error_message());                        \
    }                                                                            \
  } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, PDX_OK)

#define CHECK_STR(actual, expected)                                              \
  do {                                                                           \
    const char *a_ = (actual);                                                   \
    const char *e_ = (expected);                                                 \
    pdx_checks++;                                                                \
    if (a_ == NULL || e_ == NULL ? a_ != e_ : strcmp(a_, e_) != 0) {             \
      pdx_failures++;                                                            \
      fprintf(stderr, "%s:%d: %s is \"%s\", expected \"%s\"\n", __FILE__,        \
              __LINE__, #actual, a_ ? a_ : "(null)", e_ ? e_ : "(null)");        \
    }                                                                            \
  } while (0)

#define CHECK_LAST_ERROR(expected)                                               \
  CHECK_STR(pdx_last_error_message(), (expected))

/* A native tcp engine on 127.0.0.1; a test that cannot get one stops. */
static inline pdx_engine *start_engine(void) {
  pdx_engine *e = NULL;
  CHECK_OK(pdx_engine_init("127.0.0.1", "tcp", NULL, &e));
  if (e == NULL) {
    fprintf(stderr, "cannot start an engine: %s\n", pdx_last_error_message());
    exit(1);
  }
  return e;
}

#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 199309L
/* Seconds on the monotonic clock (tests that define _POSIX_C_SOURCE). */
static inline double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}
#endif

static int pdx_test_finish(const char *name) {
  printf("%s: %d checks, %d failed\n", name, pdx_checks, pdx_failures);
  return pdx_failures == 0 ? 0 : 1;
}

#endif
