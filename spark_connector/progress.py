"""How far a streaming query is behind, from its progress: Kafka's source metrics, computed on the driver.

Spark's Kafka source reports minOffsetsBehindLatest / maxOffsetsBehindLatest / avgOffsetsBehindLatest
in `progress.sources[i].metrics` through the JVM interface ReportsSourceMetrics. PySpark 4.3's Python
data source API has no such hook (DataSourceStreamReader has no metrics method, and the JVM wrapper
PythonMicroBatchStream does not implement ReportsSourceMetrics), so a Python source's `metrics` map
stays empty. What the API does carry is the source's latest offsets (reportLatestOffset) next to the
batch's end offsets; this module turns those two into Kafka's three numbers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tidemark.spark_connector.offsets import offsets_from_json


def offsets_behind_latest(source: Mapping[str, Any]) -> dict[str, float] | None:
    """{"minOffsetsBehindLatest", "maxOffsetsBehindLatest", "avgOffsetsBehindLatest"} of one source's
    progress (`query.lastProgress["sources"][0]`, or a listener event's `progress.sources[0]`): per
    queue, its latest offset when the batch was planned minus the batch's end offset. Queues not yet
    in the end offset are left out, as in Kafka. None while the progress has no offsets."""
    end, latest = (_offsets(source.get(key)) for key in ("endOffset", "latestOffset"))
    if not end or not latest:
        return None
    behind = [max(0, high - end[mq]) for mq, high in latest.items() if mq in end]
    if not behind:
        return None
    return {"minOffsetsBehindLatest": min(behind), "maxOffsetsBehindLatest": max(behind),
            "avgOffsetsBehindLatest": sum(behind) / len(behind)}


def _offsets(value: Any) -> dict | None:
    if value is None:
        return None
    doc = json.loads(value) if isinstance(value, str) else value
    return offsets_from_json(doc) if doc else None


__all__ = ["offsets_behind_latest"]
