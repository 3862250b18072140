/* pdx_engine_options and pdx_engine_init_with through the C ABI: one engine
 * per GPU, the options object's errors, and SGLang's device rules. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static void clear_env(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  unsetenv("MOONCAKE_DEVICE");
  unsetenv("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE");
  unsetenv("ASCEND_NPU_PHY_ID");
  unsetenv("PDX_MIN_PORT");
  unsetenv("PDX_MAX_PORT");
}

/* {"0": "mlx5_0,mlx5_8", ..., "7": "mlx5_7,mlx5_15"} */
static void eight_gpu_map(char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "{");
  for (int g = 0; g < 8; g++)
    n += (size_t)snprintf(buf + n, len - n, "%s\"%d\": \"mlx5_%d,mlx5_%d\"", g ? ", " : "", g, g, g + 8);
  snprintf(buf + n, len - n, "}");
}

static pdx_engine_options *with_gpu(int gpu) {
  pdx_engine_options *o = NULL;
  char id[16];
  snprintf(id, sizeof id, "%d", gpu);
  CHECK_OK(pdx_engine_options_new(&o));
  CHECK_OK(pdx_engine_options_set(o, "gpu_id", id));
  return o;
}

static void test_null_and_freed(void) {
  CHECK_STATUS(pdx_engine_options_new(NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_engine_options_set(NULL, "gpu_id", "1"), PDX_ERR_NULL_ARGUMENT);
  CHECK_LAST_ERROR("pdx_engine_options handle is NULL");
  const char *sentinel = "untouched";
  const char *got = sentinel;
  CHECK_STATUS(pdx_engine_options_get(NULL, "gpu_id", &got), PDX_ERR_NULL_ARGUMENT);
  CHECK(got == sentinel);
  pdx_engine_options_free(NULL); /* ignored */

  pdx_engine_options *o = NULL;
  CHECK_OK(pdx_engine_options_new(&o));
  CHECK_STATUS(pdx_engine_options_set(o, NULL, "1"), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_engine_options_get(o, NULL, &got), PDX_ERR_NULL_ARGUMENT);
  CHECK(got == sentinel);
  CHECK_STATUS(pdx_engine_options_get(o, "gpu_id", NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_OK(pdx_engine_options_get(o, "gpu_id", &got));
  CHECK(got == NULL); /* not set */
  pdx_engine_options_free(o);

  /* A freed handle is refused, never dereferenced; out-params untouched. */
  got = sentinel;
  CHECK_STATUS(pdx_engine_options_set(o, "gpu_id", "1"), PDX_ERR_INVALID_HANDLE);
  CHECK_STATUS(pdx_engine_options_get(o, "gpu_id", &got), PDX_ERR_INVALID_HANDLE);
  CHECK(got == sentinel);
  pdx_engine *untouched = (pdx_engine *)(uintptr_t)0x77;
  pdx_engine *e = untouched;
  CHECK_STATUS(pdx_engine_init_with("127.0.0.1", "tcp", NULL, o, &e), PDX_ERR_INVALID_HANDLE);
  CHECK(e == untouched);
  pdx_transport_choice *c = (pdx_transport_choice *)(uintptr_t)0x78;
  CHECK_STATUS(pdx_resolve_transport_with("127.0.0.1", NULL, NULL, o, &c), PDX_ERR_INVALID_HANDLE);
  CHECK(c == (pdx_transport_choice *)(uintptr_t)0x78);
  pdx_engine_options_free(o); /* twice: ignored */

  /* A handle of another type is not an options object. */
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  CHECK_STATUS(pdx_engine_options_set((pdx_engine_options *)a, "gpu_id", "1"), PDX_ERR_INVALID_HANDLE);
  pdx_args_free(a);
}

static void test_unknown_keys_and_bad_values(void) {
  pdx_engine_options *o = with_gpu(2);
  const char *sentinel = "untouched";
  const char *got = sentinel;
  CHECK_STATUS(pdx_engine_options_set(o, "lanes", "4"), PDX_ERR_UNKNOWN_KEY);
  const char *known = "unknown engine option 'lanes'; known options: gpu_id, device_source, min_port, ";
  CHECK(strncmp(pdx_last_error_message(), known, strlen(known)) == 0);
  CHECK(strstr(pdx_last_error_message(), "tcp_lanes") != NULL);
  CHECK_STATUS(pdx_engine_options_get(o, "lanes", &got), PDX_ERR_UNKNOWN_KEY);
  CHECK(got == sentinel);

  CHECK_STATUS(pdx_engine_options_set(o, "gpu_id", "-3"), PDX_ERR_INVALID_VALUE);
  CHECK_LAST_ERROR("invalid value for engine option 'gpu_id': '-3'; allowed values: a GPU index 0..=2147483647");
  CHECK_STATUS(pdx_engine_options_set(o, "tcp_lanes", "65"), PDX_ERR_INVALID_VALUE);
  CHECK_LAST_ERROR("invalid value for engine option 'tcp_lanes': '65'; allowed values: an integer 1..=64");
  CHECK_STATUS(pdx_engine_options_set(o, "device_source", "env"), PDX_ERR_INVALID_VALUE);
  CHECK_LAST_ERROR("invalid value for engine option 'device_source': 'env'; allowed values: shared, remote_instance");
  CHECK_STATUS(pdx_engine_options_set(o, "transfer_timeout", "2"), PDX_ERR_INVALID_VALUE);
  CHECK_LAST_ERROR("invalid value for engine option 'transfer_timeout': '2'; allowed values: seconds 5..=1000000 "
                   "(decimals allowed)");
  CHECK_STATUS(pdx_engine_options_set(o, "tcp_engine", "fast"), PDX_ERR_INVALID_VALUE);
  CHECK_LAST_ERROR("invalid value for engine option 'tcp_engine': 'fast'; allowed values: native, mooncake");
  CHECK_STATUS(pdx_engine_options_set(o, "gpu_id", "\xff"), PDX_ERR_INVALID_UTF8);

  /* Failed sets changed nothing. */
  CHECK_OK(pdx_engine_options_get(o, "gpu_id", &got));
  CHECK_STR(got, "2");
  CHECK_OK(pdx_engine_options_get(o, "tcp_lanes", &got));
  CHECK(got == NULL);
  CHECK_OK(pdx_engine_options_set(o, "tcp_lanes", " 8 "));
  CHECK_OK(pdx_engine_options_get(o, "tcp_lanes", &got));
  CHECK_STR(got, "8");
  CHECK_OK(pdx_engine_options_set(o, "tcp_lanes", NULL)); /* unset */
  CHECK_OK(pdx_engine_options_get(o, "tcp_lanes", &got));
  CHECK(got == NULL);
  pdx_engine_options_free(o);
}

/* One engine per GPU: each gpu_id gets its own entry, inline and from a file. */
static void test_eight_gpus(void) {
  clear_env();
  char map[512];
  eight_gpu_map(map, sizeof map);
  char dir[] = "/tmp/pdx_ib_map_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[64];
  snprintf(path, sizeof path, "%s/ib.json", dir);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  CHECK(fputs(map, f) >= 0);
  fclose(f);

  pdx_engine *engines[8] = {0};
  for (int source = 0; source < 2; source++) {
    const char *device = source == 0 ? map : path;
    for (int g = 0; g < 8; g++) {
      char want[32], entry[160];
      snprintf(want, sizeof want, "mlx5_%d,mlx5_%d", g, g + 8);
      if (source == 0)
        snprintf(entry, sizeof entry, "entry %d of the inline per-GPU JSON mapping (shared-engine rule, gpu_id %d)", g, g);
      else
        snprintf(entry, sizeof entry, "entry %d of the per-GPU mapping in %s", g, path);
      pdx_engine_options *o = with_gpu(g);

      pdx_transport_choice *c = NULL;
      CHECK_OK(pdx_resolve_transport_with("10.0.0.9", NULL, device, o, &c));
      CHECK_STR(pdx_transport_choice_protocol(c), "rdma");
      CHECK_STR(pdx_transport_choice_device(c), want);
      CHECK(strstr(pdx_transport_choice_reason(c), entry) != NULL);
      pdx_transport_choice_free(c);
      /* The plain resolver with the same GPU agrees. */
      CHECK_OK(pdx_resolve_transport("10.0.0.9", NULL, device, g, &c));
      CHECK_STR(pdx_transport_choice_device(c), want);
      CHECK(strstr(pdx_transport_choice_reason(c), entry) != NULL);
      pdx_transport_choice_free(c);

      /* The engine itself (native tcp: the device is resolved all the same). */
      CHECK_OK(pdx_engine_init_with("127.0.0.1", "tcp", device, o, &engines[g]));
      pdx_engine_options_free(o); /* the engine does not need it any more */
      CHECK_STR(pdx_engine_device(engines[g]), want);
      CHECK(strstr(pdx_engine_transport_reason(engines[g]), entry) != NULL);
      CHECK_STR(pdx_engine_protocol(engines[g]), "tcp");
    }
    for (int g = 0; g < 8; g++) pdx_engine_free(engines[g]);

    /* A GPU the mapping lacks: SGLang's ValueError text, nothing prepended. */
    pdx_engine_options *o = with_gpu(8);
    pdx_engine *untouched = (pdx_engine *)(uintptr_t)0x79;
    pdx_engine *e = untouched;
    CHECK_STATUS(pdx_engine_init_with("127.0.0.1", "tcp", device, o, &e), PDX_ERR_VALUE_ERROR);
    CHECK_LAST_ERROR("No IB devices configured for GPU 8. Available GPUs: [0, 1, 2, 3, 4, 5, 6, 7]");
    CHECK(e == untouched);
    pdx_engine_options_free(o);
  }
  unlink(path);
  rmdir(dir);

  /* No options: GPU 0, the same as pdx_engine_init. */
  pdx_engine *e = NULL;
  CHECK_OK(pdx_engine_init_with("127.0.0.1", "tcp", map, NULL, &e));
  CHECK_STR(pdx_engine_device(e), "mlx5_0,mlx5_8");
  CHECK(strstr(pdx_engine_transport_reason(e), "gpu_id 0 (not given)") != NULL);
  pdx_engine_free(e);
  CHECK(pdx_engine_device(e) == NULL);
  CHECK(pdx_engine_transport_reason(e) == NULL);
}

/* SGLang's remote-instance rule reads MOONCAKE_DEVICE; the shared one never does. */
static void test_remote_instance_rule(void) {
  clear_env();
  setenv("MOONCAKE_DEVICE", "mlx5_3", 1);
  pdx_engine_options *o = with_gpu(1);
  pdx_transport_choice *c = NULL;
  CHECK_OK(pdx_resolve_transport_with("10.0.0.9", NULL, NULL, o, &c));
  CHECK_STR(pdx_transport_choice_device(c), "");
  pdx_transport_choice_free(c);
  CHECK_OK(pdx_engine_options_set(o, "device_source", "remote_instance"));
  CHECK_OK(pdx_resolve_transport_with("10.0.0.9", NULL, NULL, o, &c));
  CHECK_STR(pdx_transport_choice_device(c), "mlx5_3");
  CHECK(strstr(pdx_transport_choice_reason(c), "from MOONCAKE_DEVICE, verbatim (remote-instance rule)") != NULL);
  pdx_transport_choice_free(c);
  CHECK_OK(pdx_resolve_transport_with("10.0.0.9", NULL, "mlx5_5", o, &c));
  CHECK_STR(pdx_transport_choice_device(c), "mlx5_5"); /* an explicit device wins */
  pdx_transport_choice_free(c);
  pdx_engine *e = NULL;
  CHECK_OK(pdx_engine_init_with("127.0.0.1", "tcp", NULL, o, &e));
  CHECK_STR(pdx_engine_device(e), "mlx5_3");
  pdx_engine_free(e);
  pdx_engine_options_free(o);
  unsetenv("MOONCAKE_DEVICE");
}

/* Options feed the engine's settings and win over their variables. */
static void test_options_feed_settings(void) {
  clear_env();
  setenv("PDX_MIN_PORT", "21000", 1);
  setenv("PDX_MAX_PORT", "21100", 1);
  pdx_engine_options *o = NULL;
  CHECK_OK(pdx_engine_options_new(&o));
  CHECK_OK(pdx_engine_options_set(o, "min_port", "23400"));
  CHECK_OK(pdx_engine_options_set(o, "max_port", "23499"));
  pdx_engine *e = NULL;
  CHECK_OK(pdx_engine_init_with("127.0.0.1", "tcp", NULL, o, &e));
  uint16_t port = pdx_engine_rpc_port(e);
  CHECK(port >= 23400 && port <= 23499);
  pdx_engine_free(e);
  CHECK_OK(pdx_engine_init("127.0.0.1", "tcp", NULL, &e)); /* no options: the variables */
  port = pdx_engine_rpc_port(e);
  CHECK(port >= 21000 && port <= 21100);
  pdx_engine_free(e);
  pdx_engine_options_free(o);
  clear_env();
}

/* The args object hands SGLang's shared-engine device straight over. */
static void test_shared_engine_device_from_args(void) {
  clear_env();
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  CHECK_OK(pdx_args_set(a, "--mooncake-ib-device", "{\"0\": \"mlx5_0\", \"1\": \"mlx5_1\"}"));
  const char *device = NULL;
  CHECK_OK(pdx_args_get(a, "shared_engine_ib_device", &device));
  CHECK_STR(device, "{\"0\": \"mlx5_0\", \"1\": \"mlx5_1\"}");
  CHECK_STATUS(pdx_args_set(a, "shared_engine_ib_device", "x"), PDX_ERR_INVALID_VALUE);
  pdx_engine_options *o = with_gpu(1);
  pdx_engine *e = NULL;
  CHECK_OK(pdx_engine_init_with("127.0.0.1", "tcp", device, o, &e));
  CHECK_STR(pdx_engine_device(e), "mlx5_1");
  pdx_engine_free(e);
  pdx_engine_options_free(o);
  pdx_args_free(a);
}

/* Warnings logged (kept while a test looks for one). */
static char warnings[16][512];
static int n_warnings;

static void keep_warning(void *ud, int32_t level, const char *module, size_t module_len, const char *msg,
                         size_t msg_len) {
  (void)ud, (void)module, (void)module_len;
  if (level >= PDX_LOG_WARNING && n_warnings < 16)
    snprintf(warnings[n_warnings++], sizeof warnings[0], "%.*s", (int)msg_len, msg);
}

static int warned(const char *text) {
  for (int i = 0; i < n_warnings; i++)
    if (strstr(warnings[i], text) != NULL) return 1;
  return 0;
}

static void check_kept(pdx_engine_options *o, const char *key, const char *given, const char *kept) {
  const char *got = NULL;
  CHECK_OK(pdx_engine_options_set(o, key, given));
  CHECK_OK(pdx_engine_options_get(o, key, &got));
  CHECK_STR(got, kept);
}

/* An option keeps its value in the normal spelling and takes exactly the
 * texts its variable takes; cuda_staging_bytes and PDX_CUDA_STAGING_BYTES
 * below the minimum are both raised to it with a warning. */
static void test_normal_spelling_and_variable_forms(void) {
  clear_env();
  pdx_engine_options *o = NULL;
  CHECK_OK(pdx_engine_options_new(&o));
  check_kept(o, "tcp_lanes", "+5", "5");
  check_kept(o, "tcp_lanes", "05", "5");
  check_kept(o, "gpu_id", "+3", "3");
  check_kept(o, "transfer_timeout", "7.50", "7.5");
  check_kept(o, "transfer_timeout", " +30 ", "30");
  check_kept(o, "connect_timeout_ms", "+250", "250");
  check_kept(o, "ascend_npu_phy_id", "1_0", "10"); /* read with Python's int(), as ASCEND_NPU_PHY_ID is */
  /* MC_TRANSFER_TIMEOUT takes decimal seconds, no exponent: neither does its option. */
  CHECK_STATUS(pdx_engine_options_set(o, "transfer_timeout", "1e3"), PDX_ERR_INVALID_VALUE);
  CHECK_STATUS(pdx_engine_options_set(o, "tcp_lanes", "1_0"), PDX_ERR_INVALID_VALUE);
  pdx_engine_options_free(o);

  CHECK_OK(pdx_set_log_callback(keep_warning, NULL, PDX_LOG_WARNING));
  n_warnings = 0;
  setenv("MC_TRANSFER_TIMEOUT", "1e3", 1);
  pdx_engine *e = NULL;
  CHECK_OK(pdx_engine_init("127.0.0.1", "tcp", NULL, &e));
  pdx_engine_free(e);
  unsetenv("MC_TRANSFER_TIMEOUT");
  CHECK(warned("ignoring MC_TRANSFER_TIMEOUT=\"1e3\""));

  /* The staging minimum: the same rule from the option and the variable. */
  n_warnings = 0;
  CHECK_OK(pdx_engine_options_new(&o));
  check_kept(o, "cuda_staging_bytes", "4096", "4096");
  CHECK_OK(pdx_engine_init_with("127.0.0.1", "tcp", NULL, o, &e));
  pdx_engine_free(e);
  pdx_engine_options_free(o);
  CHECK(warned("is 4096, below the minimum 65536; using 65536"));
  n_warnings = 0;
  setenv("PDX_CUDA_STAGING_BYTES", "1", 1);
  CHECK_OK(pdx_engine_init("127.0.0.1", "tcp", NULL, &e));
  pdx_engine_free(e);
  unsetenv("PDX_CUDA_STAGING_BYTES");
  CHECK(warned("is 1, below the minimum 65536; using 65536"));
  CHECK_OK(pdx_set_log_callback(NULL, NULL, 0));
  for (int i = 0; i < n_warnings; i++) printf("  warning: %s\n", warnings[i]);
}

int main(void) {
  test_null_and_freed();
  test_unknown_keys_and_bad_values();
  test_eight_gpus();
  test_remote_instance_rule();
  test_options_feed_settings();
  test_shared_engine_device_from_args();
  test_normal_spelling_and_variable_forms();
  return pdx_test_finish("test_engine_options");
}
