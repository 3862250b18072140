"""Interop tests: peers run as separate processes driven over JSON lines (peer_client.py)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
