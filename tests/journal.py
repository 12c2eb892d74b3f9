"""The jobs' own journal: each body appends a start and an end line to a file.

Queue-control tests read concurrency from it, never from the queue's tables:
the question is how many bodies ran at once, not what the queue believes.
Lines are ``S|E|X|T <job> <attempt> <wall time> <worker>``; every writer is on
this machine, so wall times of different processes compare. ``T`` is one call
a body made to a (pretend) limited service: ``read_ticks`` returns them. ``X`` is a start
the database did not back: the attempt no longer held its lease and its place
when its body began (a worker stopped between taking the job and starting
the body, whose writes are fenced off). ``read`` leaves those out of the
starts; ``read_unbacked`` returns them.
"""

import time
from pathlib import Path
from typing import Any

Key = tuple[int, int]  # (job id, attempt)


def note(path: str, kind: str, ctx: Any, at: float | None = None) -> None:
    """Append one line (``kind`` S, E or X) for this attempt, stamped ``at`` (default: now).

    One small append is atomic.
    """
    at = time.time() if at is None else at
    with open(path, "a") as f:
        f.write(f"{kind} {ctx.job_id} {ctx.attempt} {at:.6f} {ctx.worker_id}\n")


def read(path: Path) -> tuple[dict[Key, float], dict[Key, float], dict[Key, str]]:
    """``(starts, ends, workers)``, each keyed by (job id, attempt)."""
    starts: dict[Key, float] = {}
    ends: dict[Key, float] = {}
    workers: dict[Key, str] = {}
    if not path.exists():
        return starts, ends, workers
    for line in path.read_text().splitlines():
        kind, job_id, attempt, at, worker = line.split()
        key = (int(job_id), int(attempt))
        if kind in ("X", "T"):
            continue
        (starts if kind == "S" else ends)[key] = float(at)
        workers[key] = worker
    return starts, ends, workers


def first_lines(path: Path, kind: str) -> dict[Key, float]:
    """The journal's lines of one kind (any letter a body notes): (job id, attempt) -> the
    wall time of the first."""
    found: dict[Key, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            fields = line.split()
            if fields[0] == kind:
                found.setdefault((int(fields[1]), int(fields[2])), float(fields[3]))
    return found


def read_unbacked(path: Path) -> dict[Key, tuple[float, str]]:
    """The ``X`` starts: (job id, attempt) -> (wall time, worker)."""
    found: dict[Key, tuple[float, str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            kind, job_id, attempt, at, worker = line.split()
            if kind == "X":
                found[(int(job_id), int(attempt))] = (float(at), worker)
    return found


def read_ticks(path: Path) -> dict[Key, list[float]]:
    """The ``T`` lines: (job id, attempt) -> the wall times of its calls, in order."""
    ticks: dict[Key, list[float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            kind, job_id, attempt, at, _ = line.split()
            if kind == "T":
                ticks.setdefault((int(job_id), int(attempt)), []).append(float(at))
    return ticks


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at the same instant)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def max_concurrency(path: Path, *, open_until: float | None = None, since: float = 0.0) -> int:
    """The most bodies running at one instant; a body with no end runs until ``open_until``."""
    starts, ends, _ = read(path)
    last = open_until if open_until is not None else float("inf")
    return most_at_once(
        [
            (max(start, since), ends.get(key, last))
            for key, start in starts.items()
            if ends.get(key, last) >= since
        ]
    )
