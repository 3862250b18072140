"""Attacks on the same-host link's trust, run as root inside a fresh pid
namespace (`unshare --pid --fork --mount-proc`), so that pid numbers can be
reused on purpose (`/proc/sys/kernel/ns_last_pid`). test_same_host_attack.py
runs it; it prints one JSON line per scenario.

Each scenario has a pdx target (this process, root) with a registered region,
an attacker that speaks the data port's wire protocol itself (docs/wire.md),
and a bystander process whose memory the attacker must never reach:

- `claimed-uid`: a uid-65534 attacker claims uid 0 for a child that shares
  its sockets; the child exits and a uid-1000 bystander gets its pid.
- `reused-pid`: a root attacker, claiming its own uid, is granted the link;
  the child exits and a root bystander gets its pid.
- `setuid-exec`: a root attacker is granted the link; the child then execs a
  set-uid (uid 1000) program that keeps the sockets and the pid.

(In these three the root attacker answers the target's challenge for its
child by writing the nonce into the child's memory through /proc: root may.)

For each, two granted-or-not connections ask for one same-host read (region
to bystander) and one same-host write (bystander to region), the link's way:
a doorbell for a message in the ring, which the target reads from the process
it pinned (the child, gone or set-uid by then). The scenario reports what the
target answered, whether the bystander's secret reached the region and
whether the bystander's memory changed.

Three more, where the process named is the one whose memory is at stake:

- `inherited-socket`: a root process connects to the data port and forks;
  the child drops to uid 65534, keeps the socket and offers the link naming
  its parent (the probe address and bytes it knows from the fork), while
  the parent writes a secret after the fork. The child cannot write the
  target's nonce into its parent's memory.
- `scm-rights`: the same, but the uid-65534 process gets the socket from
  the root process over a Unix socket (SCM_RIGHTS), not by inheritance.
- `same-uid-control`: a process that names itself and writes the nonce into
  its own memory, as pdx does: granted, and its copies work (it lists its
  secret's buffer as registered, then asks through its ring).

Refused offers send request frames on the connection itself (the way pdx
once sent them): the target closes without serving them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYSTEM_PYTHON = "/usr/bin/python3"
HELLO_ADDR = b"pdxhello"
OP_HELLO, OP_LOCAL_READ, OP_LOCAL_WRITE = 0x50, 0x52, 0x53
REPLY_MAGIC, STATUS_MAGIC = 0x50445848, 0x4D435456
SECRET_LEN = 64

# The data port's hello and the same-host link, as an attacker speaks them
# (docs/wire.md): `hello` sends one request and reads one reply; `offer_link`
# sends an offer naming `ring` (a `Ring`: private anonymous memory of this
# process) and returns the target's answer, meeting a challenge with
# `write_nonce(bytes)` (which returns whether it wrote them) and "written"
# either way; the nonce becomes the ring's key. `Ring.post` writes one
# message into the ring, rings its doorbell and reads `answers` statuses.
HELLO = r'''
import ctypes, json, mmap, os, signal, socket, struct, sys, time
RING_LEN = 65536
KINDS = {"regions": (1, 16), "more-regions": (2, 16), "host": (3, 32), "device": (4, 96)}
def hello(sock, body):
    raw = json.dumps(body).encode()
    sock.sendall(struct.pack("<Q", len(raw)) + b"pdxhello" + bytes([0x50]) + bytes(7) + raw)
    prefix = recv_exact(sock, 8)
    if prefix is None or len(prefix) < 8:
        return None
    word = struct.unpack("<Q", prefix)[0]
    assert word >> 32 == 0x50445848, prefix
    return json.loads(recv_exact(sock, word & 0xffffffff))
class Ring:
    def __init__(self):
        self.mem = mmap.mmap(-1, RING_LEN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
        self.key, self.seq = bytes(16), 1
    def message(self, kind, entries, seq=None):
        code, size = KINDS[kind]
        return self.key + struct.pack("<QB3xI", self.seq if seq is None else seq, code, len(entries) // size) + entries
    def bell(self, length, seq=None):
        return struct.pack("<QQB7x", length, self.seq if seq is None else seq, 0x56)
    def post(self, sock, kind, entries, answers):
        m = self.message(kind, entries)
        self.mem[:len(m)] = m
        try:
            sock.sendall(self.bell(len(m)))
            self.seq += 1
            return [status(sock) for _ in range(answers)]
        except OSError:
            return [None] * answers
def host_frame(op, remote, size, local):
    return struct.pack("<QQB7xQ", size, remote, op, local)
def ranges(*pairs):
    return b"".join(struct.pack("<QQ", a, n) for a, n in pairs)
def offer_link(sock, instance, offer, write_nonce, ring):
    offer = dict(offer, nonce_proof=True, ring_addr=ring.addr, ring_len=RING_LEN)
    reply = hello(sock, {"instance": instance, "same_host": offer})
    challenged = reply is not None and "same_host_challenge" in reply
    wrote = None
    if challenged:
        nonce = bytes.fromhex(reply["same_host_challenge"])
        wrote = write_nonce(nonce)
        ring.key = nonce
        raw = json.dumps({"same_host_written": True}).encode()
        sock.sendall(struct.pack("<Q", len(raw)) + b"pdxhello" + bytes([0x50]) + bytes(7) + raw)
        prefix = recv_exact(sock, 8)
        reply = None if prefix is None else json.loads(recv_exact(sock, struct.unpack("<Q", prefix)[0] & 0xffffffff))
    answer = None if reply is None else reply.get("same_host_answer")
    return dict(answer or {"accepted": False, "reason": "closed"}, challenged=challenged, wrote=wrote)
def write_mem(pid, addr, data):
    try:
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as f:
            f.seek(addr)
            f.write(data)
        return True
    except OSError:
        return False
def instance_of(port):
    first = socket.create_connection(("127.0.0.1", port))
    instance = hello(first, {"instance": "0" * 32})["instance"]
    first.close()
    return instance
def status(sock):
    got = recv_exact(sock, 8)
    return None if got is None or len(got) < 8 else struct.unpack("<Q", got)[0]
def send_and_status(sock, raw):
    try:
        sock.sendall(raw)
        return status(sock)
    except OSError:
        return None
def frames(sock, todo):
    """The old way: request frames on the connection itself (one status each)."""
    return [send_and_status(sock, host_frame(op, remote, size, local)) for op, remote, size, local in todo]
def window(sock, ring, todo):
    """Requests through the ring: one message, one status each."""
    return ring.post(sock, "host", b"".join(host_frame(*t) for t in todo), len(todo))
def recv_exact(sock, n):
    got = b""
    while len(got) < n:
        try:
            part = sock.recv(n - len(got))
        except OSError:
            part = b""
        if not part:
            return None if not got else got
        got += part
    return got
def out(**kw):
    print(json.dumps(kw), flush=True)
'''

# The attacker: speaks the data port's protocol itself. Commands arrive as
# JSON lines on stdin; results go out as JSON lines on stdout.
ATTACKER = HELLO + r'''
port, claimed_uid, exec_argv = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
instance = instance_of(port)
probe = ctypes.create_string_buffer(os.urandom(16), 16)
rings = [Ring() for _ in range(2)]  # at the same addresses in the child
conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
for c in conns:
    os.set_inheritable(c.fileno(), True)
go_r, go_w = os.pipe()
child = os.fork()
if child == 0:
    os.close(go_w)
    os.read(go_r, 1)  # exec only once the link is up
    if exec_argv:
        os.execve(exec_argv[0], exec_argv, {"PDX_BYSTANDER_SECRET": sys.argv[4]})
    while True:
        time.sleep(60)
os.close(go_r)
offer = {
    "host": {
        "boot_id": open("/proc/sys/kernel/random/boot_id").read().strip(),
        "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
        "pid": child,
        "uid": claimed_uid,
    },
    "probe_addr": ctypes.addressof(probe),
    "probe": probe.raw.hex(),
}
# Root may write into its child's memory (the child has the probe at the
# same address, copied by fork): the named process "answers".
answers = [offer_link(c, instance, offer, lambda n: write_mem(child, ctypes.addressof(probe), n), r)
           for c, r in zip(conns, rings)]
out(answers=answers, child=child)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["do"] == "exec":
        os.write(go_w, b"x")
        out(exec=True)
    elif cmd["do"] == "kill":
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        out(freed=child)
    elif cmd["do"] == "frames":
        # The link's way (a message in the ring, which the target reads from
        # the process it pinned, here the child), one connection each.
        out(statuses=[window(c, r, [f])[0] for c, r, f in zip(conns, rings, cmd["frames"])])
    elif cmd["do"] == "exit":
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        break
'''

# The process whose memory is at stake names itself (by its child, or by a
# process it hands the socket to); argv: port, region base, mode
# ("inherited-socket", "scm-rights" or "same-uid-control"). It prints one
# JSON line: the answer and statuses the speaker saw, its secret (drawn after
# the fork) and that secret's bytes at the end.
VICTIM = HELLO + r'''
port, base, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
instance = instance_of(port)
probe = ctypes.create_string_buffer(os.urandom(16), 16)
secret = ctypes.create_string_buffer(64)
ring = Ring()
me = os.getpid()
offer = {
    "host": {
        "boot_id": open("/proc/sys/kernel/random/boot_id").read().strip(),
        "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
        "pid": me,
        "uid": os.geteuid(),
    },
    "probe_addr": ctypes.addressof(probe),
    "probe": probe.raw.hex(),
}
todo = [(0x53, base + 4096, 64, ctypes.addressof(secret)), (0x52, base, 64, ctypes.addressof(secret))]
def speak(sock, write_nonce):
    answer = offer_link(sock, instance, offer, write_nonce, ring)
    if not answer.get("accepted"):
        # Refused: the old way is all it has left (the connection closes).
        return {"answer": answer, "statuses": frames(sock, todo)}
    listed = ring.post(sock, "regions", ranges((ctypes.addressof(secret), 64)), 1)
    return {"answer": answer, "listed": listed, "statuses": window(sock, ring, todo)}
if mode == "same-uid-control":
    secret.raw = os.urandom(64)
    sock = socket.create_connection(("127.0.0.1", port))
    def own(n):
        ctypes.memmove(ctypes.addressof(probe), n, len(n))
        return True
    drawn = secret.raw.hex()
    got = speak(sock, own)
    out(secret=drawn, now=secret.raw.hex(), **got)
    sys.exit(0)
inherited = mode == "inherited-socket"
sock = socket.create_connection(("127.0.0.1", port)) if inherited else None
unix_a, unix_b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
go_r, go_w = os.pipe()
child = os.fork()
if child == 0:
    unix_a.close()
    os.close(go_w)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    if not inherited:
        _, fds, _, _ = socket.recv_fds(unix_b, 1, 1)
        sock = socket.socket(fileno=fds[0])
    os.read(go_r, 1)  # the parent's secret is in place
    # The best such a process can do: try to write the nonce into the
    # parent (the kernel refuses: another user), and claim it did.
    got = speak(sock, lambda n: write_mem(me, ctypes.addressof(probe), n))
    unix_b.sendall(json.dumps(got).encode() + b"\n")
    os._exit(0)
unix_b.close()
os.close(go_r)
if not inherited:
    sock = socket.create_connection(("127.0.0.1", port))
    socket.send_fds(unix_a, [b"x"], [sock.fileno()])
secret.raw = os.urandom(64)  # after the fork: the child never saw it
drawn = secret.raw.hex()
os.write(go_w, b"x")
line = b""
while not line.endswith(b"\n"):
    part = unix_a.recv(65536)
    if not part:
        break
    line += part
os.waitpid(child, 0)
got = json.loads(line) if line else {"answer": None, "statuses": []}
out(secret=drawn, now=secret.raw.hex(), **got)
'''

# The bystander: holds a secret of its own at an address it reports.
BYSTANDER = r'''
import ctypes, json, os, sys
secret = ctypes.create_string_buffer(os.urandom(64), 64)
print(json.dumps({"pid": os.getpid(), "addr": ctypes.addressof(secret), "secret": secret.raw.hex()}), flush=True)
sys.stdin.readline()
print(json.dumps({"now": secret.raw.hex()}), flush=True)
'''


def _data_port(engine) -> int:
    """The engine's data port: the listening socket of this process that
    answers a pdx hello, other than the handshake port."""
    rpc = engine.rpc_port
    mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if _is_link(f"/proc/self/fd/{fd}")}
    ports = []
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f"socket:[{f[9]}]" in mine:
            port = int(f[1].split(":")[1], 16)
            if port != rpc:
                ports.append(port)
    assert len(ports) == 1, ports
    return ports[0]


def _is_link(path: str) -> bool:
    try:
        os.readlink(path)
        return True
    except OSError:
        return False


def _send(proc: subprocess.Popen, **cmd) -> dict:
    proc.stdin.write(json.dumps(cmd) + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def _spawn_at(pid: int, argv: list[str], uid: int) -> subprocess.Popen:
    """Start `argv` as `uid` with pid `pid` (the namespace's next pid set first)."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, user=uid, group=uid,
                            cwd="/")


def _mem(pid: int, addr: int, n: int) -> bytes:
    with open(f"/proc/{pid}/mem", "rb") as f:
        f.seek(addr)
        return f.read(n)


def _find_in_stack(pid: int, needle: bytes) -> int:
    for line in open(f"/proc/{pid}/maps"):
        if line.rstrip().endswith("[stack]"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            at = _mem(pid, lo, hi - lo).find(needle)
            assert at >= 0, "secret not found in the program's stack"
            return lo + at
    raise AssertionError("no stack mapping")


def scenario(name: str, pdx, tmp: Path) -> dict:
    engine = pdx.Engine("127.0.0.1", "tcp")
    region = bytearray(b"R" * (1 << 20))
    base = engine.register(region)
    port = _data_port(engine)
    attacker_uid = 65534 if name == "claimed-uid" else 0
    bystander_uid = 0 if name == "reused-pid" else 1000
    exec_argv: list[str] = []
    secret_for_exec = os.urandom(SECRET_LEN // 2).hex()
    if name == "setuid-exec":
        helper = tmp / "sleeper"
        shutil.copy("/bin/sleep", helper)
        os.chown(helper, 1000, 1000)
        os.chmod(helper, 0o4755)
        exec_argv = [str(helper), "60"]
    attacker = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", ATTACKER, str(port), "0", json.dumps(exec_argv), secret_for_exec],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, user=attacker_uid, group=attacker_uid, cwd="/")
    first = json.loads(attacker.stdout.readline())
    answers, child = first["answers"], first["child"]
    bystander = None
    if name == "setuid-exec":
        _send(attacker, do="exec")
        # Wait until the child runs the set-uid program (its euid changes).
        for _ in range(20000):
            status = open(f"/proc/{child}/status").read()
            uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
            if uid_line.split()[2] == "1000" and "sleep" in open(f"/proc/{child}/comm").read():
                break
            time.sleep(0.001)
        victim_pid = child
        secret = secret_for_exec.encode()
        victim_addr = _find_in_stack(victim_pid, secret)
    else:
        freed = _send(attacker, do="kill")["freed"]
        bystander = _spawn_at(freed, [SYSTEM_PYTHON, "-c", BYSTANDER], bystander_uid)
        info = json.loads(bystander.stdout.readline())
        victim_pid, victim_addr, secret = info["pid"], info["addr"], bytes.fromhex(info["secret"])
        assert victim_pid == freed, (victim_pid, freed)
    n = len(secret)
    frames = [
        # Write: the target would pull the bystander's bytes into the region.
        (OP_LOCAL_WRITE, base + 4096, n, victim_addr),
        # Read: the target would push region bytes into the bystander.
        (OP_LOCAL_READ, base, n, victim_addr),
    ]
    statuses = _send(attacker, do="frames", frames=frames)["statuses"]
    if bystander is not None:
        bystander.stdin.write("dump\n")
        bystander.stdin.flush()
        now = bytes.fromhex(json.loads(bystander.stdout.readline())["now"])
        bystander.wait(timeout=10)
    else:
        now = _mem(victim_pid, victim_addr, n)
    _send_exit(attacker)
    engine.close()
    return {
        "scenario": name,
        "answers": answers,
        "statuses": [None if s is None else {"magic_ok": s >> 32 == STATUS_MAGIC, "code": s & 0xffffffff}
                     for s in statuses],
        "secret_reached_region": secret in bytes(region),
        "bystander_changed": now != secret,
    }


def victim_scenario(name: str, pdx) -> dict:
    """A root process whose memory is at stake (see VICTIM) against a root target."""
    engine = pdx.Engine("127.0.0.1", "tcp")
    region = bytearray(b"R" * (1 << 20))
    base = engine.register(region)
    port = _data_port(engine)
    p = subprocess.run([SYSTEM_PYTHON, "-c", VICTIM, str(port), str(base), name], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    engine.close()
    secret = bytes.fromhex(got["secret"])
    return {
        "scenario": name,
        "answers": [got["answer"]],
        "statuses": [None if s is None else {"magic_ok": s >> 32 == STATUS_MAGIC, "code": s & 0xffffffff}
                     for s in got["statuses"]],
        "listed": got.get("listed", []),
        "secret_reached_region": secret in bytes(region),
        "bystander_changed": bytes.fromhex(got["now"]) != secret,
    }


VICTIM_SCENARIOS = ["inherited-socket", "scm-rights", "same-uid-control"]


def _send_exit(attacker: subprocess.Popen) -> None:
    attacker.stdin.write(json.dumps({"do": "exit"}) + "\n")
    attacker.stdin.flush()
    attacker.wait(timeout=10)


def main() -> int:
    import pdx

    names = sys.argv[1:] or ["claimed-uid", "reused-pid", "setuid-exec", *VICTIM_SCENARIOS]
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        for name in names:
            if name in VICTIM_SCENARIOS:
                print(json.dumps(victim_scenario(name, pdx)), flush=True)
            else:
                print(json.dumps(scenario(name, pdx, Path(d))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
