"""A pdx target engine in a process of its own, driven line by line (JSON on
stdin, one JSON answer per line on stdout) by test_same_host_device.py: it
owns "device memory" of the CUDA driver stand-in (PDX_CUDA_LIB) and host
memory, registers them, fills them with seeded bytes, digests them and
reports the stand-in's counters of this process. Not a test itself."""

import ctypes
import dataclasses
import hashlib
import json
import random
import sys

import pdx

from test_cuda import Driver


@dataclasses.dataclass
class Area:
    dev: int | None
    addr: int
    buf: bytearray | None


def main() -> None:
    import os

    cuda = Driver(os.environ["PDX_CUDA_LIB"])
    cuda.lib.cuda_double_inject.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    areas: dict[int, Area] = {}
    with pdx.Engine("127.0.0.1", "tcp") as engine:
        print(json.dumps({"session": engine.session_id}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            out: dict = {}
            if op == "alloc":
                n, dev = cmd["n"], cmd.get("dev")
                if dev is None:
                    buf = bytearray(n)
                    addr = engine.register_at(buf, location="cpu:0")
                else:
                    buf, addr = None, cuda.alloc(dev, n)
                    engine.register_at(addr, n, f"cuda:{dev}")
                areas[addr] = Area(dev, addr, buf)
                out = {"addr": addr}
            elif op in ("fill", "digest"):
                a, off, n = areas[cmd["area"]], cmd.get("off", 0), cmd["n"]
                if op == "fill":
                    data = random.Random(cmd["seed"]).randbytes(n)
                    if a.buf is None:
                        cuda.put(a.dev, a.addr + off, data)
                    else:
                        a.buf[off:off + n] = data
                else:
                    data = cuda.get(a.dev, a.addr + off, n) if a.buf is None else bytes(a.buf[off:off + n])
                    out = {"sha": hashlib.sha256(data).hexdigest()}
            elif op == "stats":
                s = cuda.stats()
                out = {name: getattr(s, name) for name, _ in s._fields_ if name != "copies_by_device"}
            elif op == "inject":
                cuda.lib.cuda_double_inject(cmd["what"].encode(), cmd["after"], cmd["count"], cmd["code"])
            elif op == "quit":
                break
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
