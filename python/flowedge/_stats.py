"""Latency percentiles for the tools' JSON (replay, rollout, the whole-policy loop)."""
from typing import Dict, List, Optional, Sequence

import numpy as np


def percentiles_ms(seconds: List[float], qs: Sequence[float]) -> Dict[str, Optional[float]]:
    """n, the percentiles `qs` (keys p50, p95, p99_9, ...), mean and max of durations in seconds, in milliseconds."""
    keys = ["p" + format(q, "g").replace(".", "_") for q in qs]
    if not seconds:
        return {"n": 0, **{k: None for k in keys}, "mean": None, "max": None}
    a = np.asarray(seconds, dtype=np.float64) * 1e3
    v = np.percentile(a, list(qs))
    return {"n": int(a.size), **{k: round(float(x), 4) for k, x in zip(keys, v)}, "mean": round(float(a.mean()), 4),
            "max": round(float(a.max()), 4)}
