"""A forked child reusing its parent's accepted same-host link (issue 51's
reproductions), as processes of their own; test_same_host_reuse.py runs them
against a target engine of its own and checks what reached its region.

Each script is a root process whose memory is at stake. It links to the
target, forks, and writes a secret after the fork into memory it never
registered (`private`); the child, of another user (65534) or of the same
one, then tries to have the target copy that memory: into the target's
region (a pull), and region bytes over it (a push). The parent reports what
the child saw, whether its memory changed, and whether its own transfers
still run on the link afterwards. It prints one JSON line.

- `HAND_BUILT`: the link is built by hand, speaking the wire
  (same_host_attack.HELLO): one connection per attempt, each offered with a
  ring of its own, its registered memory listed (`mine` only) and one
  honest write through it. The child sends request frames on the connection
  itself (the way pdx once sent them), a doorbell for a message it wrote
  into its own copy of the ring (the next sequence number), and a doorbell
  replaying the last message. Last, the parent itself asks through its own
  ring for `private`, which it never listed.
- `PDX_API`: the link is pdx's own: a pdx engine writes a registered buffer
  to the target (on the link). The child calls pdx through its parent's
  engine handle naming `private` (both directions), then sends the request
  frame pdx once sent on the inherited connection itself.

argv: the target's session, its data port, the region's base address,
"other-user" or "same-user".
"""

from __future__ import annotations

from same_host_attack import HELLO

N = 64 << 10

# Shared by both: fork the child, run `attempt(child_result)` in it after
# the parent wrote its secret, collect what the child reports.
FORK = HELLO + r'''
N = 64 << 10
session, port, base, who = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
private = ctypes.create_string_buffer(N)  # never registered anywhere
pull_into = base + 2 * N  # where a pull would land in the target's region
def fork_child(attempt):
    """Run `attempt()` (a dict) in a child (uid 65534 for "other-user") once
    the parent's secret is in place; the parent's secret and the child's report."""
    go_r, go_w = os.pipe()
    back_r, back_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(go_w)
            if who == "other-user":
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            os.read(go_r, 1)
            report = attempt()
        except BaseException as e:  # reported, never raised in the child
            report = {"error": repr(e)}
        os.write(back_w, json.dumps(report).encode() + b"\n")
        os._exit(0)
    os.close(go_r)
    secret = os.urandom(N)
    ctypes.memmove(private, secret, N)  # after the fork: the child never saw it
    os.write(go_w, b"x")
    line = b""
    deadline = time.monotonic() + 60
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        part = os.read(back_r, 65536)
        if not part:
            break
        line += part
    try:
        os.kill(child, signal.SIGKILL)  # a child stuck past the deadline
    except ProcessLookupError:
        pass
    os.waitpid(child, 0)
    return secret, json.loads(line) if line.endswith(b"\n") else {"error": "no report within 60 s"}
'''

HAND_BUILT = FORK + r'''
instance = instance_of(port)
me = os.getpid()
mine = ctypes.create_string_buffer(os.urandom(N), N)  # the one registered buffer
probe = ctypes.create_string_buffer(16)
offer = {"host": {"boot_id": open("/proc/sys/kernel/random/boot_id").read().strip(),
                  "pid_ns": os.stat("/proc/self/ns/pid").st_ino, "pid": me, "uid": os.geteuid()},
         "probe_addr": ctypes.addressof(probe), "probe": probe.raw.hex()}
def own(n):
    ctypes.memmove(ctypes.addressof(probe), n, len(n))
    return True
def linked():
    """A connection linked by hand, its memory listed, one honest write done."""
    sock, ring = socket.create_connection(("127.0.0.1", port)), Ring()
    answer = offer_link(sock, instance, offer, own, ring)
    assert answer["accepted"] and answer.get("ring"), answer
    listed = ring.post(sock, "regions", ranges((ctypes.addressof(mine), N)), 1)
    honest = window(sock, ring, [(0x53, base, N, ctypes.addressof(mine))])
    return sock, ring, listed + honest
ways = ["frame on the connection", "doorbell, next message", "doorbell, replayed message"]
attempts = [(way, op) for way in ways for op in (0x53, 0x52)]
links = [linked() for _ in attempts]
honest_before = [s for _, _, statuses in links for s in statuses]
def attempt():
    seen = []
    for (way, op), (sock, ring, _) in zip(attempts, links):
        remote = pull_into if op == 0x53 else base
        frame = host_frame(op, remote, N, ctypes.addressof(private))
        if way == "frame on the connection":
            seen.append(send_and_status(sock, frame))
            continue
        # Its own copy of the ring holds what it writes; the target reads the parent's.
        seq = ring.seq if way == "doorbell, next message" else ring.seq - 1
        m = ring.message("host", frame, seq)
        ring.mem[:len(m)] = m
        seen.append(send_and_status(sock, ring.bell(len(m), seq)))
    return {"statuses": seen}
secret, report = fork_child(attempt)
# The honest path, afterwards: a fresh link, a write and a read through it.
sock, ring, honest_after = linked()
honest_after += window(sock, ring, [(0x52, base, N, ctypes.addressof(mine))])
# The second fence: the parent itself, through its own ring, naming memory
# it never listed (pdx never does): refused, nothing copied.
sock, ring, _ = linked()
unlisted = window(sock, ring, [(0x53, pull_into, N, ctypes.addressof(private))])
out(secret=secret.hex(), now=private.raw.hex(), child=report, attempts=[w for w, _ in attempts],
    honest_before=honest_before, honest_after=honest_after, unlisted=unlisted)
'''

PDX_API = FORK + r'''
import pdx
engine = pdx.Engine("127.0.0.1", "tcp")
mine = ctypes.create_string_buffer(os.urandom(N), N)
engine.register(ctypes.addressof(mine), N)
engine.write(session, ctypes.addressof(mine), base, N)
before = engine.peer_info(session)
def lane_sockets():
    """This process's sockets connected to the target's data port."""
    inodes = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if int(f[2].split(":")[1], 16) == port and f[3] == "01":
            inodes.add(f"socket:[{f[9]}]")
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in inodes:
                fds.append(int(fd))
        except OSError:
            pass
    return fds
def attempt():
    report = {"api": [], "wire": []}
    # Its own handles on the inherited connections (its pdx may close the
    # ones its lanes hold).
    kept = [os.dup(fd) for fd in inherited]
    # Through pdx's API, on its parent's engine handle.
    for name, call in [("write", lambda: engine.write(session, ctypes.addressof(private), pull_into, N)),
                       ("read", lambda: engine.read(session, ctypes.addressof(private), base, N))]:
        try:
            call()
            report["api"].append([name, "ok"])
        except Exception as e:
            report["api"].append([name, repr(e)])
    report["child_path"] = engine.peer_info(session).get("path")
    # On an inherited connection itself: the request frame pdx once sent.
    for fd in kept[:1]:
        sock = socket.socket(fileno=fd)
        sock.settimeout(5)
        # (Into another part of the region than the API's write.)
        frame = host_frame(0x53, pull_into + N, N, ctypes.addressof(private))
        report["wire"].append(send_and_status(sock, frame))
    return report
inherited = lane_sockets()
secret, report = fork_child(attempt)
# The honest path, afterwards: its own transfers, on the link.
engine.write(session, ctypes.addressof(mine), base, N)
back = ctypes.create_string_buffer(N)
engine.register(ctypes.addressof(back), N)
engine.read(session, ctypes.addressof(back), base, N)
after = engine.peer_info(session)
out(secret=secret.hex(), now=private.raw.hex(), child=report, inherited=len(inherited),
    path_before=before["path"], path_after=after["path"], reason=after["reason"],
    same_host_before=before["same_host_bytes_written"], same_host_after=after["same_host_bytes_written"],
    read_back=back.raw == mine.raw)
engine.close()
'''
