"""Shared pieces of the interop peers: data patterns, buffers and the command loop.

A peer is a standalone process that owns one transfer engine (Mooncake's or
pdx's) and is driven by JSON lines on stdin, answering with JSON lines on
stdout. The protocol is the same for every engine kind, so tests can run the
same scenario with any initiator and any target.

Request:  {"id": 7, "cmd": "fill", "buf": 1, "offset": 0, "len": 4096, "seed": 3}
Reply:    {"id": 7, "ok": true, "result": {...}}
          {"id": 7, "ok": false, "error": "text"}

Data is never shipped through the pipe in bulk: both sides regenerate it from
a seed. `stream(seed, pos, n)` is an endless deterministic byte stream per
seed; `fill` writes stream bytes into a buffer and `verify` compares a buffer
range with them, so a 256 MiB transfer is checked without moving 256 MiB
through JSON.

This module is imported by the peer processes and by the test driver (which
uses `stream` to build expected hashes of scattered batch results).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import mmap
import os
import random
import signal
import sys
import traceback

CHUNK = 1 << 20  # the stream is generated in 1 MiB chunks, each from its own PRNG


@functools.lru_cache(maxsize=8)
def _chunk(seed: int, index: int) -> bytes:
    return random.Random((seed << 40) ^ index).randbytes(CHUNK)


def stream_pieces(seed: int, pos: int, n: int):
    """Yield the bytes of stream(seed)[pos:pos+n] in pieces of at most CHUNK bytes."""
    if seed < 0 or pos < 0 or n < 0:
        raise ValueError("seed, pos and n must be >= 0")
    end = pos + n
    while pos < end:
        index, inner = divmod(pos, CHUNK)
        take = min(CHUNK - inner, end - pos)
        yield _chunk(seed, index)[inner : inner + take]
        pos += take


def stream(seed: int, pos: int, n: int) -> bytes:
    """Bytes [pos, pos+n) of the deterministic random stream for `seed`."""
    return b"".join(stream_pieces(seed, pos, n))


def const_pieces(byte: int, n: int):
    block = bytes([byte]) * min(n, CHUNK)
    while n > 0:
        take = min(n, CHUNK)
        yield block[:take]
        n -= take


# --------------------------------------------------------------------------
# process plumbing


def protect_stdout():
    """Keep fd 1 for JSON replies only.

    Native code (glog, Rust logging, printf) writes to fd 1 or 2 directly. The
    reply channel is moved to a private duplicate of fd 1, and fd 1 itself is
    pointed at stderr, so nothing but our replies can reach the driver's pipe.
    """
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(reply_fd, "w", buffering=1, encoding="utf-8")


def die_with_parent():
    """Ask the kernel to kill this peer if the driver dies (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # pragma: no cover - best effort
        pass
    expected = os.environ.get("INTEROP_PARENT_PID")
    if expected and os.getppid() != int(expected):
        os._exit(3)  # the parent died before prctl took effect


def log(*args):
    print("[peer %d]" % os.getpid(), *args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# buffers


class Buffer:
    def __init__(self, size: int):
        if size <= 0:
            raise ValueError("buffer size must be > 0")
        self.size = size
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._anchor = ctypes.c_char.from_buffer(self.map)
        self.addr = ctypes.addressof(self._anchor)
        self.view = memoryview(self.map)
        # offset -> length of the ranges registered with the engine
        self.registered: dict[int, int] = {}

    def check_range(self, offset: int, length: int):
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"range [{offset}, {offset}+{length}) outside buffer of {self.size} bytes")

    def close(self):
        self.view.release()
        del self._anchor
        self.map.close()


class PeerBase:
    """Command dispatcher. Subclasses implement the engine-specific `eng_*` methods."""

    kind = "?"

    def __init__(self):
        self.buffers: dict[int, Buffer] = {}
        self.next_buf = 1

    # ---- engine hooks (overridden) ----
    def eng_session(self) -> str: ...
    def eng_rpc_port(self) -> int: ...
    def eng_protocol(self) -> str: ...
    def eng_register(self, addr: int, length: int) -> dict: ...
    def eng_unregister(self, addr: int) -> dict: ...
    def eng_batch_register(self, addrs, lens) -> dict: ...
    def eng_batch_unregister(self, addrs) -> dict: ...
    def eng_transfer(self, op, target, local, remote, length, notify) -> dict: ...
    def eng_batch(self, op, target, locals_, remotes, lens, notify) -> dict: ...
    def eng_probe(self, target) -> dict: ...
    def eng_notify(self, target, name, msg) -> dict: ...
    def eng_notifies(self) -> list: ...
    def eng_notifies_bytes(self) -> list: ...
    def eng_close(self): ...

    # ---- helpers ----
    def buf(self, args) -> Buffer:
        try:
            return self.buffers[int(args["buf"])]
        except KeyError:
            raise ValueError(f"unknown buffer {args.get('buf')}")

    def _range(self, args):
        b = self.buf(args)
        offset = int(args.get("offset", 0))
        length = int(args["len"]) if args.get("len") is not None else b.size - offset
        b.check_range(offset, length)
        return b, offset, length

    # ---- commands ----
    def cmd_hello(self, a):
        return {
            "kind": self.kind,
            "pid": os.getpid(),
            "session": self.eng_session(),
            "rpc_port": self.eng_rpc_port(),
            "protocol": self.eng_protocol(),
        }

    def cmd_session(self, a):
        return {"session": self.eng_session()}

    def cmd_alloc(self, a):
        b = Buffer(int(a["size"]))
        bid = self.next_buf
        self.next_buf += 1
        self.buffers[bid] = b
        result = {"buf": bid, "addr": b.addr, "size": b.size}
        if a.get("register", True):
            r = self.eng_register(b.addr, b.size)
            result["register"] = r
            if r["rc"] == 0:
                b.registered[0] = b.size
            else:
                self.buffers.pop(bid)
                b.close()
                raise RuntimeError(f"register_memory failed: {r}")
        return result

    def cmd_register(self, a):
        b, offset, length = self._range(a)
        r = self.eng_register(b.addr + offset, length)
        if r["rc"] == 0:
            b.registered[offset] = length
        return r

    def cmd_unregister(self, a):
        b = self.buf(a)
        offset = int(a.get("offset", 0))
        r = self.eng_unregister(b.addr + offset)
        if r["rc"] == 0:
            b.registered.pop(offset, None)
        return r

    def cmd_batch_register(self, a):
        b = self.buf(a)
        ranges = [(int(o), int(n)) for o, n in a["ranges"]]
        for o, n in ranges:
            b.check_range(o, n)
        r = self.eng_batch_register([b.addr + o for o, _ in ranges], [n for _, n in ranges])
        if r["rc"] == 0:
            for o, n in ranges:
                b.registered[o] = n
        return r

    def cmd_batch_unregister(self, a):
        b = self.buf(a)
        offsets = [int(o) for o in a["offsets"]]
        r = self.eng_batch_unregister([b.addr + o for o in offsets])
        if r["rc"] == 0:
            for o in offsets:
                b.registered.pop(o, None)
        return r

    def cmd_free(self, a):
        b = self.buf(a)
        for offset in list(b.registered):
            self.eng_unregister(b.addr + offset)
        self.buffers.pop(int(a["buf"]))
        b.close()
        return {}

    @staticmethod
    def _pieces(a, offset: int, length: int):
        """The expected bytes of a range: stream(seed)[pos:pos+len] (pos defaults to offset) or a constant byte."""
        if "byte" in a:
            return const_pieces(int(a["byte"]), length)
        return stream_pieces(int(a["seed"]), int(a.get("pos", offset)), length)

    def cmd_fill(self, a):
        """Fill a range with the bytes `_pieces` describes."""
        b, offset, length = self._range(a)
        pieces = self._pieces(a, offset, length)
        at = offset
        for piece in pieces:
            b.view[at : at + len(piece)] = piece
            at += len(piece)
        return {}

    def cmd_verify(self, a):
        """Compare a range with the bytes `_pieces` describes."""
        b, offset, length = self._range(a)
        pieces = self._pieces(a, offset, length)
        at = offset
        for piece in pieces:
            got = b.view[at : at + len(piece)]
            if got != piece:
                got = bytes(got)
                i = next(i for i in range(len(piece)) if got[i] != piece[i])
                mismatches = sum(1 for x, y in zip(got, piece) if x != y)
                return {
                    "equal": False,
                    "first_mismatch": at - offset + i,
                    "got": got[i : i + 16].hex(),
                    "want": piece[i : i + 16].hex(),
                    "mismatches_in_chunk": mismatches,
                }
            at += len(piece)
        return {"equal": True, "first_mismatch": None}

    def cmd_sha256(self, a):
        b, offset, length = self._range(a)
        return {"sha256": hashlib.sha256(b.view[offset : offset + length]).hexdigest()}

    def cmd_write_bytes(self, a):
        data = bytes.fromhex(a["hex"])
        b = self.buf(a)
        offset = int(a.get("offset", 0))
        b.check_range(offset, len(data))
        b.view[offset : offset + len(data)] = data
        return {}

    def cmd_read_bytes(self, a):
        b, offset, length = self._range(a)
        return {"hex": bytes(b.view[offset : offset + length]).hex()}

    @staticmethod
    def _note(value):
        """A notification's name or message: text, or bytes sent as {"hex": ...}."""
        return bytes.fromhex(value["hex"]) if isinstance(value, dict) else str(value)

    def _notify_arg(self, a):
        n = a.get("notify")
        return None if n is None else (self._note(n[0]), self._note(n[1]))

    def cmd_transfer(self, a):
        """One transfer: op "write" (local -> remote) or "read" (remote -> local)."""
        op = a["op"]
        if op not in ("write", "read"):
            raise ValueError(f"bad op {op!r}")
        b = self.buf(a)
        local_offset, length = int(a["local_offset"]), int(a["len"])
        if not a.get("unchecked"):
            b.check_range(local_offset, length)
        return self.eng_transfer(
            op, a["target"], b.addr + local_offset, int(a["remote_addr"]), length, self._notify_arg(a)
        )

    def cmd_batch(self, a):
        """A batch: entries is a list of [local_offset, remote_addr, len]."""
        op = a["op"]
        if op not in ("write", "read"):
            raise ValueError(f"bad op {op!r}")
        b = self.buf(a)
        locals_, remotes, lens = [], [], []
        for local_offset, remote, length in a["entries"]:
            local_offset, remote, length = int(local_offset), int(remote), int(length)
            b.check_range(local_offset, length)
            locals_.append(b.addr + local_offset)
            remotes.append(remote)
            lens.append(length)
        return self.eng_batch(op, a["target"], locals_, remotes, lens, self._notify_arg(a))

    def cmd_probe(self, a):
        return self.eng_probe(a["target"])

    def cmd_notify(self, a):
        return self.eng_notify(a["target"], self._note(a["name"]), self._note(a["msg"]))

    def cmd_notifies(self, a):
        return {"notifies": [list(pair) for pair in self.eng_notifies()]}

    def cmd_notifies_bytes(self, a):
        """Drain, every name and message as hex of the bytes the engine holds."""
        return {"notifies": [[n.hex(), m.hex()] for n, m in self.eng_notifies_bytes()]}

    def cmd_sleep(self, a):
        """For harness tests: block the command loop."""
        import time

        time.sleep(float(a["seconds"]))
        return {}

    def cmd_stdout_noise(self, a):
        """For harness tests: native-style writes to fd 1 must not reach the reply pipe."""
        os.write(1, b"noise on fd 1\n")
        print("noise on sys.stdout")
        return {}

    def cmd_env(self, a):
        return {"value": os.environ.get(a["name"])}

    # ---- loop ----
    def serve(self, out):
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            rid = None
            try:
                req = json.loads(line)
                rid = req.get("id")
                cmd = req.get("cmd")
                if cmd == "quit":
                    out.write(json.dumps({"id": rid, "ok": True, "result": {}}) + "\n")
                    out.flush()
                    break
                handler = getattr(self, "cmd_" + str(cmd), None)
                if handler is None:
                    raise ValueError(f"unknown command {cmd!r}")
                reply = {"id": rid, "ok": True, "result": handler(req)}
            except Exception as exc:  # report, keep serving
                log("command failed:", traceback.format_exc())
                reply = {"id": rid, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
        self.eng_close()


def run(make_peer):
    """Entry point of a peer process: `make_peer()` builds the engine after stdout is protected."""
    out = protect_stdout()
    die_with_parent()
    try:
        peer = make_peer()
    except Exception as exc:
        log("startup failed:", traceback.format_exc())
        out.write(json.dumps({"id": 0, "ok": False, "error": f"startup: {type(exc).__name__}: {exc}"}) + "\n")
        out.flush()
        return 2
    # The first line announces readiness and identity.
    out.write(json.dumps({"id": 0, "ok": True, "result": peer.cmd_hello({})}) + "\n")
    out.flush()
    peer.serve(out)
    out.close()
    # Skip interpreter teardown: native engines with threads may not like it.
    sys.stderr.flush()
    os._exit(0)
