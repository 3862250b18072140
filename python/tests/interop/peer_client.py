"""Driver side of the interop peers: start a peer process, send commands with a deadline.

    with Peer("mooncake", env={"MC_TCP_PROTO": "1"}) as p:
        buf = p.alloc(1 << 20)
        p.call("fill", buf=buf.id, seed=1)

Every call has a deadline. A peer that misses it, dies, or breaks the protocol
is killed and the call raises PeerError with the tail of the peer's log
(its stderr, where Mooncake's glog and pdx's logging end up). The process is
always killed on close(), on context exit, and when the object is collected.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {"mooncake": HERE / "mooncake_peer.py", "pdx": HERE / "pdx_peer.py"}

DEFAULT_TIMEOUT = 60.0
START_TIMEOUT = 60.0


class PeerError(RuntimeError):
    pass


class PeerCommandError(PeerError):
    """The peer answered ok=false (the peer is still alive)."""


@dataclass(frozen=True)
class Buf:
    id: int
    addr: int
    size: int


def _kill(proc: subprocess.Popen):
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream:
                stream.close()
        except OSError:
            pass


class Peer:
    def __init__(self, kind: str, env: dict | None = None, name: str | None = None,
                 start_timeout: float = START_TIMEOUT, *, command: list[str] | None = None,
                 drop_env: tuple[str, ...] = (), log_dir: Path | None = None,
                 wrapper: list[str] | None = None, python: str = sys.executable):
        """Start a peer: SCRIPTS[kind], or `command` (a script and its arguments)
        speaking the same protocol. `drop_env` names more variables to keep from
        it; with `log_dir` the log is written there as <name>.log and kept.
        `wrapper` runs it under another program (`unshare ...`, `setpriv ...`;
        its parent is then not this process) with the interpreter `python`."""
        if command is None and kind not in SCRIPTS:
            raise ValueError(f"unknown peer kind {kind!r}")
        self.kind = kind
        self.name = name or kind
        full_env = dict(os.environ)
        # Settings that would change the engines' behaviour must come from the test only.
        for var in ("MC_TCP_PROTO", "MC_USE_TENT", "MC_USE_TEV1", "MC_DISABLE_METACACHE", *drop_env):
            full_env.pop(var, None)
        full_env.update({k: str(v) for k, v in (env or {}).items()})
        if not wrapper:
            full_env["INTEROP_PARENT_PID"] = str(os.getpid())
        full_env["PYTHONUNBUFFERED"] = "1"
        self.env = full_env
        self._keep_log = log_dir is not None or os.environ.get("PDX_INTEROP_KEEP_LOGS") == "1"
        if log_dir is not None:
            self.log_path = Path(log_dir) / f"{self.name}.log"
            log_file = open(self.log_path, "wb")
        else:
            default_dir = Path(tempfile.gettempdir()) / "pdx-interop-logs"
            default_dir.mkdir(exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log", dir=default_dir)
            self.log_path = Path(path)
            log_file = os.fdopen(fd, "wb")
        self.proc = subprocess.Popen(
            [*(wrapper or []), python, *(command or [str(SCRIPTS[kind])])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            stderr=log_file,
            env=full_env,
            cwd=str(HERE),
        )
        log_file.close()
        self._finalizer = weakref.finalize(self, _kill, self.proc)
        self._buf = b""
        self._next_id = 1
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        os.set_blocking(self.proc.stdin.fileno(), False)
        try:
            hello = self._read_reply(0, time.monotonic() + start_timeout, "startup")
        except BaseException:
            self.close()
            raise
        self.info = hello
        self.session: str = hello["session"]
        self.rpc_port: int = int(hello["rpc_port"])
        self.pid: int = int(hello["pid"])

    # ---- plumbing ----
    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _fail(self, what: str) -> PeerError:
        _kill(self.proc)
        return PeerError(
            f"{self.name} (pid {self.proc.pid}): {what}; exit code {self.proc.returncode}\n"
            f"--- log tail {self.log_path} ---\n{self.log_tail()}"
        )

    def _read_line(self, deadline: float, what: str) -> bytes:
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"no reply to {what} before the deadline")
            if not self._sel.select(timeout=left):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise self._fail(f"peer closed its stdout during {what}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _read_reply(self, rid: int, deadline: float, what: str) -> dict:
        line = self._read_line(deadline, what)
        try:
            reply = json.loads(line)
        except ValueError:
            raise self._fail(f"non-JSON line on stdout during {what}: {line[:200]!r}")
        if reply.get("id") != rid:
            raise self._fail(f"reply id {reply.get('id')} != {rid} for {what}")
        if not reply.get("ok"):
            if rid == 0:
                raise self._fail(f"startup failed: {reply.get('error')}")
            raise PeerCommandError(f"{self.name}: {what} failed: {reply.get('error')}")
        return reply["result"]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, cmd: str, timeout: float = DEFAULT_TIMEOUT, **args) -> dict:
        """Send one command and wait for its reply for at most `timeout` seconds."""
        if not self.alive:
            raise self._fail(f"peer already exited before {cmd}")
        rid = self._next_id
        self._next_id += 1
        payload = (json.dumps({"id": rid, "cmd": cmd, **args}) + "\n").encode()
        deadline = time.monotonic() + timeout
        self._send(payload, deadline, cmd)
        return self._read_reply(rid, deadline, cmd)

    def _send(self, payload: bytes, deadline: float, what: str):
        """Write a request without ever blocking past the deadline (stdin is non-blocking)."""
        fd = self.proc.stdin.fileno()
        view = memoryview(payload)
        while view:
            try:
                n = os.write(fd, view)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            except OSError:
                raise self._fail(f"could not send {what}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"peer did not read {what} before the deadline")
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_WRITE)
                sel.select(timeout=min(left, 1.0))

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("quit", timeout=5)
                self.proc.wait(timeout=5)
            except (PeerError, subprocess.TimeoutExpired, OSError):
                pass
        self._finalizer()  # kills if still running, closes pipes
        try:
            self._sel.close()
        except Exception:
            pass
        if not self._keep_log:
            try:
                self.log_path.unlink()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- convenience ----
    def alloc(self, size: int, register: bool = True) -> Buf:
        r = self.call("alloc", size=size, register=register)
        return Buf(r["buf"], r["addr"], r["size"])

    @staticmethod
    def _range_args(buf: Buf, offset, length, seed, byte, pos) -> dict:
        args = {"buf": buf.id, "offset": offset, "len": length}
        if seed is not None:
            args["seed"] = seed
            if pos is not None:
                args["pos"] = pos
        else:
            args["byte"] = byte
        return args

    def fill(self, buf: Buf, offset: int = 0, length: int | None = None, *, seed: int | None = None,
             byte: int | None = None, pos: int | None = None, timeout: float = DEFAULT_TIMEOUT):
        self.call("fill", timeout=timeout, **self._range_args(buf, offset, length, seed, byte, pos))

    def verify(self, buf: Buf, offset: int = 0, length: int | None = None, *, seed: int | None = None,
               byte: int | None = None, pos: int | None = None, timeout: float = DEFAULT_TIMEOUT) -> dict:
        return self.call("verify", timeout=timeout, **self._range_args(buf, offset, length, seed, byte, pos))

    def sha256(self, buf: Buf, offset: int = 0, length: int | None = None,
               timeout: float = DEFAULT_TIMEOUT) -> str:
        return self.call("sha256", timeout=timeout, buf=buf.id, offset=offset, len=length)["sha256"]

    def transfer(self, op: str, target: "Peer | str", buf: Buf, local_offset: int, remote_addr: int,
                 length: int, notify: tuple[str, str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> dict:
        return self.call("transfer", timeout=timeout, op=op, target=_session(target), buf=buf.id,
                         local_offset=local_offset, remote_addr=remote_addr, len=length,
                         notify=[_wire(x) for x in notify] if notify else None)

    def batch(self, op: str, target: "Peer | str", buf: Buf, entries, notify=None,
              timeout: float = DEFAULT_TIMEOUT) -> dict:
        return self.call("batch", timeout=timeout, op=op, target=_session(target), buf=buf.id,
                         entries=[list(e) for e in entries], notify=[_wire(x) for x in notify] if notify else None)

    def probe(self, target: "Peer | str", timeout: float = DEFAULT_TIMEOUT) -> dict:
        return self.call("probe", timeout=timeout, target=_session(target))

    def notify(self, target: "Peer | str", name: str | bytes, msg: str | bytes,
               timeout: float = DEFAULT_TIMEOUT) -> dict:
        return self.call("notify", timeout=timeout, target=_session(target), name=_wire(name), msg=_wire(msg))

    def notifies_bytes(self) -> list[tuple[bytes, bytes]]:
        """The notifications received, each name and message as the engine holds its bytes."""
        return [(bytes.fromhex(n), bytes.fromhex(m)) for n, m in self.call("notifies_bytes")["notifies"]]

    def wait_notifies_bytes(self, count: int, timeout: float = 20.0) -> list[tuple[bytes, bytes]]:
        got: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + timeout
        while True:
            got += self.notifies_bytes()
            if len(got) >= count or time.monotonic() > deadline:
                return got
            time.sleep(0.02)

    def notifies(self) -> list[tuple[str, str]]:
        return [tuple(p) for p in self.call("notifies")["notifies"]]

    def wait_notifies(self, count: int, timeout: float = 20.0) -> list[tuple[str, str]]:
        """Drain notifications until at least `count` arrived or the deadline passes."""
        got: list[tuple[str, str]] = []
        deadline = time.monotonic() + timeout
        while True:
            got += self.notifies()
            if len(got) >= count or time.monotonic() > deadline:
                return got
            time.sleep(0.02)


def _wire(value):
    """A notification's name or message in a command: text as it is, bytes as {"hex": ...}."""
    return {"hex": bytes(value).hex()} if isinstance(value, (bytes, bytearray)) else value


def _session(target) -> str:
    return target.session if isinstance(target, Peer) else str(target)
