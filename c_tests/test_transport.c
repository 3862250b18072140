/* pdx_resolve_transport and the IB device functions through the C ABI. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static void clear_env(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("MOONCAKE_PROTOCOL");
  unsetenv("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE");
  unsetenv("ASCEND_NPU_PHY_ID");
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void test_protocol_resolution(void) {
  clear_env();
  pdx_transport_choice *c = NULL;
  CHECK_OK(pdx_resolve_transport("10.0.0.1", NULL, "mlx5_0,mlx5_1", 0, &c));
  CHECK_STR(pdx_transport_choice_protocol(c), "rdma");
  CHECK_STR(pdx_transport_choice_hostname(c), "10.0.0.1");
  CHECK_STR(pdx_transport_choice_device(c), "mlx5_0,mlx5_1");
  CHECK(strstr(pdx_transport_choice_reason(c), "default") != NULL);
  CHECK(pdx_transport_choice_warning_count(c) == 0);
  CHECK(pdx_transport_choice_warning(c, 0) == NULL);
  pdx_transport_choice_free(c);

  setenv("MOONCAKE_PROTOCOL", "efa", 1);
  CHECK_OK(pdx_resolve_transport("10.0.0.1", NULL, NULL, 0, &c));
  CHECK_STR(pdx_transport_choice_protocol(c), "efa");
  CHECK_STR(pdx_transport_choice_device(c), "");
  pdx_transport_choice_free(c);
  CHECK_OK(pdx_resolve_transport("10.0.0.1", "tcp", NULL, 0, &c));
  CHECK_STR(pdx_transport_choice_protocol(c), "tcp"); /* explicit beats the environment */
  pdx_transport_choice_free(c);

  setenv("MOONCAKE_PROTOCOL", "infiniband", 1);
  pdx_transport_choice *untouched = (pdx_transport_choice *)(uintptr_t)0x99;
  c = untouched;
  CHECK_STATUS(pdx_resolve_transport("10.0.0.1", NULL, NULL, 0, &c), PDX_ERR_UNKNOWN_PROTOCOL);
  CHECK_LAST_ERROR("unknown transport protocol 'infiniband' (from MOONCAKE_PROTOCOL); known protocols: "
                   "rdma, efa, tcp, ascend, nvlink, nvlink_intra, nvmeof, cxl, barex, hip");
  CHECK(c == untouched);
  unsetenv("MOONCAKE_PROTOCOL");

  /* Per-GPU device mapping. */
  CHECK_OK(pdx_resolve_transport("h", NULL, "{\"0\": \"mlx5_0\", \"1\": \"mlx5_1\"}", 1, &c));
  CHECK_STR(pdx_transport_choice_device(c), "mlx5_1");
  pdx_transport_choice_free(c);
  CHECK_STATUS(pdx_resolve_transport("h", NULL, "{\"0\": \"mlx5_0\"}", 5, &c), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("No IB devices configured for GPU 5. Available GPUs: [0]");
}

static void test_forced_tcp(void) {
  clear_env();
  pdx_transport_choice *c = NULL;
  setenv("MC_FORCE_TCP", "1", 1);
  CHECK_OK(pdx_resolve_transport("10.0.0.1", "rdma", "mlx5_0", 0, &c));
  CHECK_STR(pdx_transport_choice_protocol(c), "tcp");
  CHECK_STR(pdx_transport_choice_device(c), "");
  CHECK(strstr(pdx_transport_choice_reason(c), "MC_FORCE_TCP") != NULL);
  CHECK(pdx_transport_choice_warning_count(c) == 0);
  pdx_transport_choice_free(c);

  setenv("MC_FORCE_TCP", "0", 1);
  CHECK_OK(pdx_resolve_transport("10.0.0.1", NULL, NULL, 0, &c));
  CHECK_STR(pdx_transport_choice_protocol(c), "tcp");
  CHECK(pdx_transport_choice_warning_count(c) == 1);
  CHECK(strstr(pdx_transport_choice_warning(c, 0), "Mooncake forces the TCP transport whenever MC_FORCE_TCP is set") != NULL);
  pdx_transport_choice_free(c);
  clear_env();
}

static void test_ascend(void) {
  clear_env();
  setenv("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "true", 1);
  pdx_transport_choice *c = NULL;
  CHECK_OK(pdx_resolve_transport("10.0.0.1", NULL, NULL, 3, &c));
  CHECK_STR(pdx_transport_choice_protocol(c), "ascend");
  const char *host = pdx_transport_choice_hostname(c);
  CHECK(host != NULL && strncmp(host, "10.0.0.1:", 9) == 0 && ends_with(host, ":npu_3"));
  pdx_transport_choice_free(c);
  setenv("ASCEND_NPU_PHY_ID", "7", 1);
  CHECK_OK(pdx_resolve_transport("10.0.0.1", NULL, NULL, 3, &c));
  CHECK(ends_with(pdx_transport_choice_hostname(c), ":npu_7"));
  pdx_transport_choice_free(c);
  clear_env();
}

static void test_transport_bad_arguments(void) {
  clear_env();
  pdx_transport_choice *c = NULL;
  CHECK_STATUS(pdx_resolve_transport(NULL, NULL, NULL, 0, &c), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_resolve_transport("h", NULL, NULL, 0, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_resolve_transport("h", "rd\xffma", NULL, 0, &c), PDX_ERR_INVALID_UTF8);
  CHECK_STATUS(pdx_resolve_transport("h\xc3", NULL, NULL, 0, &c), PDX_ERR_INVALID_UTF8);
  CHECK(pdx_transport_choice_protocol(NULL) == NULL);
  pdx_transport_choice *garbage = (pdx_transport_choice *)(uintptr_t)0x7777000;
  CHECK(pdx_transport_choice_hostname(garbage) == NULL);
  CHECK(pdx_transport_choice_warning_count(garbage) == 0);
  pdx_transport_choice_free(garbage);
  CHECK_OK(pdx_resolve_transport("h", NULL, NULL, -1, &c));
  pdx_transport_choice_free(c);
  CHECK(pdx_transport_choice_device(c) == NULL); /* freed */
  CHECK(strstr(pdx_last_error_message(), "not live") != NULL);
  pdx_transport_choice_free(c);
  pdx_transport_choice_free(NULL);
}

static void test_ib_config(void) {
  pdx_ib_device_config *cfg = NULL;
  int32_t kind = -1;
  size_t count = 99;
  const char *dev = "x";

  CHECK_OK(pdx_parse_ib_device_config(NULL, &cfg));
  CHECK_OK(pdx_ib_device_config_kind(cfg, &kind));
  CHECK(kind == PDX_IB_CONFIG_NONE);
  CHECK_OK(pdx_ib_devices_for_gpu(cfg, 0, &dev));
  CHECK(dev == NULL);
  pdx_ib_device_config_free(cfg);

  CHECK_OK(pdx_parse_ib_device_config(" mlx5_0, mlx5_1 ", &cfg));
  CHECK_OK(pdx_ib_device_config_kind(cfg, &kind));
  CHECK(kind == PDX_IB_CONFIG_ALL_GPUS);
  CHECK_OK(pdx_ib_device_config_gpu_count(cfg, &count));
  CHECK(count == 0);
  CHECK_OK(pdx_ib_devices_for_gpu(cfg, 42, &dev));
  CHECK_STR(dev, "mlx5_0, mlx5_1");
  pdx_ib_device_config_free(cfg);

  CHECK_OK(pdx_parse_ib_device_config("{\"1\": \" mlx5_2 \", \"0\": \"mlx5_0,mlx5_1\"}", &cfg));
  CHECK_OK(pdx_ib_device_config_kind(cfg, &kind));
  CHECK(kind == PDX_IB_CONFIG_PER_GPU);
  CHECK_OK(pdx_ib_device_config_gpu_count(cfg, &count));
  CHECK(count == 2);
  int64_t gpu = -5;
  CHECK_OK(pdx_ib_device_config_gpu_at(cfg, 0, &gpu, &dev));
  CHECK(gpu == 1);
  CHECK_STR(dev, "mlx5_2");
  CHECK_OK(pdx_ib_devices_for_gpu(cfg, 0, &dev));
  CHECK_STR(dev, "mlx5_0,mlx5_1");
  gpu = -5;
  CHECK_STATUS(pdx_ib_device_config_gpu_at(cfg, 2, &gpu, &dev), PDX_ERR_INDEX_OUT_OF_RANGE);
  CHECK(gpu == -5);
  CHECK_STATUS(pdx_ib_devices_for_gpu(cfg, 3, &dev), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("No IB devices configured for GPU 3. Available GPUs: [1, 0]");
  CHECK_STATUS(pdx_ib_devices_for_gpu(cfg, 3, NULL), PDX_ERR_NULL_ARGUMENT);
  pdx_ib_device_config_free(cfg);
  CHECK_STATUS(pdx_ib_device_config_kind(cfg, &kind), PDX_ERR_INVALID_HANDLE);
  pdx_ib_device_config_free(cfg);

  CHECK_STATUS(pdx_parse_ib_device_config("{oops", &cfg), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("Invalid JSON mapping: {oops");
  CHECK_STATUS(pdx_parse_ib_device_config("{}", &cfg), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("No valid GPU mappings found in JSON");
  CHECK_STATUS(pdx_parse_ib_device_config("/nonexistent/pdx.json", &cfg), PDX_ERR_RUNTIME);
  CHECK_LAST_ERROR("File /nonexistent/pdx.json does not exist.");
  CHECK_STATUS(pdx_parse_ib_device_config("mlx5_0", NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_parse_ib_device_config("\xfe", &cfg), PDX_ERR_INVALID_UTF8);
}

static void test_ib_validation(void) {
  char root[] = "/tmp/pdx_sysfs_XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  char path[256];
  const char *names[] = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"};
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", root, names[i]);
    CHECK(mkdir(path, 0700) == 0);
  }

  pdx_ib_validation *v = NULL;
  const char *dev = "x";
  int32_t level = 0;
  CHECK_OK(pdx_validate_ib_devices("mlx5_0, mlx5_1", root, &v));
  CHECK_OK(pdx_ib_validation_devices(v, &dev));
  CHECK_STR(dev, "mlx5_0,mlx5_1");
  CHECK(pdx_ib_validation_message_count(v) == 0);
  pdx_ib_validation_free(v);

  CHECK_OK(pdx_validate_ib_devices("{\"0\": \"mlx5_0, mlx5_1\", \"1\": \"mlx5_2, mlx5_3\"}", root, &v));
  CHECK_OK(pdx_ib_validation_devices(v, &dev));
  CHECK_STR(dev, "{\"0\":\"mlx5_0,mlx5_1\",\"1\":\"mlx5_2,mlx5_3\"}");
  pdx_ib_validation_free(v);

  CHECK_OK(pdx_validate_ib_devices("mlx5_1,mlx5_1", root, &v));
  CHECK_OK(pdx_ib_validation_devices(v, &dev));
  CHECK_STR(dev, "mlx5_1");
  CHECK(pdx_ib_validation_message_count(v) == 1);
  CHECK_STR(pdx_ib_validation_message(v, 0, &level),
            "Duplicate IB devices specified for all GPUs: mlx5_1,mlx5_1. Deduplicating to: mlx5_1");
  CHECK(level == PDX_LOG_WARNING);
  CHECK(pdx_ib_validation_message(v, 1, &level) == NULL);
  pdx_ib_validation_free(v);

  CHECK_OK(pdx_validate_ib_devices(NULL, root, &v));
  CHECK_OK(pdx_ib_validation_devices(v, &dev));
  CHECK(dev == NULL);
  CHECK_STR(pdx_ib_validation_message(v, 0, NULL),
            "No IB devices specified for Mooncake backend, falling back to auto discovery.");
  pdx_ib_validation_free(v);

  CHECK_STATUS(pdx_validate_ib_devices("mlx5_0,mlx5_9", root, &v), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("Invalid IB devices specified for all GPUs: ['mlx5_9']. Available devices: "
                   "['mlx5_0', 'mlx5_1', 'mlx5_2', 'mlx5_3']");
  CHECK_STATUS(pdx_validate_ib_devices("  ", root, &v), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("No valid IB devices specified");
  CHECK_STATUS(pdx_validate_ib_devices("mlx5_0", "/nonexistent/ib", &v), PDX_ERR_RUNTIME);
  CHECK_LAST_ERROR("InfiniBand sysfs path not found: /nonexistent/ib. Please ensure InfiniBand drivers are installed.");
  CHECK_STATUS(pdx_validate_ib_devices("mlx5_0", root, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_ib_validation_devices(v, &dev), PDX_ERR_INVALID_HANDLE); /* freed above */

  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", root, names[i]);
    rmdir(path);
  }
  CHECK_STATUS(pdx_validate_ib_devices("mlx5_0", root, &v), PDX_ERR_RUNTIME);
  char expected[300];
  snprintf(expected, sizeof expected, "No IB devices found in %s", root);
  CHECK_LAST_ERROR(expected);
  rmdir(root);
}

static void test_session_id(void) {
  char buf[64];
  size_t len = 0;
  CHECK_OK(pdx_session_id("10.0.0.1", 17000, buf, sizeof buf, &len));
  CHECK_STR(buf, "10.0.0.1:17000");
  CHECK(len == strlen("10.0.0.1:17000"));
  CHECK_OK(pdx_session_id("::1", 15001, buf, sizeof buf, NULL));
  CHECK_STR(buf, "[::1]:15001");
  CHECK_OK(pdx_session_id("[fe80::1]", 1, buf, sizeof buf, NULL));
  CHECK_STR(buf, "[fe80::1]:1");
  CHECK_OK(pdx_session_id("host.example", 2, NULL, 0, &len)); /* length only */
  CHECK(len == strlen("host.example:2"));
  char tiny[5];
  CHECK_OK(pdx_session_id("abcdef", 9, tiny, sizeof tiny, &len)); /* truncated, terminated */
  CHECK_STR(tiny, "abcd");
  CHECK(len == 8);
  /* Errors leave the buffer alone. */
  strcpy(buf, "untouched");
  len = 77;
  CHECK_STATUS(pdx_session_id(NULL, 1, buf, sizeof buf, &len), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_session_id("", 1, buf, sizeof buf, &len), PDX_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(pdx_session_id("[]", 1, buf, sizeof buf, &len), PDX_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(pdx_session_id("\xff", 1, buf, sizeof buf, &len), PDX_ERR_INVALID_UTF8);
  CHECK_STATUS(pdx_session_id("h", 1, NULL, 8, &len), PDX_ERR_NULL_ARGUMENT);
  CHECK_STR(buf, "untouched");
  CHECK(len == 77);
}

int main(void) {
  test_session_id();
  test_protocol_resolution();
  test_forced_tcp();
  test_ascend();
  test_transport_bad_arguments();
  test_ib_config();
  test_ib_validation();
  return pdx_test_finish("test_transport");
}
