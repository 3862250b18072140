/* pdx_args, pdx_normalize_args and messages through the C ABI. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>

#include "harness.h"

static const char *get(const pdx_args *a, const char *key) {
  const char *out = "(unset)";
  pdx_status st = pdx_args_get(a, key, &out);
  return st == PDX_OK ? out : "(error)";
}

static void test_lifecycle_and_bad_handles(void) {
  CHECK_STATUS(pdx_args_new(NULL), PDX_ERR_NULL_ARGUMENT);
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  CHECK(a != NULL);

  /* NULL handle, garbage handle, freed handle. */
  CHECK_STATUS(pdx_args_set(NULL, "port", "1"), PDX_ERR_NULL_ARGUMENT);
  pdx_args *garbage = (pdx_args *)(uintptr_t)0x1234560;
  CHECK_STATUS(pdx_args_set(garbage, "port", "1"), PDX_ERR_INVALID_HANDLE);
  CHECK_STATUS(pdx_normalize_args(garbage), PDX_ERR_INVALID_HANDLE);
  CHECK(pdx_args_message_count(garbage) == 0);
  pdx_args_free(garbage); /* ignored, no crash */
  pdx_args_free(NULL);

  const char *out = (const char *)&out; /* sentinel */
  const char *sentinel = out;
  CHECK_STATUS(pdx_args_get(a, NULL, &out), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_args_get(a, "port", NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_args_get(a, "model_path", &out), PDX_ERR_UNKNOWN_KEY);
  CHECK(out == sentinel); /* out-params untouched on error */

  /* Invalid UTF-8 in key and value. */
  CHECK_STATUS(pdx_args_set(a, "\xff\xfe", "x"), PDX_ERR_INVALID_UTF8);
  CHECK_STATUS(pdx_args_set(a, "disaggregation_ib_device", "mlx\xc3"), PDX_ERR_INVALID_UTF8);

  pdx_args_free(a);
  CHECK_STATUS(pdx_args_set(a, "port", "1"), PDX_ERR_INVALID_HANDLE);
  CHECK_STATUS(pdx_args_get(a, "port", &out), PDX_ERR_INVALID_HANDLE);
  CHECK(pdx_args_message(a, 0, NULL) == NULL);
  pdx_args_free(a); /* double free is ignored */
}

static void test_set_get(void) {
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  CHECK_STR(get(a, "disaggregation_mode"), "null");
  CHECK_STR(get(a, "--disaggregation-transfer-backend"), "mooncake");
  CHECK_STR(get(a, "disaggregation_ib_device"), NULL);
  CHECK_STR(get(a, "pdx_rules"), "default");

  CHECK_OK(pdx_args_set(a, "--disaggregation-mode", "decode"));
  CHECK_OK(pdx_args_set(a, "enable_hisparse", "YES"));
  CHECK_STR(get(a, "enable_hisparse"), "true");
  CHECK_OK(pdx_args_set(a, "--data-parallel-size", "4"));
  CHECK_STR(get(a, "dp_size"), "4");
  CHECK_OK(pdx_args_set(a, "max_running_requests", "64"));
  CHECK_OK(pdx_args_set(a, "max_running_requests", NULL));
  CHECK_STR(get(a, "max_running_requests"), NULL);

  /* The same string stays valid across gets of other keys. */
  const char *mode = NULL;
  CHECK_OK(pdx_args_get(a, "disaggregation_mode", &mode));
  CHECK_STR(get(a, "dp_size"), "4");
  CHECK_STR(mode, "decode");

  CHECK_STATUS(pdx_args_set(a, "disaggregation_transfer_backend", "rdma"), PDX_ERR_INVALID_VALUE);
  CHECK_LAST_ERROR("invalid value for disaggregation_transfer_backend (--disaggregation-transfer-backend): "
                   "'rdma'; allowed values: mooncake, nixl, ascend, fake, mori, mooncake_tcp");
  CHECK_STATUS(pdx_args_set(a, "dp_size", "two"), PDX_ERR_INVALID_VALUE);
  CHECK_LAST_ERROR("invalid value for dp_size (--dp-size): 'two'; expected a decimal integer");
  CHECK_STATUS(pdx_args_set(a, "disaggregation_mode", NULL), PDX_ERR_INVALID_VALUE);
  CHECK_STATUS(pdx_args_set(a, "enable_hisparse", "on"), PDX_ERR_INVALID_VALUE);
  CHECK_STR(get(a, "dp_size"), "4"); /* failed sets change nothing */

  CHECK_STATUS(pdx_add_transfer_backend_choice(NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_STATUS(pdx_add_transfer_backend_choice(""), PDX_ERR_INVALID_VALUE);
  CHECK_STATUS(pdx_args_set(a, "disaggregation_transfer_backend", "c_plugin"), PDX_ERR_INVALID_VALUE);
  CHECK_OK(pdx_add_transfer_backend_choice("c_plugin"));
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "c_plugin"));
  pdx_args_free(a);
}

static void test_parse_argv(void) {
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  const char *argv[] = {"sglang", "--model-path", "/m", "--disaggregation-mode=prefill",
                        "--disaggregation-transfer-backend", "nixl", "--enable-dp-attention",
                        "--tp", "8"};
  CHECK_OK(pdx_args_parse_argv(a, 9, argv));
  CHECK_STR(get(a, "disaggregation_mode"), "prefill");
  CHECK_STR(get(a, "disaggregation_transfer_backend"), "nixl");
  CHECK_STR(get(a, "enable_dp_attention"), "true");

  const char *missing[] = {"--disaggregation-mode", "decode", "--dp-size"};
  CHECK_STATUS(pdx_args_parse_argv(a, 3, missing), PDX_ERR_INVALID_VALUE);
  /* argparse names the action as server_args.py at 6076066e3 declares it (line 5192-5193). */
  CHECK_LAST_ERROR("argument --data-parallel-size/--dp-size: expected one argument");
  CHECK_STR(get(a, "disaggregation_mode"), "prefill"); /* all-or-nothing */

  CHECK_STATUS(pdx_args_parse_argv(a, -1, argv), PDX_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(pdx_args_parse_argv(a, 2, NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK_OK(pdx_args_parse_argv(a, 0, NULL));
  const char *with_null[] = {"--port", NULL};
  CHECK_STATUS(pdx_args_parse_argv(a, 2, with_null), PDX_ERR_NULL_ARGUMENT);
  const char *bad_utf8[] = {"--disaggregation-ib-device", "\xc3\x28"};
  CHECK_STATUS(pdx_args_parse_argv(a, 2, bad_utf8), PDX_ERR_INVALID_UTF8);
  pdx_args_free(a);
}

static const char *INFO_LINE =
    "disaggregation transfer backend 'mooncake_tcp' -> mooncake with MC_FORCE_TCP=1 (TCP transport, no RDMA)";

static void test_mooncake_tcp_alias(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("SGLANG_DISAGG_STAGING_BUFFER");
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  const char *argv[] = {"--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
                        "mooncake_tcp", "--disaggregation-ib-device", "mlx5_0",
                        "--disaggregation-decode-enable-radix-cache"};
  CHECK_OK(pdx_args_parse_argv(a, 7, argv));
  CHECK(pdx_args_message_count(a) == 0);
  CHECK_OK(pdx_normalize_args(a));
  CHECK_STR(get(a, "disaggregation_transfer_backend"), "mooncake");
  CHECK_STR(get(a, "disaggregation_ib_device"), NULL);
  CHECK_STR(get(a, "disable_radix_cache"), "false");
  CHECK_STR(get(a, "load_balance_method"), "round_robin");
  CHECK_STR(getenv("MC_FORCE_TCP"), "1");

  CHECK(pdx_args_message_count(a) == 3);
  int32_t level = -1;
  CHECK_STR(pdx_args_message(a, 0, &level), "MC_FORCE_TCP=1 set in the process environment (it was unset)");
  CHECK(level == PDX_LOG_INFO);
  CHECK_STR(pdx_args_message(a, 1, &level), INFO_LINE);
  CHECK(level == PDX_LOG_INFO);
  CHECK_STR(pdx_args_message(a, 2, &level), "EXPERIMENTAL: Radix cache is enabled for decode server");
  CHECK(level == PDX_LOG_WARNING);
  level = -1;
  CHECK(pdx_args_message(a, 3, &level) == NULL);
  CHECK(strstr(pdx_last_error_message(), "out of range") != NULL);
  CHECK(level == -1);
  CHECK(pdx_args_message(a, 0, NULL) != NULL);
  pdx_args_free(a);

  /* setdefault: an existing value is kept, and reported. */
  setenv("MC_FORCE_TCP", "0", 1);
  CHECK_OK(pdx_args_new(&a));
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "mooncake_tcp"));
  CHECK_OK(pdx_normalize_args(a));
  CHECK_STR(getenv("MC_FORCE_TCP"), "0");
  CHECK(pdx_args_message_count(a) == 2);
  const char *prefix = "MC_FORCE_TCP is already set to \"0\"; kept (setdefault).";
  CHECK(strncmp(pdx_args_message(a, 0, &level), prefix, strlen(prefix)) == 0);
  CHECK(level == PDX_LOG_WARNING);
  CHECK_STR(pdx_args_message(a, 1, NULL), INFO_LINE);
  pdx_args_free(a);
  unsetenv("MC_FORCE_TCP");
}

static void test_rule_errors(void) {
  unsetenv("MC_FORCE_TCP");
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  CHECK_OK(pdx_args_set(a, "disaggregation_mode", "decode"));
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "mooncake_tcp"));
  CHECK_OK(pdx_args_set(a, "disaggregation_decode_enable_radix_cache", "true"));
  CHECK_OK(pdx_args_set(a, "enable_hisparse", "true"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("--disaggregation-decode-enable-radix-cache is incompatible with --enable-hisparse");
  /* Nothing changed: not the args, not the environment. */
  CHECK_STR(get(a, "disaggregation_transfer_backend"), "mooncake_tcp");
  CHECK(getenv("MC_FORCE_TCP") == NULL);
  /* What SGLang logged before it raised: the alias's line, no MC_FORCE_TCP line. */
  CHECK(pdx_args_message_count(a) == 1);
  CHECK_STR(pdx_args_message(a, 0, NULL), INFO_LINE);

  CHECK_OK(pdx_args_set(a, "enable_hisparse", "false"));
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "fake"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("--disaggregation-decode-enable-radix-cache currently requires "
                   "--disaggregation-transfer-backend in ('nixl', 'mooncake'), but got 'fake'");
  CHECK_OK(pdx_args_set(a, "pdx_rules", "2026-07"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("--disaggregation-decode-enable-radix-cache is incompatible with "
                   "--disaggregation-transfer-backend fake");

  CHECK_OK(pdx_args_set(a, "disaggregation_mode", "prefill"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_ASSERTION);
  CHECK_LAST_ERROR("Prefill server does not support 'fake' as the transfer backend");
  CHECK(pdx_args_message_count(a) == 0); /* nothing logged before this one */

  setenv("SGLANG_DISAGG_STAGING_BUFFER", "1", 1);
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "mori"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' "
                   "or 'nixl', got 'mori'.");
  unsetenv("SGLANG_DISAGG_STAGING_BUFFER");
  CHECK_OK(pdx_normalize_args(a));
  CHECK_STR(get(a, "load_balance_method"), "follow_bootstrap_room");
  CHECK_STR(get(a, "disable_cuda_graph"), "false"); /* 2026-07 rules */
  pdx_args_free(a);
}

static void test_extra_slots_2026_07(void) {
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  CHECK_OK(pdx_args_set(a, "pdx_rules", "2026-07"));
  CHECK_OK(pdx_args_set(a, "disaggregation_mode", "decode"));
  CHECK_OK(pdx_args_set(a, "max_running_requests", "64"));
  CHECK_OK(pdx_args_set(a, "dp_size", "2"));
  CHECK_OK(pdx_normalize_args(a));
  CHECK_STR(get(a, "disaggregation_decode_extra_slots"), "64");
  CHECK_STR(get(a, "disable_radix_cache"), "true");
  CHECK(pdx_args_message_count(a) == 1);
  CHECK_STR(pdx_args_message(a, 0, NULL), "KV cache is forced as chunk cache for decode server");
  pdx_args_free(a);
}

/* pdx_rules=2026-09: decode context parallel, then SGLANG_RUST_SERVER. */
static void test_rules_2026_09(void) {
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  CHECK_OK(pdx_args_set(a, "pdx_rules", "2026-09"));
  CHECK_OK(pdx_args_set(a, "disaggregation_mode", "decode"));
  CHECK_OK(pdx_args_set(a, "--decode-context-parallel-size", "2"));
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "mori"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, or fake for "
                   "synthetic benchmarking, got 'mori'.");
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "fake"));
  CHECK_OK(pdx_args_set(a, "enable_hierarchical_cache", "true"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("PD decode DCP currently requires chunk cache; --enable-hierarchical-cache is not supported.");

  setenv("SGLANG_RUST_SERVER", "true", 1);
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "mooncake"));
  CHECK_OK(pdx_args_set(a, "disaggregation_mode", "prefill"));
  CHECK_OK(pdx_args_set(a, "port", "31000"));
  CHECK_OK(pdx_normalize_args(a));
  CHECK_STR(get(a, "disaggregation_bootstrap_port"), "31000");
  CHECK(pdx_args_message_count(a) == 2);
  int32_t level = 0;
  CHECK_STR(pdx_args_message(a, 0, &level),
            "DCP on a PD prefill server is supported when prefill and decode use the same DCP layout, but it "
            "usually adds communication overhead without improving prefill performance.");
  CHECK(level == PDX_LOG_WARNING);
  CHECK_STR(pdx_args_message(a, 1, &level),
            "SGLANG_RUST_SERVER: KV bootstrap registry is served on the api port; "
            "disaggregation_bootstrap_port 8998 -> 31000");
  CHECK(level == PDX_LOG_INFO);
  CHECK_OK(pdx_args_set(a, "disaggregation_bootstrap_port", "9000"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("SGLANG_RUST_SERVER serves the PD KV bootstrap registry on the api port itself; "
                   "--disaggregation-bootstrap-port 9000 conflicts with --port 31000. Drop "
                   "--disaggregation-bootstrap-port (decode nodes and the PD router must then target the prefill "
                   "api port).");
  CHECK(pdx_args_message_count(a) == 1); /* the DCP note, logged before the refusal */
  CHECK_STR(pdx_args_message(a, 0, &level),
            "DCP on a PD prefill server is supported when prefill and decode use the same DCP layout, but it "
            "usually adds communication overhead without improving prefill performance.");
  CHECK_STR(get(a, "disaggregation_bootstrap_port"), "9000");
  /* The 2026-07 rules never read SGLANG_RUST_SERVER. */
  CHECK_OK(pdx_args_set(a, "pdx_rules", "2026-07"));
  CHECK_OK(pdx_normalize_args(a));
  CHECK_STR(get(a, "disaggregation_bootstrap_port"), "9000");
  unsetenv("SGLANG_RUST_SERVER");
  pdx_args_free(a);
}

/* pdx_rules=2026-10 (sglang 0.5.23): the lines logged before a refusal are
 * the messages after it, in SGLang's order; the arguments and the
 * environment are as they were, and strings from pdx_args_get stay valid. */
static void test_messages_before_a_refusal_2026_10(void) {
  unsetenv("MC_FORCE_TCP");
  unsetenv("SGLANG_DISAGG_STAGING_BUFFER");
  unsetenv("SGLANG_RUST_SERVER");
  const char *dcp_note = "DCP on a PD prefill server is supported when prefill and decode use the same DCP layout, "
                         "but it usually adds communication overhead without improving prefill performance.";
  pdx_args *a = NULL;
  CHECK_OK(pdx_args_new(&a));
  CHECK_OK(pdx_args_set(a, "pdx_rules", "2026-10"));
  CHECK_OK(pdx_args_set(a, "disaggregation_mode", "prefill"));
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "mooncake_tcp"));
  CHECK_OK(pdx_args_set(a, "dcp_size", "2"));
  CHECK_OK(pdx_normalize_args(a));
  CHECK(pdx_args_message_count(a) == 3); /* pdx's MC_FORCE_TCP line, the alias, the DCP note */
  unsetenv("MC_FORCE_TCP");
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "mooncake_tcp"));
  CHECK_OK(pdx_args_set(a, "disaggregation_decode_host_receive_threshold", "1.5"));
  const char *backend = get(a, "disaggregation_transfer_backend");
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("--disaggregation-decode-host-receive-threshold must be between 0 and 1");
  CHECK(pdx_args_message_count(a) == 2);
  int32_t level = -1;
  CHECK_STR(pdx_args_message(a, 0, &level), INFO_LINE);
  CHECK(level == PDX_LOG_INFO);
  CHECK_STR(pdx_args_message(a, 1, &level), dcp_note);
  CHECK(level == PDX_LOG_WARNING);
  CHECK(pdx_args_message(a, 2, NULL) == NULL);
  CHECK(getenv("MC_FORCE_TCP") == NULL);
  CHECK_STR(backend, "mooncake_tcp"); /* still valid: the arguments did not change */

  /* The prefill's fake assertion after the DCP note. */
  CHECK_OK(pdx_args_set(a, "disaggregation_decode_host_receive_threshold", "1.0"));
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "fake"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_ASSERTION);
  CHECK(pdx_args_message_count(a) == 1);
  CHECK_STR(pdx_args_message(a, 0, NULL), dcp_note);

  /* A decode server's radix line, then the staging refusal. */
  setenv("SGLANG_DISAGG_STAGING_BUFFER", "1", 1);
  CHECK_OK(pdx_args_set(a, "disaggregation_mode", "decode"));
  CHECK_OK(pdx_args_set(a, "disaggregation_transfer_backend", "mori"));
  CHECK_STATUS(pdx_normalize_args(a), PDX_ERR_VALUE_ERROR);
  CHECK_LAST_ERROR("SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' "
                   "or 'nixl', got 'mori'.");
  CHECK(pdx_args_message_count(a) == 1);
  CHECK_STR(pdx_args_message(a, 0, &level), "Radix cache is disabled for decode server");
  CHECK(level == PDX_LOG_WARNING);
  unsetenv("SGLANG_DISAGG_STAGING_BUFFER");

  /* A bad handle changes nothing; a later success replaces the lines. */
  CHECK_STATUS(pdx_normalize_args(NULL), PDX_ERR_NULL_ARGUMENT);
  CHECK(pdx_args_message_count(a) == 1);
  CHECK_OK(pdx_normalize_args(a));
  CHECK(pdx_args_message_count(a) == 1);
  CHECK_STR(pdx_args_message(a, 0, NULL), "Radix cache is disabled for decode server");
  CHECK_STR(get(a, "disable_radix_cache"), "true");
  pdx_args_free(a);
}

int main(void) {
  test_lifecycle_and_bad_handles();
  test_set_get();
  test_parse_argv();
  test_mooncake_tcp_alias();
  test_rule_errors();
  test_extra_slots_2026_07();
  test_rules_2026_09();
  test_messages_before_a_refusal_2026_10();
  return pdx_test_finish("test_args");
}
