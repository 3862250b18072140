"""Start-up hooks of the serving tier (scripts/test-serving.sh), each off unless its variable is set.

``PDX_SERVING_DROP_KV=1`` (the negative controls): pdx's ``TransferEngine``
returns success from every synchronous transfer, write or read, and moves
nothing, so a case that "passes" with it proves its comparison does not
depend on the KV. It announces itself on stderr (DROP_KV_BANNER), so a case
can check that its control really ran with it. Where the tier uses it:
SGLang's prefill (``batch_transfer_sync``; its auxiliary data, the first
output token, then goes over SGLang's ZMQ side channel, so exactly the KV
pages are dropped), vLLM's prefill (``batch_transfer_sync_write``: vLLM's
MooncakeConnector pushes from the prefill side, its decode side calls no
transfer), and the prefill process of scripts/serving/sglang_kv_manager.py.

``PDX_SERVING_CPU_DEVICE_INDEX=1``: ``torch.accelerator.current_device_index()``
answers 0 when CUDA is unavailable. vLLM's ``MooncakeConnectorWorker`` asks
for it, and PyPI's CUDA build of torch raises without an NVIDIA driver.
"""

import os

DROP_KV_BANNER = "pdx-serving: PDX_SERVING_DROP_KV=1, every transfer of pdx's TransferEngine is dropped"

if os.environ.get("PDX_SERVING_DROP_KV") == "1":
    import sys

    import pdx.mooncake as _served

    def _dropped(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return 0

    for _name in (
        "transfer_sync_write",
        "transfer_sync_read",
        "transfer_sync",
        "batch_transfer_sync_write",
        "batch_transfer_sync_read",
        "batch_transfer_sync",
    ):
        setattr(_served.TransferEngine, _name, _dropped)
    print(DROP_KV_BANNER, file=sys.stderr, flush=True)

if os.environ.get("PDX_SERVING_CPU_DEVICE_INDEX") == "1":
    import torch

    _current_device_index = torch.accelerator.current_device_index

    def _device_index():  # type: ignore[no-untyped-def]
        if not torch.cuda.is_available():
            return 0
        return _current_device_index()

    torch.accelerator.current_device_index = _device_index
