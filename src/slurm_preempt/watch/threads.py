"""A few things done side by side (notice files, scancel batches), in threads made once per process.

Threads made and ended on every poll leave glibc's per-thread malloc arenas fragmented: a watcher that
made a new pool for each drain grew ~2 MiB per 100,000 polls of a churning cluster while its Python
objects stayed flat. Reused threads keep it flat (bench/bench_watcher.py, tests/test_watcher_soak.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

WORKERS = 8
T = TypeVar("T")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def side_by_side(function: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[function(i) for i in items]``, at most ``WORKERS`` at a time; one item runs here."""
    items = list(items)
    if len(items) <= 1:
        return [function(i) for i in items]
    return list(_workers().map(function, items))


def _workers() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="slurm-preempt")
        return _pool
