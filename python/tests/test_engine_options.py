"""Engine options through ctypes: keyword arguments on pdx.Engine, one engine
per GPU over an 8-GPU mapping, SGLang's remote-instance rule, and the
protocol default that follows MOONCAKE_PROTOCOL."""

import json

import pytest

import pdx

ENV = (
    "MC_FORCE_TCP",
    "MOONCAKE_PROTOCOL",
    "MOONCAKE_DEVICE",
    "ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE",
    "ASCEND_NPU_PHY_ID",
    "PDX_TCP_ENGINE",
    "PDX_MIN_PORT",
    "PDX_MAX_PORT",
)

MAP = {str(g): f"mlx5_{g},mlx5_{g + 8}" for g in range(8)}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["inline", "file"])
def mapping(request, tmp_path):
    text = json.dumps(MAP)
    if request.param == "inline":
        return text, "entry {g} of the inline per-GPU JSON mapping"
    path = tmp_path / "ib.json"
    path.write_text(text)
    return str(path), f"entry {{g}} of the per-GPU mapping in {path}"


def test_each_gpu_gets_its_entry(mapping):
    device, entry = mapping
    engines = [pdx.Engine("127.0.0.1", "tcp", device, gpu_id=g) for g in range(8)]
    try:
        for g, e in enumerate(engines):
            assert e.device == f"mlx5_{g},mlx5_{g + 8}"
            assert entry.format(g=g) in e.transport_reason
            c = pdx.resolve_transport_with("10.0.0.9", None, device, gpu_id=g)
            assert (c.protocol, c.device) == ("rdma", f"mlx5_{g},mlx5_{g + 8}")
            assert entry.format(g=g) in c.reason
            assert pdx.resolve_transport("10.0.0.9", None, device, g).device == c.device
    finally:
        for e in engines:
            e.close()
    with pytest.raises(pdx.PdxError) as err:
        pdx.Engine("127.0.0.1", "tcp", device, gpu_id=8)
    assert err.value.status == pdx.PDX_ERR_VALUE_ERROR
    assert err.value.message == "No IB devices configured for GPU 8. Available GPUs: [0, 1, 2, 3, 4, 5, 6, 7]"


def test_mooncake_device_only_under_the_remote_instance_rule(monkeypatch):
    monkeypatch.setenv("MOONCAKE_DEVICE", "mlx5_3")
    assert pdx.resolve_transport_with("h", gpu_id=1).device == ""
    c = pdx.resolve_transport_with("h", device_source="remote_instance")
    assert c.device == "mlx5_3"
    assert "from MOONCAKE_DEVICE" in c.reason
    assert pdx.resolve_transport_with("h", device="mlx5_5", device_source="remote_instance").device == "mlx5_5"
    with pdx.Engine("127.0.0.1", "tcp", device_source="remote_instance") as e:
        assert e.device == "mlx5_3"


def test_options_win_over_their_variables(monkeypatch):
    monkeypatch.setenv("PDX_MIN_PORT", "21200")
    monkeypatch.setenv("PDX_MAX_PORT", "21300")
    with pdx.Engine("127.0.0.1", "tcp", min_port=23500, max_port=23599, tcp_lanes=8, gpu_id=None) as e:
        assert 23500 <= e.rpc_port <= 23599
    with pdx.Engine("127.0.0.1", "tcp") as e:
        assert 21200 <= e.rpc_port <= 21300


def test_unknown_keys_and_bad_values_name_the_key():
    with pytest.raises(pdx.PdxError) as err:
        pdx.Engine("127.0.0.1", "tcp", lanes=4)
    assert err.value.status == pdx.PDX_ERR_UNKNOWN_KEY
    assert err.value.message.startswith("unknown engine option 'lanes'; known options: gpu_id, device_source, ")
    with pytest.raises(pdx.PdxError) as err:
        pdx.Engine("127.0.0.1", "tcp", tcp_lanes=0)
    assert err.value.status == pdx.PDX_ERR_INVALID_VALUE
    assert err.value.message == "invalid value for engine option 'tcp_lanes': '0'; allowed values: an integer 1..=64"


def test_default_protocol_follows_mooncake_protocol(monkeypatch):
    """SGLang's engine has no protocol parameter: it always follows
    MOONCAKE_PROTOCOL (mooncake_transfer_engine.py, `initialize`)."""
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    with pdx.Engine("127.0.0.1") as e:
        assert e.protocol == "tcp"
        assert "protocol 'tcp' from MOONCAKE_PROTOCOL" in e.transport_reason
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "carrier-pigeon")
    with pytest.raises(pdx.PdxError) as err:
        pdx.Engine("127.0.0.1")
    assert err.value.status == pdx.PDX_ERR_UNKNOWN_PROTOCOL
    assert "(from MOONCAKE_PROTOCOL)" in err.value.message


def test_args_hand_over_the_shared_engine_device():
    with pdx.Args() as a:
        a["--mooncake-ib-device"] = json.dumps({"0": "mlx5_0", "1": "mlx5_1"})
        device = a["shared_engine_ib_device"]
        a["disaggregation_ib_device"] = "mlx5_7"
        assert a["shared_engine_ib_device"] == "mlx5_7"
    with pdx.Engine("127.0.0.1", "tcp", device, gpu_id=1) as e:
        assert e.device == "mlx5_1"
