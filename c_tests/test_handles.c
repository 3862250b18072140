/* Stale handles: every object C holds is freed and made again 1000 times,
 * and after each cycle the freed handle is used once more. pdx reuses the
 * slot (memory stays flat) but the old handle must be refused with
 * PDX_ERR_INVALID_HANDLE every time, never drive the new object. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>

#include "harness.h"

#define CYCLES 1000

static int refused(pdx_status s) { return s == PDX_ERR_INVALID_HANDLE; }

static void report(const char *what, int n) {
  printf("%s: %d of %d stale handles refused\n", what, n, CYCLES);
  CHECK(n == CYCLES);
}

static void stale_args(void) {
  pdx_args *old = NULL;
  CHECK_OK(pdx_args_new(&old));
  int n = 0;
  for (int i = 0; i < CYCLES; i++) {
    pdx_args_free(old);
    pdx_args *fresh = NULL;
    CHECK_OK(pdx_args_new(&fresh));
    CHECK(fresh != old);
    /* A set through the stale handle must not reach the new object. */
    pdx_status s = pdx_args_set(old, "disaggregation_mode", "decode");
    const char *mode = NULL;
    CHECK_OK(pdx_args_get(fresh, "disaggregation_mode", &mode));
    CHECK_STR(mode, "null");
    if (refused(s) && refused(pdx_normalize_args(old))) n++;
    pdx_args_free(old); /* freeing a stale handle is ignored */
    old = fresh;
  }
  pdx_args_free(old);
  report("pdx_args", n);
}

static void stale_engines(void) {
  pdx_engine *old = NULL;
  CHECK_OK(pdx_engine_init("127.0.0.1", "tcp", NULL, &old));
  static char region[64];
  int n = 0;
  for (int i = 0; i < CYCLES; i++) {
    pdx_engine_free(old);
    pdx_engine *fresh = NULL;
    CHECK_OK(pdx_engine_init("127.0.0.1", "tcp", NULL, &fresh));
    if (fresh == NULL) break;
    CHECK(fresh != old);
    pdx_status s = pdx_register_memory(old, region, sizeof region);
    /* Had the stale handle reached the new engine, this would overlap. */
    CHECK_OK(pdx_register_memory(fresh, region, sizeof region));
    if (refused(s) && pdx_engine_session_id(old) == NULL && pdx_engine_rpc_port(old) == 0) n++;
    old = fresh;
  }
  pdx_engine_free(old);
  report("pdx_engine", n);
}

static void stale_choices_and_configs(void) {
  pdx_transport_choice *old = NULL;
  CHECK_OK(pdx_resolve_transport("127.0.0.1", "tcp", NULL, -1, &old));
  int n = 0;
  for (int i = 0; i < CYCLES; i++) {
    pdx_transport_choice_free(old);
    pdx_transport_choice *fresh = NULL;
    CHECK_OK(pdx_resolve_transport("127.0.0.1", "tcp", NULL, -1, &fresh));
    CHECK(fresh != old);
    if (pdx_transport_choice_protocol(old) == NULL && pdx_transport_choice_protocol(fresh) != NULL) n++;
    old = fresh;
  }
  pdx_transport_choice_free(old);
  report("pdx_transport_choice", n);

  pdx_ib_device_config *cold = NULL;
  CHECK_OK(pdx_parse_ib_device_config("mlx5_0", &cold));
  n = 0;
  for (int i = 0; i < CYCLES; i++) {
    pdx_ib_device_config_free(cold);
    pdx_ib_device_config *fresh = NULL;
    CHECK_OK(pdx_parse_ib_device_config("mlx5_1", &fresh));
    int32_t kind = -7;
    if (refused(pdx_ib_device_config_kind(cold, &kind)) && kind == -7) n++;
    cold = fresh;
  }
  pdx_ib_device_config_free(cold);
  report("pdx_ib_device_config", n);
}

int main(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  stale_args();
  stale_choices_and_configs();
  stale_engines();
  return pdx_test_finish("test_handles");
}
