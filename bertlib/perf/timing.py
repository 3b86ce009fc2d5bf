"""How bertlib times code and measures its memory so that two implementations compare fairly (appendix 14, *Making
it fast*; ``python -m bertlib.perf.bench``).

Every implementation of a measurement is timed in turn, round after round (:func:`time_rounds`: a machine that slows
down mid-run slows all of them alike), after warm-up; a time is the median over rounds and a ratio the median of the
ratios taken within each round (:func:`paired_ratio`).

On CPU, glibc's allocator hands large freed blocks back to the operating system, and taking them again costs a
page fault per 4 KiB; how many a function pays then depends on what ran before it, not on its own arithmetic
(measured on 2 cores: 0 to 78,000 faults for the same HF eager call at batch 32 x 128, up to ~15% of its time).
:func:`keep_freed_memory` asks glibc to keep freed memory for reuse before anything is timed, the effect PyTorch's
CPU performance guide gets from jemalloc or tcmalloc; peak memory is measured after handing free memory back
(``malloc_trim``). On CPU, peak memory is the growth of the process's resident set (``psutil``, so on Linux, macOS
and Windows alike), sampled every millisecond.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time
from collections.abc import Callable

import torch


class _RssPeak:
    """Peak resident-memory growth of this process while the block runs (CPU; sampled every millisecond)."""

    def __enter__(self):
        import psutil

        self.process = psutil.Process()
        self.base = self.peak = self._rss()
        self.running = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()

    def _rss(self) -> int:
        return self.process.memory_info().rss

    def _watch(self):
        while self.running:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.001)

    @property
    def mb(self) -> float:
        return (self.peak - self.base) / 2**20


#: glibc's ``mallopt`` parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, Windows, musl): leave the allocator alone
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse: serve blocks up to 32 MiB from the heap (not fresh ``mmap`` pages)
    and never trim it back to the OS, so that timings do not include page faults inherited from earlier calls.
    Process-wide and idempotent; returns ``False`` (changing nothing) where the C library is not glibc."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, 2**30))


def release_freed_memory() -> bool:
    """Undo :func:`keep_freed_memory` once the timing is over: glibc's default thresholds again (128 KiB), and the
    memory freed so far handed back to the OS (``malloc_trim``). Returns ``False`` where the C library is not
    glibc."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, 128 * 2**10)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, 128 * 2**10)) and libc.malloc_trim(0) >= 0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[..., object], *args, device: torch.device) -> tuple[object, float]:
    """``(fn(*args), seconds)``, the device synchronised before and after so the time is the call's own."""
    sync(device)
    t0 = time.perf_counter()
    out = fn(*args)
    sync(device)
    return out, time.perf_counter() - t0


def peak_memory_mb(fn: Callable[[], object], device: torch.device) -> float:
    """Memory one call of ``fn`` needs beyond what is already allocated, in MB (CUDA allocator; CPU: RSS growth)."""
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)  # hand free memory back first, so the growth below is what this call needs
    with _RssPeak() as rss:
        fn()
    return rss.mb


def time_rounds(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int,
                warmup: int = 1) -> dict[str, list[float]]:
    """Milliseconds of each function in each of ``repeats`` rounds, timed round-robin (each round calls every
    function once, so a slowdown of the machine falls on all of them alike). On CPU, :func:`keep_freed_memory` is
    switched on first."""
    if device.type == "cpu":
        keep_freed_memory()
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn, device=device)[1] * 1e3)
    return times


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int,
                     warmup: int = 1) -> dict[str, float]:
    """Median milliseconds of each function over the rounds of :func:`time_rounds`."""
    return {name: statistics.median(t) for name, t in time_rounds(fns, device, repeats, warmup).items()}


def paired_ratio(rounds: dict[str, list[float]], a: str, b: str) -> float:
    """``a``'s time over ``b``'s, taken within each round (the same moment of a busy machine), median over rounds."""
    return statistics.median(x / y for x, y in zip(rounds[a], rounds[b], strict=True))


def markdown(rows: list[dict], keys: list[str] | None = None) -> str:
    """A markdown table of ``rows`` (dicts), columns ``keys`` (default: the first row's)."""
    keys = keys or list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)
