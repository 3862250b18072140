#!/usr/bin/env python3
"""One real Mooncake TransferEngine (PyPI wheel) in its own process, driven by JSON lines.

    MC_TCP_PROTO=1 python3 mooncake_peer.py   # v1 framing for transfers it initiates

The engine is initialized as `initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")`
with MC_FORCE_TCP=1. See peer_common.py for the command protocol. Every engine
call returns the wheel's own return code as "rc" (0 success, usually -1 failure).

The wheel has no stand-alone notify call: a notify travels with a transfer
(`transfer`/`batch` with "notify": [name, msg]), so the "notify" command is
refused here.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer_common  # noqa: E402

HOST = "127.0.0.1"


class MooncakePeer(peer_common.PeerBase):
    kind = "mooncake"

    def __init__(self):
        super().__init__()
        os.environ["MC_FORCE_TCP"] = "1"
        from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

        self.TransferNotify = TransferNotify
        self.opcodes = {"read": TransferOpcode.Read, "write": TransferOpcode.Write}
        self.engine = TransferEngine()
        rc = self.engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"TransferEngine.initialize returned {rc}")
        self.rpc_port = int(self.engine.get_rpc_port())

    def eng_session(self):
        return f"{HOST}:{self.rpc_port}"

    def eng_rpc_port(self):
        return self.rpc_port

    def eng_protocol(self):
        return "tcp"

    def eng_register(self, addr, length):
        return {"rc": int(self.engine.register_memory(addr, length))}

    def eng_unregister(self, addr):
        return {"rc": int(self.engine.unregister_memory(addr))}

    def eng_batch_register(self, addrs, lens):
        return {"rc": int(self.engine.batch_register_memory(list(addrs), list(lens)))}

    def eng_batch_unregister(self, addrs):
        return {"rc": int(self.engine.batch_unregister_memory(list(addrs)))}

    def eng_transfer(self, op, target, local, remote, length, notify):
        if notify is not None:
            rc = self.engine.transfer_sync(
                target, local, remote, length, self.opcodes[op], self.TransferNotify(*notify)
            )
        elif op == "write":
            rc = self.engine.transfer_sync_write(target, local, remote, length)
        else:
            rc = self.engine.transfer_sync_read(target, local, remote, length)
        return {"rc": int(rc)}

    def eng_batch(self, op, target, locals_, remotes, lens, notify):
        if notify is not None:
            rc = self.engine.batch_transfer_sync(
                target, locals_, remotes, lens, self.opcodes[op], self.TransferNotify(*notify)
            )
        elif op == "write":
            rc = self.engine.batch_transfer_sync_write(target, locals_, remotes, lens)
        else:
            rc = self.engine.batch_transfer_sync_read(target, locals_, remotes, lens)
        return {"rc": int(rc)}

    def eng_probe(self, target):
        return {"rc": int(self.engine.send_probe(target))}

    def eng_notify(self, target, name, msg):
        raise NotImplementedError("the Mooncake wheel sends notifies only with a transfer")

    def eng_notifies(self):
        return [(n.name, n.msg) for n in self.engine.get_notifies()]

    def eng_notifies_bytes(self):
        # The wheel holds a std::string; its getter decodes it as UTF-8 and,
        # for bytes that are not UTF-8, raises with those bytes in `.object`.
        def raw(note, field):
            try:
                return getattr(note, field).encode("utf-8", "surrogatepass")
            except UnicodeDecodeError as exc:
                return bytes(exc.object)

        return [(raw(n, "name"), raw(n, "msg")) for n in self.engine.get_notifies()]

    def eng_close(self):
        pass  # the process exits right after; the wheel has no shutdown call


if __name__ == "__main__":
    sys.exit(peer_common.run(MooncakePeer))
