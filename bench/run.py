"""One benchmark session (``Bench``) and ``run_all``, which runs what the command asks."""

import contextlib
import datetime as dt
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connections, transaction

from bench import dbcost, raw
from bench.db import CLAIM_SESSION, connect, machine
from bench.host import cpu_ticks, steal_share
from bench.tasks import HISTORY_QUEUE, NOOP, OTHER_QUEUE, QUEUE, STEPS_PER_JOB, register_tasks
from bench.workers import WorkerGroup
from leasejobs import conf
from leasejobs.conf import db_alias
from leasejobs.db import chartpoints, sql, store

#: runworker's verbosity for each log level.
VERBOSITY = {"warning": 0, "info": 1}

#: Rows each kind of single enqueue inserts before the next takes its turn
#: (``Bench.enqueue_one_by_one``).
ENQUEUE_BLOCK = 50


@dataclass(frozen=True)
class Workload:
    """What each job of a processing run does (``--workload``).

    ``noop``: nothing, the queue's own cost. ``io``: waits ``seconds`` as a
    job waiting on a slow service does (``time.sleep``, no GIL held). ``cpu``:
    spends ``seconds`` of CPU in pure Python. ``steps``: ten durable steps that
    do nothing (``--steps-jobs``). ``pause``: waits as ``io`` does, carries
    ``payload`` (a string it does not read) in its arguments and returns when
    its body started (``--offered-load``).
    """

    kind: str = "noop"
    seconds: float = 0.0
    payload: str = ""

    @property
    def task(self) -> str:
        return {"noop": "noop", "io": "sleep", "cpu": "spin", "steps": "steps", "pause": "pause"}[self.kind]

    @property
    def args(self) -> tuple[float | str, ...]:
        if self.kind in ("noop", "steps"):
            return ()
        return (self.seconds, self.payload) if self.kind == "pause" else (self.seconds,)

    def ideal(self, workers: int, concurrency: int) -> float | None:
        """Jobs/s with a queue that costs nothing: every runner always waiting (io),
        every child process one busy core, as many as the machine has cores (cpu: a
        worker runs each of its ``concurrency`` bodies in a child process of its own);
        None for no-ops."""
        if self.kind in ("io", "pause"):
            return workers * concurrency / self.seconds
        if self.kind == "cpu":
            return min(workers * concurrency, os.cpu_count() or 1) / self.seconds
        return None


NO_OPS = Workload()


@dataclass
class Arrivals:
    """Jobs a background enqueuer added (``Bench._arriving``), and over how long."""

    count: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * p / 100
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


class Progress:
    """A one-line progress bar on stderr, for runs long enough to need one."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label = label
        self.total = max(1, total)
        self.enabled = enabled and sys.stderr.isatty()
        self.started = time.monotonic()
        self.shown = False

    def update(self, done: int) -> None:
        if not self.enabled or time.monotonic() - self.started < 2:
            return
        width = 30
        filled = int(width * min(done, self.total) / self.total)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done:,}/{self.total:,}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


@dataclass
class Bench:
    """One benchmark session: a connection of its own, a log folder, the tasks."""

    verbosity: int = 0  # of the worker processes: 0 is WARNING, 1 is INFO
    progress: bool = True
    #: The workers claim from every queue (runworker's default), not only the bench's.
    all_queues: bool = False
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="leasejobs-bench-")))
    _runs: int = 0

    def __post_init__(self) -> None:
        self.tasks = register_tasks()
        self.conn = connect()
        # Progress polls walk the claim index, as a worker's claim does.
        self.poll = connect(CLAIM_SESSION)

    def close(self) -> None:
        self.clear(history=True)
        self.conn.close()
        self.poll.close()
        for path in self.log_dir.glob("*.log"):
            path.unlink()
        with contextlib.suppress(OSError):
            self.log_dir.rmdir()

    # -- database state

    def clear(self, history: bool = False) -> None:
        """Delete the bench's jobs (and the --table-rows history), then vacuum; and store the
        overview charts' closed buckets, as a fleet's running workers keep them: a worker's
        first look fills whatever is missing (616 rows on a fresh database), which would
        otherwise land in a measurement of a few hundred jobs as rows written by each."""
        queues = [QUEUE, HISTORY_QUEUE] if history else [QUEUE]
        self.conn.execute("DELETE FROM leasejobs_job WHERE queue = ANY(%s)", [queues])
        self.conn.execute("VACUUM leasejobs_job")
        with self.conn.transaction(), self.conn.cursor() as cursor:
            chartpoints.keep(cursor, dt.timedelta(0))
        if self.conn.info.server_version >= 150000:
            # Counted now, not at this session's next flush of its statistics (up to a second
            # later: after a measurement's first reading).
            self.conn.execute("SELECT pg_stat_force_next_flush()")

    def other_workers(self) -> int:
        """leasejobs workers connected to this database that are not the bench's."""
        row = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'leasejobs claim %%'"
            " AND application_name NOT LIKE 'leasejobs claim bench-%%'"
        ).fetchone()
        return int(row[0]) if row else 0

    def table_stats(self) -> tuple[int, int]:
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'leasejobs_job'"
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def prefill(self, rows: int) -> float:
        """Insert ``rows`` finished jobs, as a busy site keeps for a week; seconds taken."""
        started = time.monotonic()
        self.conn.execute(
            """
            INSERT INTO leasejobs_job (
                task_name, queue, priority, args, kwargs, status, attempt, max_attempts,
                run_at, leased_by, cancel_requested, last_error, errors, worker_ids,
                result, created_at, started_at, finished_at
            )
            SELECT %(task)s, %(queue)s, 0, '[]', '{}', 'done', 1, 1,
                   now() - interval '7 days' + g * interval '1 ms', 'bench-history', false, '',
                   NULL, NULL, NULL, now() - interval '7 days',
                   now() - interval '7 days', now() - interval '7 days' + g * interval '1 ms'
            FROM generate_series(1, %(rows)s) AS g
            """,
            {"task": NOOP, "queue": HISTORY_QUEUE, "rows": rows},
        )
        # Autovacuum would have done this on a table that grew over a week.
        self.conn.execute("VACUUM ANALYZE leasejobs_job")
        return time.monotonic() - started

    def park(self, rows: int, *, due: bool = True) -> float:
        """Queue ``rows`` no-op jobs the workers may not take, in a queue of their own; seconds taken.

        ``due``: an hour old, in another queue than the one the workers
        serve, or with ``all_queues`` a paused one: either way, jobs that sort
        ahead of every bench job in claim order. Else due tomorrow: after
        them, and not yet claimable by anyone.
        """
        started = time.monotonic()
        self.conn.execute(
            """
            INSERT INTO leasejobs_job (
                task_name, queue, priority, args, kwargs, status, attempt, max_attempts,
                run_at, leased_by, cancel_requested, last_error, errors, worker_ids, created_at, snoozes
            )
            SELECT %(task)s, %(queue)s, 0, '[]', '{}', 'queued', 0, 1, now() + %(offset)s,
                   '', false, '', NULL, NULL, now(), 0
            FROM generate_series(1, %(rows)s)
            """,
            {
                "task": NOOP,
                "queue": OTHER_QUEUE,
                "rows": rows,
                "offset": dt.timedelta(hours=-1) if due else dt.timedelta(days=1),
            },
        )
        if due and self.all_queues:
            self.conn.execute(
                "INSERT INTO leasejobs_queue (name, paused, limits_from_settings, updated_at)"
                " VALUES (%s, true, false, now()) ON CONFLICT (name) DO UPDATE SET paused = true",
                [OTHER_QUEUE],
            )
        self.conn.execute("VACUUM ANALYZE leasejobs_job")
        return time.monotonic() - started

    def unpark(self) -> None:
        """Delete ``park``'s jobs and its pause."""
        self.conn.execute("DELETE FROM leasejobs_job WHERE queue = %s", [OTHER_QUEUE])
        self.conn.execute("DELETE FROM leasejobs_queue WHERE name = %s", [OTHER_QUEUE])
        self.conn.execute("VACUUM leasejobs_job")

    def claim_plan(self) -> str:
        """EXPLAIN of the worker's claim, on a connection set up like the worker's."""
        with connect(CLAIM_SESSION) as conn:
            rows = conn.execute(
                "EXPLAIN " + sql.CLAIM,
                store.claim_params(
                    limit=100,
                    counted=4,
                    queues=[QUEUE],
                    lease_seconds=30.0,
                    task_leases={},
                    worker_id="bench-explain",
                ),
            ).fetchall()
        return "\n".join(r[0] for r in rows)

    # -- enqueue

    def enqueue_one_by_one(self, jobs: int, block: int = ENQUEUE_BLOCK) -> dict[str, float]:
        """Jobs/s of ``task.enqueue()`` and of its references, ``jobs`` rows each, taking turns.

        Each row is its own transaction, so each waits for its commit's WAL
        flush, and on a shared machine that time drifts by a third within
        seconds: measured one after the other, a kind's figure moved between
        61 % and 119 % of the bare INSERT's from one run to the next. So the
        kinds take turns every ``block`` rows, in an order reversed at each
        turn, and each figure is its rows over the time its own blocks took:
        all of them see the same disk. The kinds: ``enqueue()``; its own
        INSERT (``ENQUEUE_PLAIN``) sent bare on one cursor, which is the SQL
        without ``enqueue()``'s Python; and the bare one-row INSERT through
        the same Django connection on one cursor, with a cursor per statement
        (as ``enqueue()`` and Django's ORM run), and with ``enqueue()``'s
        NOTIFY (on its channel, so that it costs what enqueue's does). "One
        cursor" is one per block. ``jobs`` is rounded down to a whole number
        of blocks, at least one.
        """
        noop = self.tasks["noop"]
        channel = conf.get("NOTIFY_CHANNEL")
        params = {
            "task_name": noop.name,
            "queue": noop.queue,
            "priority": noop.priority,
            "args": "[]",
            "kwargs": "{}",
            "max_attempts": noop.max_attempts,
            "channel": channel,
        }

        def single(rows: int) -> None:
            for _ in range(rows):
                noop.enqueue()

        def statement(rows: int) -> None:
            with connections[db_alias()].cursor() as cursor:
                for _ in range(rows):
                    cursor.execute(sql.ENQUEUE_PLAIN, params)
                    cursor.fetchall()

        kinds: dict[str, Callable[[int], None]] = {
            "single": single,
            "statement": statement,
            "bare_insert_django": raw.insert_django,
            "bare_insert_django_cursor_each": functools.partial(raw.insert_django, cursor_each=True),
            "bare_insert_django_notify": functools.partial(raw.insert_django, notify=(channel, noop.queue)),
        }
        seconds = dict.fromkeys(kinds, 0.0)
        connections[db_alias()].ensure_connection()  # not inside the first block's time
        with raw.raw_table(self.conn):
            order = list(kinds)
            for turn in range(max(1, jobs // block)):
                for name in order if turn % 2 == 0 else reversed(order):
                    started = time.perf_counter()
                    kinds[name](block)
                    seconds[name] += time.perf_counter() - started
        self.clear()
        rows = max(1, jobs // block) * block
        return {name: rows / spent for name, spent in seconds.items()}

    def enqueue_bulk(self, jobs: int, chunk: int = 1000, *, ids: bool = False) -> float:
        """Jobs/s of ``task.bulk_enqueue()`` (``bulk_enqueue_ids()``) with ``chunk`` jobs per call."""
        noop = self.tasks["noop"]
        insert = noop.bulk_enqueue_ids if ids else noop.bulk_enqueue
        calls: list[tuple[tuple[()], dict[str, Any]]] = [((), {})] * chunk
        started = time.perf_counter()
        for _ in range(max(1, jobs // chunk)):
            insert(calls)
        rate = max(1, jobs // chunk) * chunk / (time.perf_counter() - started)
        self.clear()
        return rate

    # -- processing

    @contextlib.contextmanager
    def workers(self, count: int, args: list[str]) -> Iterator[WorkerGroup]:
        self._runs += 1
        group = WorkerGroup(
            count,
            args,
            self.log_dir,
            self.verbosity,
            name=f"{os.getpid()}-{self._runs}",
            queue=None if self.all_queues else QUEUE,
        )
        try:
            since = self.conn.execute("SELECT statement_timestamp()").fetchone()
            assert since is not None
            group.start()
            group.wait_ready(self.conn, since[0])
            yield group
            group.stop()
        finally:
            for proc in group.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _commit_jobs(self, jobs: int, workload: Workload) -> None:
        """Enqueue ``jobs`` jobs of the workload in one transaction: all visible at once."""
        task = self.tasks[workload.task]
        call: tuple[tuple[float | str, ...], dict[str, Any]] = (workload.args, {})
        with transaction.atomic(using=db_alias()):
            left = jobs
            while left:
                n = min(left, 5000)
                task.bulk_enqueue([call] * n)
                left -= n

    def _remaining(self, first_id: int, jobs: int) -> int:
        """Jobs not finished yet, from the claim order (ids), in one index probe."""
        row = self.poll.execute(
            "SELECT id FROM leasejobs_job WHERE finished_at IS NULL AND queue = %s"
            " ORDER BY priority DESC, run_at, id LIMIT 1",
            [QUEUE],
        ).fetchone()
        return 0 if row is None else max(1, jobs - (int(row[0]) - first_id))

    def process(
        self,
        jobs: int,
        workers: int,
        concurrency: int,
        prefetch: int | None,
        timeout: float = 900,
        workload: "Workload | None" = None,
    ) -> dict[str, Any]:
        """Drain ``jobs`` jobs (no-ops unless ``workload``) with ``workers`` runworker processes; one run."""
        workload = workload or NO_OPS
        args = _worker_args(concurrency, prefetch)
        self.clear()
        rss: list[tuple[int, float]] = []  # (jobs finished, largest worker RSS)
        ours = [self.conn.info.backend_pid, self.poll.info.backend_pid]
        with self.workers(workers, args) as group:
            rss_idle = max(group.rss_mb(), default=0.0)
            before = self.table_stats()
            checkpointed = dbcost.checkpoint(self.conn)
            reading = dbcost.read(self.conn)
            cpu = dbcost.backend_cpu(self.conn, ours)
            ticks = cpu_ticks()  # from the jobs' commit to the last finish, as the figure
            self._commit_jobs(jobs, workload)
            # The enqueue's backend reports its statistics as it exits: its CPU is read first.
            enqueued = dbcost.backend_cpu(self.conn, ours)
            connections[db_alias()].close()
            row = self.conn.execute("SELECT min(id) FROM leasejobs_job WHERE queue = %s", [QUEUE]).fetchone()
            first_id = int(row[0]) if row and row[0] is not None else 0
            bar = Progress(f"{workers} worker(s) x c{concurrency}", jobs, self.progress)
            deadline = time.monotonic() + timeout
            while (left := self._remaining(first_id, jobs)) > 0:
                group.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{left} bench jobs still unfinished after {timeout:.0f} s")
                rss.append((jobs - left, max(group.rss_mb(), default=0.0)))
                bar.update(jobs - left)
                time.sleep(0.05)
            stolen = steal_share(ticks, cpu_ticks())
            cpu_end = enqueued | dbcost.backend_cpu(self.conn, ours)
            bar.close()
            rss_end = max(group.rss_mb(), default=0.0)
        self._wait_reported(list(cpu_end))
        after = self.table_stats()
        cost = dbcost.per_job(reading, dbcost.read(self.conn), cpu, cpu_end, jobs, checkpointed=checkpointed)
        row = self.conn.execute(
            """
            SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE attempt <> 1),
                   extract(epoch FROM max(finished_at) - min(started_at))
            FROM leasejobs_job WHERE queue = %s
            """,
            [QUEUE],
        ).fetchone()
        assert row is not None
        done, reclaimed, seconds = int(row[0]), int(row[1]), float(row[2] or 0)
        if done != jobs or reclaimed:
            raise RuntimeError(f"{done} of {jobs} bench jobs done, {reclaimed} not on their first attempt")
        updates, hot = after[0] - before[0], after[1] - before[1]
        settled = [mb for n, mb in rss if n >= jobs // 4]
        return {
            "jobs_per_s": jobs / seconds if seconds > 0 else float("inf"),
            "seconds": seconds,
            "updates": updates,
            "hot_updates": hot,
            "steal": stolen,
            "database": cost,
            "rss_mb": {
                "idle": round(rss_idle, 1),
                "at_25pct": round(settled[0], 1) if settled else None,
                "max": round(max((mb for _, mb in rss), default=rss_end), 1),
                "end": round(rss_end, 1),
            },
        }

    def _wait_reported(self, backends: list[int], timeout: float = 10.0) -> None:
        """Wait until the workers' backends have exited, and their statistics have reached the
        shared counters (a backend reports at exit; one still open, at most a second later)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE pid = ANY(%s) AND application_name LIKE 'leasejobs %%'",
                [backends],
            ).fetchone()
            if row is None or not row[0]:
                break
            time.sleep(0.05)
        time.sleep(1.1)

    def latency(self, jobs: int, rate: float, concurrency: int) -> dict[str, float]:
        """Enqueue-to-start latency with one idle worker, ``jobs`` jobs at ``rate`` per second."""
        self.clear()
        with self.workers(1, ["--concurrency", str(concurrency)]) as group:
            ids, enqueue_ms = self._probe(group, jobs, rate)
        figures = self._latencies(ids)
        figures["enqueue_p50"] = percentile(enqueue_ms, 50)
        self.clear()
        return figures

    def latency_under_load(
        self, jobs: int, rate: float, load_rate: float, workers: int, concurrency: int, prefetch: int | None
    ) -> dict[str, float]:
        """Enqueue-to-start latency while ``workers`` drain no-op jobs enqueued at ``load_rate`` per second.

        The load starts a second before the first probe and lasts until the
        last probe has run; the figures include the load reached and the
        queue left behind it.
        """
        self.clear()
        with self.workers(workers, _worker_args(concurrency, prefetch)) as group:
            with self._arriving(load_rate) as load:
                time.sleep(1.0)
                ids, _ = self._probe(group, jobs, rate)
            left_behind = self._queued()
        figures = self._latencies(ids)
        figures.update(load_rate=load_rate, load_reached=load.rate, left_behind=left_behind)
        self.clear()
        return figures

    def backlog(
        self,
        rows: int,
        workers: int,
        concurrency: int,
        prefetch: int | None,
        arrive_rate: float,
        *,
        vacuum: bool = True,
    ) -> dict[str, Any]:
        """Drain ``rows`` queued no-op jobs with ``workers`` processes while more arrive at ``arrive_rate``/s.

        The backlog is inserted in one statement and vacuumed, as a queue
        that fell behind for a while would be; jobs/s counts every job the
        workers finished, from the first start to the last finish. Without
        ``vacuum`` the workers run with ``--no-vacuum``. ``timeline`` holds
        (seconds, backlog jobs claimed) every half second: how the drain's
        pace changes as it goes.
        """
        self.clear()
        started = time.monotonic()
        self.conn.execute(
            """
            INSERT INTO leasejobs_job (
                task_name, queue, priority, args, kwargs, status, attempt, runs, snoozes, max_attempts,
                run_at, leased_by, cancel_requested, last_error, errors, worker_ids, created_at
            )
            SELECT %(task)s, %(queue)s, 0, '[]', '{}', 'queued', 0, 0, 0, 1,
                   now(), '', false, '', NULL, NULL, now()
            FROM generate_series(1, %(rows)s)
            """,
            {"task": NOOP, "queue": QUEUE, "rows": rows},
        )
        self.conn.execute("VACUUM ANALYZE leasejobs_job")
        fill_seconds = time.monotonic() - started
        # The workers start on a full queue (jobs/s counts from the first start).
        first = self._frontier()
        timeline: list[tuple[float, int]] = []
        args = _worker_args(concurrency, prefetch) + ([] if vacuum else ["--no-vacuum"])
        with self.workers(workers, args) as group:
            began = time.monotonic()
            deadline = began + 1800
            with self._arriving(arrive_rate) as arrivals:
                limit = int(arrive_rate) + 1  # until only about a second of arrivals is left
                while self._queued(limit) >= limit:
                    group.check_alive()
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the backlog of {rows:,} jobs was not drained in 30 minutes")
                    frontier = self._frontier()
                    if first is not None and frontier is not None:
                        timeline.append((time.monotonic() - began, min(rows, frontier - first)))
                    time.sleep(0.5)
            while self._queued():
                group.check_alive()
                time.sleep(0.05)
        row = self.conn.execute(
            "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))"
            " FROM leasejobs_job WHERE queue = %s AND status = 'done'",
            [QUEUE],
        ).fetchone()
        assert row is not None
        done, seconds = int(row[0]), float(row[1] or 0)
        if done != rows + arrivals.count:
            raise RuntimeError(f"{done} of {rows + arrivals.count} backlog jobs done")
        self.clear()
        return {
            "rows": rows,
            "fill_seconds": fill_seconds,
            "arrive_rate": arrive_rate,
            "arrived": arrivals.count,
            "jobs_per_s": done / seconds if seconds > 0 else float("inf"),
            "vacuum": vacuum,
            "timeline": timeline,
        }

    def _frontier(self) -> int | None:
        """The id of the first bench job not finished, in claim order: the backlog's rows are claimed by id.

        One step of the claim index, as a claim takes it (the arrivals come
        after every backlog row, their ``run_at`` being later).
        """
        row = self.poll.execute(
            "SELECT id FROM leasejobs_job WHERE queue = %s AND finished_at IS NULL"
            " ORDER BY priority DESC, run_at, id LIMIT 1",
            [QUEUE],
        ).fetchone()
        return int(row[0]) if row else None

    def _queued(self, limit: int | None = None) -> int:
        """Bench jobs not finished yet (counted up to ``limit``: a cheap look at a long queue)."""
        row = self.conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM leasejobs_job"
            " WHERE queue = %s AND finished_at IS NULL LIMIT %s) AS q",
            [QUEUE, limit],
        ).fetchone()
        return int(row[0]) if row else 0

    @contextlib.contextmanager
    def _arriving(
        self, rate: float, workload: Workload = NO_OPS, *, catch_up: bool = False
    ) -> Iterator["Arrivals"]:
        """Jobs (no-ops unless ``workload``) enqueued at ``rate`` per second from a thread, in bulk
        inserts every 10 ms.

        An insert that takes longer than 10 ms delays the ones after it: on a
        busy machine the rate reached falls below ``rate`` (``Arrivals.rate``
        tells). With ``catch_up`` the next insert also takes the jobs due in
        the time lost, so the rate holds as long as one insert keeps up (a
        fixed offered load: ``--offered-load``).
        """
        arrivals = Arrivals()
        stop = threading.Event()
        task = self.tasks[workload.task]
        call: tuple[tuple[float | str, ...], dict[str, Any]] = (workload.args, {})

        def enqueue() -> None:
            owed, next_at = 0.0, time.monotonic()
            try:
                while not stop.is_set():
                    next_at += 0.01
                    owed += rate * 0.01
                    if catch_up and (behind := time.monotonic() - next_at) > 0:
                        owed += rate * behind
                        next_at += behind
                    if (n := int(owed)) > 0:
                        task.bulk_enqueue_ids([call] * n)
                        arrivals.count += n
                        owed -= n
                    time.sleep(max(0.0, next_at - time.monotonic()))
            finally:
                connections.close_all()  # this thread's own

        thread = threading.Thread(target=enqueue, name="bench-arrivals")
        began = time.monotonic()
        thread.start()
        try:
            yield arrivals
        finally:
            stop.set()
            thread.join()
            arrivals.seconds = time.monotonic() - began

    def _probe(self, group: WorkerGroup, jobs: int, rate: float) -> tuple[list[int], list[float]]:
        """Enqueue ``jobs`` stamp jobs at ``rate`` per second and wait until they ran; their ids,
        and how long each enqueue call took in ms (the part of the latency before the commit)."""
        stamp = self.tasks["stamp"]
        ids = []
        enqueue_ms = []
        next_at = time.monotonic()
        for _ in range(jobs):
            next_at += 1 / rate
            time.sleep(max(0.0, next_at - time.monotonic()))
            began = time.perf_counter()
            ids.append(stamp.enqueue(time.time()).id)
            enqueue_ms.append((time.perf_counter() - began) * 1000)
        deadline = time.monotonic() + 30
        while self._unfinished(ids):
            group.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("latency jobs unfinished after 30 s")
            time.sleep(0.05)
        return ids, enqueue_ms

    def _latencies(self, ids: list[int]) -> dict[str, float]:
        """p50, p95, p99 and max of the stamp jobs' enqueue-to-start times, in ms."""
        rows = self.conn.execute(
            "SELECT (result #>> '{}')::float8 FROM leasejobs_job WHERE id = ANY(%s)", [ids]
        ).fetchall()
        ms = [float(r[0]) * 1000 for r in rows]
        return {
            "jobs": len(ms),
            "p50": percentile(ms, 50),
            "p95": percentile(ms, 95),
            "p99": percentile(ms, 99),
            "max": max(ms),
        }

    def _unfinished(self, ids: list[int]) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM leasejobs_job WHERE id = ANY(%s) AND status <> 'done'", [ids]
        ).fetchone()
        return int(row[0]) if row else 0

    def heartbeat_hot(self, jobs: int = 20, seconds: float = 6.0) -> dict[str, int]:
        """Updates and HOT updates of the jobs table while only heartbeats write.

        ``jobs`` sleeping jobs run under a 2 s lease with a heartbeat every
        0.2 s; the window starts once all run (and their claims' statistics
        are flushed) and ends before any finishes.
        """
        self.clear()
        sleep = self.tasks["sleep"]
        args = ["--concurrency", str(jobs), "--lease", "2", "--heartbeat", "0.2"]
        with self.workers(1, args) as group:
            sleep.bulk_enqueue([((seconds,), {})] * jobs)
            deadline = time.monotonic() + 30
            while self._running() < jobs:
                group.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError("heartbeat jobs did not all start")
                time.sleep(0.05)
            # Statistics reach pg_stat_user_tables up to a second late.
            time.sleep(1.5)
            before = self.table_stats()
            time.sleep(seconds - 3.0)
            after = self.table_stats()
        self.clear()
        return {"updates": after[0] - before[0], "hot_updates": after[1] - before[1]}

    def _running(self) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM leasejobs_job WHERE queue = %s AND status = 'running'", [QUEUE]
        ).fetchone()
        return int(row[0]) if row else 0


def _worker_args(concurrency: int, prefetch: int | None) -> list[str]:
    """``runworker``'s options for a measurement: ``--concurrency``, and ``--prefetch`` if given."""
    return ["--concurrency", str(concurrency)] + ([] if prefetch is None else ["--prefetch", str(prefetch)])


def median_of(runs: list[dict[str, Any]], key: str = "jobs_per_s") -> float:
    return float(statistics.median(r[key] for r in runs))


def to_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2, default=str)


def run_all(
    b: Bench, options: dict[str, Any], step: Callable[[str], None], warn: Callable[[str], None]
) -> dict[str, Any]:
    """Every figure the command's ``options`` ask for, as one JSON-able dict.

    ``step`` is told what starts next; ``warn`` what may spoil the figures.
    """
    workload = workload_of(options)
    ticks = cpu_ticks()
    results: dict[str, Any] = {
        "machine": machine(),
        "settings": {
            "jobs": options["jobs"],
            "repeat": options["repeat"],
            "prefetch": options["prefetch"],
            "worker_log_level": options["worker_log_level"],
            "workload": {"kind": workload.kind, "seconds": workload.seconds},
            "all_queues": b.all_queues,
        },
    }
    others = b.other_workers()
    if others:
        warn(
            f"warning: {others} other leasejobs worker(s) are connected to this database; "
            "if they listen to all queues they take bench jobs and fail them."
        )
    _enqueue_and_raw(b, options, results, step)
    results["processing"] = _processing(b, options, 0, step) if options["jobs"] else []
    if options["table_rows"] and options["jobs"]:
        step(f"insert {options['table_rows']:,} finished jobs")
        seconds = b.prefill(options["table_rows"])
        results["table"] = {"rows": options["table_rows"], "prefill_seconds": seconds}
        results["processing"] += _processing(b, options, options["table_rows"], step)
        results["table"]["claim_plan"] = b.claim_plan()
    if options["other_queue_jobs"] and options["jobs"]:
        n = options["other_queue_jobs"]
        step(f"queue {n:,} jobs the workers leave alone ({'paused' if b.all_queues else 'another'} queue)")
        try:
            b.park(n)
            results["processing"] += _processing(b, options, 0, step, other_queue_jobs=n)
        finally:
            b.unpark()
    if options["scheduled_jobs"] and options["latency_jobs"]:
        n = options["scheduled_jobs"]
        step(f"latency beside {n:,} jobs due tomorrow")
        try:
            b.park(n, due=False)
            results["latency_scheduled_ms"] = {
                **b.latency(options["latency_jobs"], options["latency_rate"], options["concurrency"][0]),
                "scheduled": n,
            }
        finally:
            b.unpark()
    if options.get("steps_jobs"):
        results["steps"] = _steps(b, options, step)
    _latency(b, options, results, step)
    if options.get("backlog"):
        _backlog(b, options, results, step)
    if options["hot"]:
        step("HOT updates while only heartbeats write")
        results["heartbeat_hot"] = b.heartbeat_hot()
    results["machine"]["steal"] = steal_share(ticks, cpu_ticks())
    return results


def _enqueue_and_raw(
    b: Bench, options: dict[str, Any], results: dict[str, Any], step: Callable[[str], None]
) -> None:
    """Enqueue jobs/s, and the raw-SQL limits of inserting and of claim + finish."""
    repeat, n = options["repeat"], options["enqueue_jobs"]
    if n:
        step(f"enqueue {n:,} jobs, single (taking turns with bare INSERTs on the same connection) and bulk")
        singles = [b.enqueue_one_by_one(n) for _ in range(repeat)]
        results["enqueue"] = {
            **{kind: statistics.median(run[kind] for run in singles) for kind in singles[0]},
            "single_runs": singles,  # each run's kinds took turns: their ratios pair up
            "bulk": statistics.median(b.enqueue_bulk(n) for _ in range(repeat)),
            "bulk_ids": statistics.median(b.enqueue_bulk(n, ids=True) for _ in range(repeat)),
        }
    if not options["raw_sql"]:
        return
    if n:
        step(f"raw SQL: insert {n:,} jobs, one and 1,000 per statement")
        results["raw_insert"] = {
            "single": statistics.median(raw.raw_insert(b.conn, n, 1) for _ in range(repeat)),
            "bulk": statistics.median(raw.raw_insert(b.conn, n, 1000) for _ in range(repeat)),
        }
    results["raw_sql"] = []
    for batch in options["raw_batches"]:
        for clients in options["raw_clients"]:
            jobs = options["raw_jobs"] or min(100_000, 10_000 * batch)
            step(f"raw SQL: {batch} per statement, {clients} client(s), {jobs:,} jobs")
            runs = [raw.raw_sql(b.conn, batch, clients, jobs) for _ in range(repeat)]
            results["raw_sql"].append(
                {"batch": batch, "clients": clients, "runs": runs, "median": statistics.median(runs)}
            )


def _latency(b: Bench, options: dict[str, Any], results: dict[str, Any], step: Callable[[str], None]) -> None:
    """Enqueue-to-start latency with an idle worker, and under load if asked."""
    jobs, rate, concurrency = options["latency_jobs"], options["latency_rate"], options["concurrency"][0]
    if not jobs:
        return
    step(f"latency: {jobs} jobs at {rate:g}/s")
    results["latency_ms"] = b.latency(jobs, rate, concurrency)
    if not options.get("latency_under_load"):
        return
    workers = max(options["workers"])
    load_rate = options.get("load_rate")
    if not load_rate:
        empty = _empty_table_rate(results, workers, concurrency)
        if empty is None:
            raise RuntimeError(
                "--latency-under-load needs --load-rate, or a no-op processing figure with "
                f"{workers} worker(s) x concurrency {concurrency}"
            )
        load_rate = empty / 2
    step(f"latency under load: {jobs} jobs at {rate:g}/s, {workers} worker(s) draining {load_rate:,.0f}/s")
    results["latency_under_load_ms"] = b.latency_under_load(
        jobs, rate, load_rate, workers, concurrency, options["prefetch"]
    )


def _backlog(b: Bench, options: dict[str, Any], results: dict[str, Any], step: Callable[[str], None]) -> None:
    """Backlogs drained while jobs arrive, each against the empty table's jobs/s measured just before it.

    The machine's speed drifts within minutes (two runs of the empty table a
    minute apart differ by a third), so each round measures its reference
    right before its drain, with the same workers: ``--repeat`` runs of
    ``--jobs`` no-op jobs on the empty table, their median. The figures are
    the medians of the rounds' drains and of their ratios.
    """
    workers, concurrency = max(options["workers"]), options["concurrency"][0]
    rows, arrive_rate = options["backlog"], options["arrive_rate"]
    rounds = []
    for n in range(options.get("backlog_rounds") or 1):
        empty = None
        if options["jobs"]:
            step(f"backlog round {n + 1}: the empty table first, {options['jobs']:,} no-op jobs")
            empty = median_of(
                [
                    b.process(options["jobs"], workers, concurrency, options["prefetch"])
                    for _ in range(options["repeat"])
                ]
            )
        step(
            f"backlog round {n + 1}: {rows:,} queued jobs drained by {workers} worker(s) while "
            f"{arrive_rate:,.0f} jobs/s arrive"
        )
        drained = b.backlog(rows, workers, concurrency, options["prefetch"], arrive_rate)
        rounds.append(_backlog_round(drained, empty))
        if options.get("backlog_without_vacuum"):
            step(f"backlog round {n + 1}: the same again, the workers with --no-vacuum")
            without = b.backlog(rows, workers, concurrency, options["prefetch"], arrive_rate, vacuum=False)
            rounds[-1]["without_vacuum"] = _backlog_round(without, empty)
    ratios = [r["of_empty"] for r in rounds if r["of_empty"] is not None]
    results["backlog"] = {
        "rows": rows,
        "arrive_rate": arrive_rate,
        "workers": workers,
        "concurrency": concurrency,
        "rounds": rounds,
        "jobs_per_s": median_of(rounds),
        "arrived": sum(r["arrived"] for r in rounds),
        "of_empty": float(statistics.median(ratios)) if ratios else None,
    }
    drains = [r["without_vacuum"] for r in rounds if "without_vacuum" in r]
    if drains:
        shares = [d["of_empty"] for d in drains if d["of_empty"] is not None]
        results["backlog"]["without_vacuum"] = {
            "jobs_per_s": median_of(drains),
            "of_empty": float(statistics.median(shares)) if shares else None,
        }


def _backlog_round(drained: dict[str, Any], empty: float | None) -> dict[str, Any]:
    return {
        "jobs_per_s": drained["jobs_per_s"],
        "arrived": drained["arrived"],
        "fill_seconds": drained["fill_seconds"],
        "empty": empty,
        "of_empty": drained["jobs_per_s"] / empty if empty else None,
        "timeline": drained["timeline"],
    }


def _empty_table_rate(results: dict[str, Any], workers: int, concurrency: int) -> float | None:
    """The best no-op jobs/s this run measured with ``workers`` x ``concurrency`` on the empty table."""
    medians = [
        float(f["median"])
        for f in results["processing"]
        if (f["workers"], f["concurrency"], f["table_rows"]) == (workers, concurrency, 0)
        and f["workload"] == "noop"
    ]
    return max(medians) if medians else None


def workload_of(options: dict[str, Any]) -> Workload:
    """The command's ``--workload`` with its ``--io-seconds`` or ``--cpu-seconds``."""
    kind = options.get("workload") or "noop"
    seconds = {"io": options.get("io_seconds"), "cpu": options.get("cpu_seconds")}.get(kind)
    return Workload(kind, float(seconds or 0.0))


def _processing(
    b: Bench,
    options: dict[str, Any],
    table_rows: int,
    step: Callable[[str], None],
    other_queue_jobs: int = 0,
) -> list[dict[str, Any]]:
    workload = workload_of(options)
    figures = []
    for level in options["worker_log_level"]:
        b.verbosity = VERBOSITY[level]
        for workers in options["workers"]:
            for concurrency in options["concurrency"]:
                step(
                    f"processing {options['jobs']:,} {workload.kind} jobs: {workers} worker(s) x concurrency "
                    f"{concurrency}, logging {level.upper()}"
                    + (f", {table_rows:,} finished rows in the table" if table_rows else "")
                    + (f", {other_queue_jobs:,} jobs of a queue left alone" if other_queue_jobs else ""),
                )
                runs = [
                    b.process(options["jobs"], workers, concurrency, options["prefetch"], workload=workload)
                    for _ in range(options["repeat"])
                ]
                figures.append(
                    {
                        "workers": workers,
                        "concurrency": concurrency,
                        "log_level": level,
                        "table_rows": table_rows,
                        "other_queue_jobs": other_queue_jobs,
                        "workload": workload.kind,
                        "ideal": workload.ideal(workers, concurrency),
                        "runs": [round(r["jobs_per_s"]) for r in runs],
                        "steal": [r["steal"] for r in runs],
                        "median": median_of(runs),
                        "updates": sum(r["updates"] for r in runs),
                        "hot_updates": sum(r["hot_updates"] for r in runs),
                        "database": dbcost.median([r["database"] for r in runs]),
                        "rss_mb": runs[-1]["rss_mb"],
                    }
                )
    b.verbosity = VERBOSITY[options["worker_log_level"][0]]
    return figures


def _steps(b: Bench, options: dict[str, Any], step: Callable[[str], None]) -> dict[str, Any]:
    """``--steps-jobs N``: N jobs of ten durable steps against 10 x N no-op jobs and N chains of
    ten no-op jobs (each enqueued by the one before), taking turns, with the first worker count
    and concurrency: each shape's drain time per N, the median of ``--repeat`` rounds."""
    jobs, per_job = options["steps_jobs"], STEPS_PER_JOB
    workers, concurrency = options["workers"][0], options["concurrency"][0]
    step(
        f"{jobs:,} jobs of {per_job} steps against {jobs * per_job:,} no-op jobs and {jobs:,} chains "
        f"of {per_job}: {workers} worker(s) x concurrency {concurrency}"
    )
    shapes: dict[str, list[float]] = {"plain": [], "chain": [], "steps": []}
    none: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
    plan: dict[str, tuple[str, list[tuple[tuple[Any, ...], dict[str, Any]]], int]] = {
        "plain": ("noop", [none] * (jobs * per_job), jobs * per_job),
        "chain": ("chain", [((per_job,), {})] * jobs, jobs * per_job),
        "steps": ("steps", [none] * jobs, jobs),
    }
    costs: dict[str, list[dict[str, Any]]] = {shape: [] for shape in plan}
    for _ in range(options["repeat"]):
        for shape, (name, calls, total) in plan.items():
            seconds, cost = _drain(
                b, name, calls, total, workers, concurrency, options["prefetch"], units=jobs
            )
            shapes[shape].append(seconds)
            costs[shape].append(cost)
    return {
        "jobs": jobs,
        "steps_per_job": per_job,
        "workers": workers,
        "concurrency": concurrency,
        **{
            shape: {
                "ms": [round(1000 * seconds / jobs, 3) for seconds in runs],
                "database": dbcost.median(costs[shape]),
            }
            for shape, runs in shapes.items()
        },
    }


def _drain(
    b: Bench,
    name: str,
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
    total: int,
    workers: int,
    concurrency: int,
    prefetch: int | None,
    timeout: float = 900,
    *,
    units: int,
) -> tuple[float, dict[str, Any]]:
    """Enqueue ``calls`` of bench task ``name`` at once and drain them and the ``total`` jobs they
    make: seconds from the first start to the last finish, and the database's cost per one of
    ``units`` (``bench/dbcost.py``)."""
    b.clear()
    ours = [b.conn.info.backend_pid, b.poll.info.backend_pid]
    with b.workers(workers, _worker_args(concurrency, prefetch)) as group:
        checkpointed = dbcost.checkpoint(b.conn)
        reading = dbcost.read(b.conn)
        cpu = dbcost.backend_cpu(b.conn, ours)
        with transaction.atomic(using=db_alias()):
            b.tasks[name].bulk_enqueue(calls)
        enqueued = dbcost.backend_cpu(b.conn, ours)
        connections[db_alias()].close()
        deadline = time.monotonic() + timeout
        while True:
            row = b.poll.execute(
                "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status <> 'done')"
                " FROM leasejobs_job WHERE queue = %s",
                [QUEUE],
            ).fetchone()
            assert row is not None
            if row[0] >= total and row[1] == 0:
                break
            group.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{total - row[0]} bench jobs still unfinished after {timeout:.0f} s")
            time.sleep(0.05)
        cpu_end = enqueued | dbcost.backend_cpu(b.conn, ours)
    b._wait_reported(list(cpu_end))
    cost = dbcost.per_job(reading, dbcost.read(b.conn), cpu, cpu_end, units, checkpointed=checkpointed)
    row = b.conn.execute(
        "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM leasejobs_job WHERE queue = %s",
        [QUEUE],
    ).fetchone()
    assert row is not None
    return float(row[0] or 0), cost
