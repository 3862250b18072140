"""An engine's metrics for `prometheus_client` (an optional dependency:
`pip install pdx[metrics]` or `pip install prometheus_client`).

    import prometheus_client, pdx, pdx.metrics
    engine = pdx.Engine("10.0.0.5", "tcp")
    pdx.metrics.register(engine)          # into prometheus_client.REGISTRY
    prometheus_client.start_http_server(9400)

The collector reads `pdx_engine_metrics` at each scrape and parses it with
prometheus_client's own parser; every sample gets the label `engine` (the
engine's session name) so that several engines of one process can share a
registry. Without prometheus_client, `Engine.metrics_text()` gives the same
text to serve by other means.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Iterator

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "pdx.metrics needs prometheus_client (pip install prometheus_client); "
        "Engine.metrics_text() gives the metrics without it"
    ) from e

if TYPE_CHECKING:
    from .engine import Engine


class EngineCollector:
    """A prometheus_client collector of one engine's metrics. It holds the
    engine weakly: once the engine is closed or gone it yields nothing."""

    def __init__(self, engine: Engine, labels: dict[str, str] | None = None):
        self._engine = weakref.ref(engine)
        self._labels = {"engine": engine.session_id} if labels is None else dict(labels)

    def describe(self) -> list[Any]:
        # Nothing up front: registering must not scrape the engine.
        return []

    def collect(self) -> Iterator[Any]:
        engine = self._engine()
        if engine is None or not engine.handle:
            return
        for family in text_string_to_metric_families(engine.metrics_text()):
            for sample in family.samples:
                sample.labels.update(self._labels)
            yield family


def register(engine: Engine, registry: Any = None, labels: dict[str, str] | None = None) -> EngineCollector:
    """Register a collector of `engine`'s metrics in `registry`
    (prometheus_client's default REGISTRY when None) and return it
    (`registry.unregister(collector)` takes it out)."""
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    collector = EngineCollector(engine, labels)
    registry.register(collector)
    return collector
