#!/usr/bin/env python3
"""One pdx engine in its own process, driven by the same JSON lines as mooncake_peer.py.

The engine is `pdx_engine_init("127.0.0.1", "tcp", "")` through the raw C ABI
(pdx_engine_api.py). Every engine call returns the pdx status as "rc" plus
"error" (pdx's last error message) when it failed.

A transfer or batch that carries a notify goes through the asynchronous path
(pdx_batch_submit with notify_name/notify_msg, then pdx_batch_wait and
pdx_batch_free), so both paths are exercised; the others use the
pdx_*transfer_sync_* calls.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer_common  # noqa: E402

HOST = "127.0.0.1"
WAIT_SLICE_MS = 1000
WAIT_LIMIT_S = float(os.environ.get("INTEROP_PDX_WAIT_LIMIT_S", "120"))


class PdxPeer(peer_common.PeerBase):
    kind = "pdx"

    def __init__(self):
        super().__init__()
        import pdx_engine_api as api

        self.api = api
        self.engine = api.Engine(HOST, "tcp", "")

    def _rc(self, status, **extra):
        reply = {"rc": int(status), **extra}
        if status != 0:
            reply["error"] = self.engine.last_error()
        return reply

    def eng_session(self):
        return self.engine.session_id()

    def eng_rpc_port(self):
        return self.engine.rpc_port()

    def eng_protocol(self):
        return self.engine.protocol()

    def cmd_peer_info(self, a):
        """pdx only: pdx_peer_info of a session this engine sent to."""
        rc, text = self.engine.peer_info(a["target"])
        return self._rc(rc, info=json.loads(text) if text else None)

    def eng_register(self, addr, length):
        return self._rc(self.engine.register_memory(addr, length))

    def eng_unregister(self, addr):
        return self._rc(self.engine.unregister_memory(addr))

    def eng_batch_register(self, addrs, lens):
        return self._rc(self.engine.batch_register_memory(addrs, lens))

    def eng_batch_unregister(self, addrs):
        return self._rc(self.engine.batch_unregister_memory(addrs))

    def _async(self, op, target, locals_, remotes, lens, notify):
        opcode = self.api.OPCODE_WRITE if op == "write" else self.api.OPCODE_READ
        status, batch = self.engine.batch_submit(target, opcode, locals_, remotes, lens, notify[0], notify[1])
        if status != 0:
            return self._rc(status, stage="submit")
        if batch == 0:
            return {"rc": -3, "stage": "submit", "error": "pdx_batch_submit returned PDX_OK with batch id 0"}
        deadline = time.monotonic() + WAIT_LIMIT_S
        try:
            while True:
                status, state = self.engine.batch_wait(batch, WAIT_SLICE_MS)
                if status != self.api.PDX_ERR_TIMEOUT or time.monotonic() > deadline:
                    return self._rc(status, stage="wait", state=state, batch=batch)
        finally:
            freed = self.engine.batch_free(batch)
            if freed != 0:
                peer_common.log("pdx_batch_free failed:", freed, self.engine.last_error())

    def eng_transfer(self, op, target, local, remote, length, notify):
        if notify is not None:
            return self._async(op, target, [local], [remote], [length], notify)
        if op == "write":
            return self._rc(self.engine.transfer_sync_write(target, local, remote, length))
        return self._rc(self.engine.transfer_sync_read(target, local, remote, length))

    def eng_batch(self, op, target, locals_, remotes, lens, notify):
        if notify is not None:
            return self._async(op, target, locals_, remotes, lens, notify)
        if op == "write":
            return self._rc(self.engine.batch_transfer_sync_write(target, locals_, remotes, lens))
        return self._rc(self.engine.batch_transfer_sync_read(target, locals_, remotes, lens))

    def eng_probe(self, target):
        return self._rc(self.engine.send_probe(target))

    def eng_notify(self, target, name, msg):
        if isinstance(name, bytes) or isinstance(msg, bytes):
            note = [x if isinstance(x, bytes) else x.encode() for x in (name, msg)]
            return self._rc(self.engine.send_notify_bytes(target, *note))
        return self._rc(self.engine.send_notify(target, name, msg))

    def eng_notifies_bytes(self):
        status, pairs = self.engine.drain_notifications_bytes()
        if status != 0:
            raise RuntimeError(f"pdx_notifications_drain failed: {status}: {self.engine.last_error()}")
        return pairs

    def eng_notifies(self):
        status, pairs = self.engine.drain_notifications()
        if status != 0:
            raise RuntimeError(f"pdx_notifications_drain failed: {status}: {self.engine.last_error()}")
        return pairs

    def eng_close(self):
        self.engine.close()


if __name__ == "__main__":
    sys.exit(peer_common.run(PdxPeer))
