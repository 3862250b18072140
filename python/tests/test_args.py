"""pdx_args / pdx_normalize_args through ctypes (python/pdx/)."""

import ctypes

import pytest

import pdx

_libc = ctypes.CDLL(None)
_libc.getenv.restype = ctypes.c_char_p
_libc.getenv.argtypes = [ctypes.c_char_p]

INFO_LINE = "disaggregation transfer backend 'mooncake_tcp' -> mooncake with MC_FORCE_TCP=1 (TCP transport, no RDMA)"


def c_getenv(name):
    """The C library's view (pdx writes with setenv; os.environ is a cached copy)."""
    raw = _libc.getenv(name.encode())
    return None if raw is None else raw.decode()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("MC_FORCE_TCP", "SGLANG_DISAGG_STAGING_BUFFER", "SGLANG_RUST_SERVER"):
        monkeypatch.delenv(name, raising=False)
    yield
    # pdx may have set MC_FORCE_TCP behind os.environ's back.
    monkeypatch.setenv("MC_FORCE_TCP", "x")
    monkeypatch.delenv("MC_FORCE_TCP")


def test_defaults_and_set_get():
    with pdx.Args() as a:
        assert a["disaggregation_mode"] == "null"
        assert a["--disaggregation-transfer-backend"] == "mooncake"
        assert a["disaggregation_ib_device"] is None
        a["enable_hisparse"] = "Y"
        assert a["enable_hisparse"] == "true"
        a["--data-parallel-size"] = 3
        assert a["dp_size"] == "3"
        a["max_running_requests"] = None
        assert a["max_running_requests"] is None


def test_bad_keys_and_values():
    a = pdx.Args()
    with pytest.raises(pdx.PdxError) as e:
        a.set("model_path", "x")
    assert e.value.status == pdx.PDX_ERR_UNKNOWN_KEY
    with pytest.raises(pdx.PdxError) as e:
        a.set("disaggregation_transfer_backend", "rdma")
    assert e.value.status == pdx.PDX_ERR_INVALID_VALUE
    assert e.value.message.endswith("'rdma'; allowed values: mooncake, nixl, ascend, fake, mori, mooncake_tcp")
    with pytest.raises(pdx.PdxError) as e:
        a.set("disaggregation_mode", None)
    assert e.value.status == pdx.PDX_ERR_INVALID_VALUE
    # Invalid UTF-8 straight through ctypes.
    assert lib_set(a, b"\xff", b"1") == pdx.PDX_ERR_INVALID_UTF8


def lib_set(a, key, value):
    return pdx.lib.pdx_args_set(a._h, key, value)


def test_freed_handle_is_refused():
    a = pdx.Args()
    h = a._h
    a.close()
    assert pdx.lib.pdx_args_set(h, b"port", b"1") == pdx.PDX_ERR_INVALID_HANDLE
    assert pdx.lib.pdx_normalize_args(h) == pdx.PDX_ERR_INVALID_HANDLE
    assert pdx.lib.pdx_args_message_count(h) == 0
    pdx.lib.pdx_args_free(h)  # second free is ignored


def test_mooncake_tcp_argv_normalizes_and_sets_env():
    a = pdx.Args(argv=["--model-path", "m", "--disaggregation-mode", "prefill",
                       "--disaggregation-transfer-backend=mooncake_tcp", "--disaggregation-ib-device", "mlx5_0"])
    msgs = a.normalize()
    assert a["disaggregation_transfer_backend"] == "mooncake"
    assert a["disaggregation_ib_device"] is None
    assert a["load_balance_method"] == "follow_bootstrap_room"
    assert a["disable_cuda_graph"] == "true"  # default (PR-time) rules
    assert c_getenv("MC_FORCE_TCP") == "1"
    assert msgs == [
        (pdx.PDX_LOG_INFO, "MC_FORCE_TCP=1 set in the process environment (it was unset)"),
        (pdx.PDX_LOG_INFO, INFO_LINE),
    ]


def test_mc_force_tcp_setdefault_keeps_existing(monkeypatch):
    monkeypatch.setenv("MC_FORCE_TCP", "0")
    a = pdx.Args(disaggregation_transfer_backend="mooncake_tcp")
    msgs = a.normalize()
    assert c_getenv("MC_FORCE_TCP") == "0"
    assert msgs[0][0] == pdx.PDX_LOG_WARNING
    assert msgs[0][1].startswith('MC_FORCE_TCP is already set to "0"; kept (setdefault).')
    assert msgs[1] == (pdx.PDX_LOG_INFO, INFO_LINE)


# SGLang's TestLoadBalanceMethod, through the C ABI.
@pytest.mark.parametrize("mode,expected", [("null", "round_robin"), ("prefill", "follow_bootstrap_room"),
                                           ("decode", "round_robin")])
def test_load_balance_defaults(mode, expected):
    a = pdx.Args(disaggregation_mode=mode)
    a.normalize()
    assert a["load_balance_method"] == expected


def test_decode_radix_cache_rejects_hisparse():
    a = pdx.Args(disaggregation_mode="decode", disaggregation_transfer_backend="nixl",
                 disaggregation_decode_enable_radix_cache=True, enable_hisparse=True)
    with pytest.raises(pdx.PdxError) as e:
        a.normalize()
    assert e.value.status == pdx.PDX_ERR_VALUE_ERROR
    assert e.value.message == "--disaggregation-decode-enable-radix-cache is incompatible with --enable-hisparse"


@pytest.mark.parametrize("rules,message", [
    ("default", "--disaggregation-decode-enable-radix-cache currently requires --disaggregation-transfer-backend "
                "in ('nixl', 'mooncake'), but got 'fake'"),
    ("2026-07", "--disaggregation-decode-enable-radix-cache is incompatible with --disaggregation-transfer-backend fake"),
])
def test_decode_radix_cache_rejects_fake_backend(rules, message):
    a = pdx.Args(pdx_rules=rules, disaggregation_mode="decode", disaggregation_transfer_backend="fake",
                 disaggregation_decode_enable_radix_cache=True)
    with pytest.raises(pdx.PdxError) as e:
        a.normalize()
    assert (e.value.status, e.value.message) == (pdx.PDX_ERR_VALUE_ERROR, message)


@pytest.mark.parametrize("rules", ["default", "2026-07", "2026-09", "2026-10", "latest"])
def test_decode_radix_cache_allows_mooncake_tcp(rules):
    a = pdx.Args(pdx_rules=rules, disaggregation_mode="decode", disaggregation_transfer_backend="mooncake_tcp",
                 disaggregation_decode_enable_radix_cache=True)
    a.normalize()
    assert a["disable_radix_cache"] == "false"
    assert a["disaggregation_transfer_backend"] == "mooncake"


def test_prefill_fake_is_assertion_error_and_atomic():
    a = pdx.Args(disaggregation_mode="prefill", disaggregation_transfer_backend="fake")
    with pytest.raises(pdx.PdxError) as e:
        a.normalize()
    assert e.value.status == pdx.PDX_ERR_ASSERTION
    assert e.value.message == "Prefill server does not support 'fake' as the transfer backend"
    assert a["load_balance_method"] == "auto"
    assert a.messages() == []


def test_staging_env_check(monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGG_STAGING_BUFFER", "true")
    a = pdx.Args(disaggregation_mode="decode", disaggregation_transfer_backend="mori")
    with pytest.raises(pdx.PdxError) as e:
        a.normalize()
    assert e.value.message == ("SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' "
                               "or 'nixl', got 'mori'.")
    monkeypatch.setenv("SGLANG_DISAGG_STAGING_BUFFER", "maybe")
    msgs = a.normalize()
    assert (pdx.PDX_LOG_WARNING, 'Invalid value for SGLANG_DISAGG_STAGING_BUFFER: "maybe" is not a valid boolean '
                                 'value, using default "False"') in msgs


@pytest.mark.parametrize("mrr,dp,slots", [(64, 2, "64"), (64, 1, "0"), (1, 4, "0"), (None, 1, "0")])
def test_extra_slots_2026_07(mrr, dp, slots):
    a = pdx.Args(pdx_rules="2026-07", disaggregation_mode="decode", max_running_requests=mrr, dp_size=dp)
    a.normalize()
    assert a["disaggregation_decode_extra_slots"] == slots


DCP_BACKEND = ("PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, or fake for synthetic "
               "benchmarking, got 'mori'.")
DCP_RADIX = "PD decode DCP currently requires chunk cache; --disaggregation-decode-enable-radix-cache is not supported."
DCP_HICACHE = "PD decode DCP currently requires chunk cache; --enable-hierarchical-cache is not supported."


@pytest.mark.parametrize("fields,message", [
    (dict(disaggregation_transfer_backend="mori", disaggregation_decode_enable_radix_cache=True,
          enable_hierarchical_cache=True), DCP_BACKEND),
    (dict(disaggregation_decode_enable_radix_cache=True, enable_hisparse=True, enable_hierarchical_cache=True),
     DCP_RADIX),
    (dict(disaggregation_transfer_backend="fake", enable_hierarchical_cache=True), DCP_HICACHE),
])
def test_2026_09_decode_dcp_rules_in_order(fields, message):
    a = pdx.Args(pdx_rules="2026-09", disaggregation_mode="decode", dcp_size=2, **fields)
    with pytest.raises(pdx.PdxError) as e:
        a.normalize()
    assert (e.value.status, e.value.message) == (pdx.PDX_ERR_VALUE_ERROR, message)
    if message == DCP_HICACHE:
        # The older rule sets do not have these rules.
        for rules in ("default", "2026-07"):
            a.set("pdx_rules", rules)
            assert a.normalize() == [(pdx.PDX_LOG_WARNING, "KV cache is forced as chunk cache for decode server")]


def test_2026_09_dcp_prefill_warning_and_alias_first():
    a = pdx.Args(["--pdx-rules", "2026-09", "--disaggregation-mode", "prefill", "--decode-context-parallel-size", "4"])
    assert a.normalize() == [(pdx.PDX_LOG_WARNING, "DCP on a PD prefill server is supported when prefill and decode "
                              "use the same DCP layout, but it usually adds communication overhead without improving "
                              "prefill performance.")]
    a = pdx.Args(pdx_rules="2026-09", disaggregation_mode="decode", dcp_size=4,
                 disaggregation_transfer_backend="mooncake_tcp")
    a.normalize()
    assert a["disaggregation_transfer_backend"] == "mooncake"


def test_2026_09_rust_server_bootstrap_port(monkeypatch):
    monkeypatch.setenv("SGLANG_RUST_SERVER", "1")
    a = pdx.Args(pdx_rules="2026-09", disaggregation_mode="prefill", port=31000)
    assert a.normalize() == [(pdx.PDX_LOG_INFO, "SGLANG_RUST_SERVER: KV bootstrap registry is served on the api port; "
                                                "disaggregation_bootstrap_port 8998 -> 31000")]
    assert a["disaggregation_bootstrap_port"] == "31000"
    a = pdx.Args(pdx_rules="2026-09", disaggregation_mode="prefill", disaggregation_bootstrap_port=9000)
    with pytest.raises(pdx.PdxError) as e:
        a.normalize()
    assert (e.value.status, e.value.message) == (pdx.PDX_ERR_VALUE_ERROR, (
        "SGLANG_RUST_SERVER serves the PD KV bootstrap registry on the api port itself; "
        "--disaggregation-bootstrap-port 9000 conflicts with --port 30000. Drop --disaggregation-bootstrap-port "
        "(decode nodes and the PD router must then target the prefill api port)."))
    assert a["disaggregation_bootstrap_port"] == "9000"
    a.set("pdx_rules", "2026-07")
    assert a.normalize() == []
    monkeypatch.setenv("SGLANG_RUST_SERVER", "maybe")
    a = pdx.Args(pdx_rules="2026-09", disaggregation_mode="prefill", disaggregation_bootstrap_port=9000)
    assert a.normalize() == [(pdx.PDX_LOG_WARNING, 'Invalid value for SGLANG_RUST_SERVER: "maybe" is not a valid '
                                                   'boolean value, using default "False"')]


def test_2026_09_argv_abbreviations_follow_that_commits_option_list():
    # `--dcp` is `--dcp-size` under 2026-07, but SGLang 77e0052 added two
    # more `--dcp-*` options: argparse's ambiguity error, nothing changed.
    a = pdx.Args()
    a.parse_argv(["--pdx-rules", "2026-07", "--dcp", "3"])
    assert a["dcp_size"] == "3"
    a = pdx.Args()
    with pytest.raises(pdx.PdxError) as e:
        a.parse_argv(["--pdx-rules", "2026-09", "--dcp", "2"])
    assert (e.value.status, e.value.message) == (
        pdx.PDX_ERR_INVALID_VALUE,
        "ambiguous option: --dcp could match --dcp-size, --dcp-comm-backend, --dcp-replicate-q-proj")
    assert (a["dcp_size"], a["pdx_rules"]) == ("1", "default")
    a.parse_argv(["--pdx-rules", "2026-09", "--decode-context", "2", "--enable-hier", "--disaggregation-boot=9000"])
    assert (a["dcp_size"], a["enable_hierarchical_cache"], a["disaggregation_bootstrap_port"], a["pdx_rules"]) == (
        "2", "true", "9000", "2026-09")


def test_parse_argv_missing_value_leaves_args_unchanged():
    a = pdx.Args()
    with pytest.raises(pdx.PdxError) as e:
        a.parse_argv(["--disaggregation-mode", "decode", "--disaggregation-transfer-backend"])
    assert e.value.message == "argument --disaggregation-transfer-backend: expected one argument"
    assert a["disaggregation_mode"] == "null"


def test_plugin_backend_choice():
    a = pdx.Args()
    with pytest.raises(pdx.PdxError):
        a.set("disaggregation_transfer_backend", "py_plugin")
    pdx.add_transfer_backend_choice("py_plugin")
    a.set("disaggregation_transfer_backend", "py_plugin")
    assert a["disaggregation_transfer_backend"] == "py_plugin"


def test_every_config_function_is_declared():
    for name, restype, argtypes in pdx._CONFIG_SIGNATURES:
        fn = getattr(pdx.lib, name)
        assert fn.argtypes == argtypes and fn.restype == restype
    assert all(sig in pdx._SIGNATURES for sig in pdx._CONFIG_SIGNATURES)


def test_rules_2026_10_decode_text_and_latest():
    a = pdx.Args(pdx_rules="latest", disaggregation_mode="decode", dp_size=4, enable_dp_attention=True,
                 max_running_requests=64)
    assert a.get("pdx_rules") == "2026-10"
    assert a.normalize() == [(pdx.PDX_LOG_WARNING, "Radix cache is disabled for decode server")]
    assert (a["dp_size"], a["attn_dp_size"], a["disaggregation_decode_extra_slots"]) == ("1", "4", "32")
    assert a["ib_device_validated"] == "true"
    a = pdx.Args(["--pdx-rules", "2026-10", "--disaggregation-decode-host-receive-threshold", "2"])
    with pytest.raises(pdx.PdxError) as e:
        a.normalize()
    assert e.value.message == "--disaggregation-decode-host-receive-threshold must be between 0 and 1"


DCP_NOTE = ("DCP on a PD prefill server is supported when prefill and decode use the same DCP layout, but it usually "
            "adds communication overhead without improving prefill performance.")


@pytest.mark.parametrize("fields,env,error,lines", [
    ({"disaggregation_transfer_backend": "mooncake_tcp", "disaggregation_decode_host_receive_threshold": 1.5}, {},
     "--disaggregation-decode-host-receive-threshold must be between 0 and 1", [(20, INFO_LINE)]),
    ({"disaggregation_mode": "prefill", "dcp_size": 2, "disaggregation_transfer_backend": "fake"}, {},
     "Prefill server does not support 'fake' as the transfer backend", [(30, DCP_NOTE)]),
    ({"disaggregation_mode": "decode", "disaggregation_transfer_backend": "mori"},
     {"SGLANG_DISAGG_STAGING_BUFFER": "1"},
     "SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' or 'nixl', got 'mori'.",
     [(30, "Radix cache is disabled for decode server")]),
    ({"disaggregation_mode": "prefill", "dcp_size": 4, "disaggregation_transfer_backend": "mooncake_tcp",
      "disaggregation_bootstrap_port": 9000}, {"SGLANG_RUST_SERVER": "1"},
     "SGLANG_RUST_SERVER serves the PD KV bootstrap registry on the api port itself; --disaggregation-bootstrap-port "
     "9000 conflicts with --port 30000. Drop --disaggregation-bootstrap-port (decode nodes and the PD router must "
     "then target the prefill api port).", [(20, INFO_LINE), (30, DCP_NOTE)]),
])
def test_2026_10_refusal_keeps_the_lines_logged_before_it(monkeypatch, fields, env, error, lines):
    """sglang 0.5.23 logs these lines and then raises: after the refusal,
    `messages()` has them (SGLang's texts and order), and nothing else
    changed: neither the arguments nor MC_FORCE_TCP."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    a = pdx.Args(pdx_rules="2026-10", **fields)
    before = {key: a[key] for key in ("disaggregation_transfer_backend", "load_balance_method")}
    with pytest.raises(pdx.PdxError) as e:
        a.normalize()
    assert e.value.message == error
    assert a.messages() == lines
    assert {key: a[key] for key in before} == before
    assert c_getenv("MC_FORCE_TCP") is None


def test_check_efa_allocator(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", raising=False)
    monkeypatch.delenv("MOONCAKE_PROTOCOL", raising=False)
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)  # it would make the engine tcp
    pdx.check_efa_allocator()  # rdma by default: nothing to check
    with pytest.raises(pdx.PdxError) as e:
        pdx.check_efa_allocator("EFA")
    assert e.value.name == "PDX_ERR_VALUE_ERROR"
    assert e.value.message.startswith("PYTORCH_CUDA_ALLOC_CONF enables expandable_segments, which is incompatible")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "efa")
    monkeypatch.setenv("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "barex")
    with pytest.raises(pdx.PdxError):
        pdx.check_efa_allocator()  # 'barex' is not BAREX: the allocator rule still fires
    with pytest.raises(pdx.PdxError) as e:
        pdx.resolve_transport("127.0.0.1", "efa")
    assert "expandable_segments" in e.value.message
