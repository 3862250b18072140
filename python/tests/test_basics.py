import tomllib
from pathlib import Path

import pdx


def test_version_matches_cargo_toml():
    cargo = tomllib.loads((Path(__file__).resolve().parents[2] / "Cargo.toml").read_text())
    assert pdx.version() == f"pdx/{cargo['package']['version']}"


def test_status_strings():
    assert pdx.status_str(0) == "ok"
    assert pdx.status_str(pdx.PDX_ERR_TIMEOUT) == "deadline exceeded"
    assert pdx.status_str(-12345) == "unknown status code"


def test_last_error_empty_before_any_failure():
    # The last error is per thread: a thread that never failed sees "".
    import threading

    seen = []
    t = threading.Thread(target=lambda: seen.append(pdx.last_error()))
    t.start()
    t.join()
    assert seen == [""]
