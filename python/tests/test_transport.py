"""pdx_resolve_transport and the IB device functions through ctypes."""

import json

import pytest

import pdx

ENV = ("MC_FORCE_TCP", "MOONCAKE_PROTOCOL", "ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "ASCEND_NPU_PHY_ID")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def test_default_protocol_is_rdma():
    c = pdx.resolve_transport("10.0.0.2", device="mlx5_0")
    assert (c.protocol, c.hostname, c.device, c.warnings) == ("rdma", "10.0.0.2", "mlx5_0", [])


def test_explicit_beats_mooncake_protocol(monkeypatch):
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "efa")
    assert pdx.resolve_transport("h").protocol == "efa"
    assert pdx.resolve_transport("h", protocol="tcp").protocol == "tcp"


def test_unknown_protocol_lists_known(monkeypatch):
    with pytest.raises(pdx.PdxError) as e:
        pdx.resolve_transport("h", protocol="udp")
    assert e.value.status == pdx.PDX_ERR_UNKNOWN_PROTOCOL
    assert "known protocols: rdma, efa, tcp, ascend" in e.value.message


@pytest.mark.parametrize("value,warns", [("1", False), ("0", True), ("false", True), ("", True)])
def test_mc_force_tcp_presence_forces_tcp(monkeypatch, value, warns):
    monkeypatch.setenv("MC_FORCE_TCP", value)
    c = pdx.resolve_transport("h", protocol="rdma", device="mlx5_0")
    assert (c.protocol, c.device) == ("tcp", "")
    assert bool(c.warnings) == warns
    assert "MC_FORCE_TCP" in c.reason


def test_ascend_hostname(monkeypatch):
    monkeypatch.setenv("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "1")
    c = pdx.resolve_transport("10.1.1.1", gpu_id=2)
    host, port, npu = c.hostname.split(":")
    assert (c.protocol, host, npu) == ("ascend", "10.1.1.1", "npu_2")
    assert 0 < int(port) < 65536
    monkeypatch.setenv("ASCEND_NPU_PHY_ID", "5")
    assert pdx.resolve_transport("10.1.1.1", gpu_id=2).hostname.endswith(":npu_5")


def test_parse_ib_device_config():
    assert pdx.parse_ib_device_config(None) is None
    assert pdx.parse_ib_device_config("   ") is None
    assert pdx.parse_ib_device_config(" mlx5_0,mlx5_1 ") == "mlx5_0,mlx5_1"
    assert pdx.parse_ib_device_config('{"1": "mlx5_1 ", "0": "mlx5_0"}') == {1: "mlx5_1", 0: "mlx5_0"}
    with pytest.raises(pdx.PdxError) as e:
        pdx.parse_ib_device_config('{"gpu0": "mlx5_0"}')
    assert e.value.status == pdx.PDX_ERR_VALUE_ERROR
    assert e.value.message.startswith("Invalid format: keys must be integers")


def test_get_ib_devices_for_gpu(tmp_path):
    f = tmp_path / "ib.json"
    f.write_text('{"0": "mlx5_0, mlx5_1", "1": "mlx5_2"}')
    assert pdx.get_ib_devices_for_gpu(str(f), 1) == "mlx5_2"
    with pytest.raises(pdx.PdxError) as e:
        pdx.get_ib_devices_for_gpu(str(f), 4)
    assert e.value.message == "No IB devices configured for GPU 4. Available GPUs: [0, 1]"
    with pytest.raises(pdx.PdxError) as e:
        pdx.get_ib_devices_for_gpu(str(tmp_path / "missing.json"), 0)
    assert e.value.status == pdx.PDX_ERR_RUNTIME


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "infiniband"
    for name in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"):
        (root / name).mkdir(parents=True)
    return str(root)


# SGLang's TestServerArgsIBDeviceValidation.
def test_validate_comma_list(sysfs):
    assert pdx.validate_ib_devices("mlx5_0, mlx5_1", sysfs) == ("mlx5_0,mlx5_1", [])


def test_validate_json_mapping(sysfs):
    out, _ = pdx.validate_ib_devices('{"0": "mlx5_0, mlx5_1", "1": "mlx5_2, mlx5_3"}', sysfs)
    assert json.loads(out) == {"0": "mlx5_0,mlx5_1", "1": "mlx5_2,mlx5_3"}
    assert out == '{"0":"mlx5_0,mlx5_1","1":"mlx5_2,mlx5_3"}'


def test_validate_json_file(sysfs, tmp_path):
    f = tmp_path / "map.json"
    f.write_text('{"0": "mlx5_0, mlx5_1", "1": "mlx5_2"}')
    out, _ = pdx.validate_ib_devices(str(f), sysfs)
    assert json.loads(out) == {"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}


def test_validate_errors_and_warnings(sysfs):
    assert pdx.validate_ib_devices(None, sysfs) == (
        None, [(pdx.PDX_LOG_WARNING, "No IB devices specified for Mooncake backend, falling back to auto discovery.")])
    out, msgs = pdx.validate_ib_devices("mlx5_3,mlx5_3", sysfs)
    assert out == "mlx5_3"
    assert msgs == [(pdx.PDX_LOG_WARNING,
                     "Duplicate IB devices specified for all GPUs: mlx5_3,mlx5_3. Deduplicating to: mlx5_3")]
    with pytest.raises(pdx.PdxError) as e:
        pdx.validate_ib_devices('{"0": "mlx5_0", "1": "ib9"}', sysfs)
    assert e.value.message == ("Invalid IB devices specified for GPU 1: ['ib9']. Available devices: "
                               "['mlx5_0', 'mlx5_1', 'mlx5_2', 'mlx5_3']")
    with pytest.raises(pdx.PdxError) as e:
        pdx.validate_ib_devices("mlx5_0", sysfs + "/nope")
    assert e.value.status == pdx.PDX_ERR_RUNTIME
    assert e.value.message.startswith("InfiniBand sysfs path not found: ")


def test_session_id_brackets_ipv6():
    assert pdx.session_id("10.0.0.1", 17000) == "10.0.0.1:17000"
    assert pdx.session_id("::1", 15001) == "[::1]:15001"
    assert pdx.session_id("[::1]", 15001) == "[::1]:15001"
    assert pdx.session_id("h" * 400, 1) == "h" * 400 + ":1"
    with pytest.raises(pdx.PdxError) as e:
        pdx.session_id("", 1)
    assert e.value.status == pdx.PDX_ERR_INVALID_ARGUMENT
