"""What the end-to-end benchmarks share: a real `trainhub up` through the e2e tests'
``Platform`` driver (tests/conftest.py), and nearest-rank percentiles."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from conftest import PLATFORM_CONFIG, Platform  # noqa: E402  (the e2e tests' `trainhub up` driver)

__all__ = ["PLATFORM_CONFIG", "Platform", "percentile", "start_platform"]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    xs = sorted(values)
    k = max(0, min(len(xs) - 1, int(round(q / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


def start_platform(name: str, root: Path, **kw) -> Platform:
    """`trainhub up` with the e2e tests' default config (4 simulated GPUs), data under ``root``."""
    kw.setdefault("config", PLATFORM_CONFIG)
    return Platform(name, root / "data", **kw).start()
