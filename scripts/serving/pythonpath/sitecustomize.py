"""Start-up hooks of the serving tier (scripts/test-serving.sh), each off unless its variable is set.

``PDX_SERVING_DROP_KV=1`` (the negative control): pdx's ``TransferEngine``
returns success from every write and moves nothing, so a decode server that
"passes" with it proves the comparison does not depend on the KV. The tier
runs it on the prefill side only, with SGLang's auxiliary data (the first
output token) sent over its ZMQ side channel, so exactly the KV pages are
dropped.

``PDX_SERVING_CPU_DEVICE_INDEX=1``: ``torch.accelerator.current_device_index()``
answers 0 when CUDA is unavailable. vLLM's ``MooncakeConnectorWorker`` asks
for it, and PyPI's CUDA build of torch raises without an NVIDIA driver.
"""

import os

if os.environ.get("PDX_SERVING_DROP_KV") == "1":
    import pdx.mooncake as _served

    def _dropped(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return 0

    for _name in (
        "transfer_sync_write",
        "transfer_sync",
        "batch_transfer_sync_write",
        "batch_transfer_sync",
    ):
        setattr(_served.TransferEngine, _name, _dropped)

if os.environ.get("PDX_SERVING_CPU_DEVICE_INDEX") == "1":
    import torch

    _current_device_index = torch.accelerator.current_device_index

    def _device_index():  # type: ignore[no-untyped-def]
        if not torch.cuda.is_available():
            return 0
        return _current_device_index()

    torch.accelerator.current_device_index = _device_index
