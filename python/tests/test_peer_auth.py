"""Peer authentication (issue 23): engines holding the same secret file work
both ways; an engine without it (or with another) can neither write, read nor
notify, and is told why; a secret file that is not private or too short
fails engine init naming the file."""

import os

import pytest

import pdx


def secret_file(tmp_path, name="secret", data=None, mode=0o600):
    path = tmp_path / name
    path.write_bytes(os.urandom(48) if data is None else data)
    path.chmod(mode)
    return str(path)


def test_same_secret_works_both_ways_and_strangers_are_refused(tmp_path):
    k = secret_file(tmp_path)
    with pdx.Engine("127.0.0.1", "tcp", peer_secret_file=k) as a, \
            pdx.Engine("127.0.0.1", "tcp", peer_secret_file=k) as b, \
            pdx.Engine("127.0.0.1", "tcp") as stranger, \
            pdx.Engine("127.0.0.1", "tcp", peer_secret_file=secret_file(tmp_path, "other")) as other:
        pool_a, pool_b = bytearray(4096), bytearray(4096)
        ra, rb = a.register(pool_a), b.register(pool_b)
        a.write(b.session_id, b"a" * 100, rb)
        b.write(a.session_id, b"b" * 100, ra)
        got = bytearray(100)
        a.read(b.session_id, got, rb)
        assert bytes(got) == b"a" * 100 and bytes(pool_a[:100]) == b"b" * 100
        a.notify(b.session_id, "n", "m")
        assert b.drain_notifications() == [("n", "m")]
        for e in (stranger, other):
            with pytest.raises(pdx.PdxError) as err:
                e.write(b.session_id, b"x" * 100, rb)
            assert err.value.status == pdx.PDX_ERR_PEER_UNREACHABLE
            assert "authentication failed" in str(err.value), err.value
            with pytest.raises(pdx.PdxError):
                e.read(b.session_id, got, rb)
            with pytest.raises(pdx.PdxError):
                e.notify(b.session_id, "n", "stranger")
            with pytest.raises(pdx.PdxError) as err:
                b.write(e.session_id, b"y", 4096)
            assert "authentication failed" in str(err.value), err.value
        assert bytes(pool_b[:100]) == b"a" * 100 and not any(pool_b[100:])
        assert b.drain_notifications() == []
        refused = [line for line in b.metrics_text().splitlines()
                   if line.startswith('pdx_inbound_connections_refused_total{reason="auth"}')]
        assert refused and int(refused[0].split()[-1]) >= 4, refused


@pytest.mark.parametrize("data,mode,why", [
    (b"k" * 48, 0o644, "readable by group or others"),
    (b"short secret\n", 0o600, "holds 12 bytes"),
])
def test_an_unfit_secret_file_fails_init_naming_it(tmp_path, data, mode, why):
    path = secret_file(tmp_path, data=data, mode=mode)
    with pytest.raises(pdx.PdxError) as err:
        pdx.Engine("127.0.0.1", "tcp", peer_secret_file=path)
    assert path in str(err.value) and why in str(err.value), err.value
