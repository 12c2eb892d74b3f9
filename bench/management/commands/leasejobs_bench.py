"""``manage.py leasejobs_bench``: enqueue and process no-op jobs, print the figures.

The bench itself is the rest of the ``bench`` package, this repository's
app beside the library: see it for what is measured and how, and
docs/performance.md for figures and how to read them.
"""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from bench import late_commit, offered, pressure
from bench.db import machine
from bench.plot import plot, plot_backlog, plot_offered, plot_pressure
from bench.report import render
from bench.run import VERBOSITY, Bench, run_all, to_json
from leasejobs.management.arguments import non_negative_int, positive_float, positive_int, positive_ints


def _log_levels(text: str) -> list[str]:
    """An argparse type: warning, info, or both separated by a comma."""
    levels = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not levels or any(level not in VERBOSITY for level in levels):
        raise ValueError(text)
    return levels


_log_levels.__name__ = "log level (warning, info, or warning,info)"


def _phases(text: str) -> list[float]:
    """An argparse type: three positive numbers of seconds separated by commas."""
    parts = [float(part) for part in text.split(",")]
    if len(parts) != 3 or any(part <= 0 for part in parts):
        raise ValueError(text)
    return parts


_phases.__name__ = "phases (three positive numbers of seconds: clean,pressure,after)"


class Command(BaseCommand):
    help = (
        "Benchmark leasejobs on this database: enqueue (single and bulk), processing no-op jobs "
        "with real runworker processes, and enqueue-to-start latency (p50, p95, p99). Run it "
        "against a database no other worker uses."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--jobs",
            type=non_negative_int,
            default=10_000,
            help="Jobs per processing run (10,000; 0 skips).",
        )
        parser.add_argument(
            "--workers",
            type=positive_ints,
            default=[1, 2],
            metavar="N[,N...]",
            help="Worker processes; a list measures each (default 1,2).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_ints,
            default=[4],
            metavar="N[,N...]",
            help="Bodies at once per worker, each in a child process; a list measures each "
            "(default 4, runworker's default).",
        )
        parser.add_argument(
            "--prefetch", type=non_negative_int, metavar="N", help="Passed to runworker (default: its own)."
        )
        parser.add_argument(
            "--repeat",
            type=positive_int,
            default=3,
            metavar="N",
            help="Runs per figure; the median is shown (3).",
        )
        parser.add_argument(
            "--workload",
            choices=["noop", "io", "cpu"],
            default="noop",
            help="What each processing job does: nothing (noop, the default), wait on I/O (io: "
            "--io-seconds of time.sleep) or compute (cpu: --cpu-seconds of pure Python). io and cpu "
            "show the ideal beside the figure: every runner always waiting, or one busy core per process.",
        )
        parser.add_argument(
            "--io-seconds", type=positive_float, default=0.05, help="An io job's wait (0.05)."
        )
        parser.add_argument(
            "--cpu-seconds", type=positive_float, default=0.005, help="A cpu job's CPU time (0.005)."
        )
        parser.add_argument(
            "--enqueue-jobs",
            type=non_negative_int,
            default=10_000,
            help="Jobs per enqueue figure (10,000; 0 skips).",
        )
        parser.add_argument(
            "--latency-jobs",
            type=non_negative_int,
            default=200,
            help="Jobs for the latency figure (200; 0 skips).",
        )
        parser.add_argument(
            "--latency-rate", type=positive_float, default=20.0, help="Latency jobs enqueued per second (20)."
        )
        parser.add_argument(
            "--latency-under-load",
            action="store_true",
            help="Also measure the latency while the most workers of --workers drain no-op jobs "
            "enqueued at --load-rate (default: half the jobs/s this run measured with them).",
        )
        parser.add_argument(
            "--load-rate", type=positive_float, metavar="JOBS/S", help="The load of --latency-under-load."
        )
        parser.add_argument(
            "--raw-sql",
            action="store_true",
            help="Also measure bare claim + finish statements through psycopg: the limit in this run.",
        )
        parser.add_argument(
            "--raw-batches", type=positive_ints, default=[1, 10, 50], metavar="N[,N...]", help="(1,10,50)"
        )
        parser.add_argument(
            "--raw-clients", type=positive_ints, default=[1, 2], metavar="N[,N...]", help="(1,2)"
        )
        parser.add_argument(
            "--raw-jobs",
            type=non_negative_int,
            default=0,
            help="Jobs per raw run (default: 10,000 x batch, <= 100,000).",
        )
        parser.add_argument(
            "--table-rows",
            type=non_negative_int,
            default=0,
            metavar="N",
            help="Then insert N finished jobs and measure processing again (and show the claim plan).",
        )
        parser.add_argument(
            "--other-queue-jobs",
            type=non_negative_int,
            default=0,
            metavar="N",
            help="Then queue N due jobs an hour old in a queue the workers leave alone (another queue, "
            "or a paused one with --all-queues) and measure processing again.",
        )
        parser.add_argument(
            "--scheduled-jobs",
            type=non_negative_int,
            default=0,
            metavar="N",
            help="Then queue N jobs due tomorrow and measure the idle latency again beside them.",
        )
        parser.add_argument(
            "--all-queues",
            action="store_true",
            help="Run the workers on every queue, as runworker does by default (no --queue); the "
            "database must hold no other due jobs.",
        )
        parser.add_argument(
            "--backlog",
            type=non_negative_int,
            default=0,
            metavar="N",
            help="Then queue N no-op jobs at once and drain them with the most workers of --workers "
            "while more arrive at --arrive-rate; shown against the empty table's figure, measured "
            "(--repeat runs of --jobs) right before the drain.",
        )
        parser.add_argument(
            "--backlog-rounds",
            type=positive_int,
            default=1,
            metavar="N",
            help="Measure --backlog N times, each right after its own empty-table figure (1).",
        )
        parser.add_argument(
            "--backlog-without-vacuum",
            action="store_true",
            help="In each --backlog round, drain the backlog a second time with workers that do not "
            "VACUUM the job table (runworker --no-vacuum), against the same empty-table figure.",
        )
        parser.add_argument(
            "--arrive-rate",
            type=positive_float,
            default=1000.0,
            metavar="JOBS/S",
            help="Jobs enqueued per second during the --backlog drain (1,000).",
        )
        parser.add_argument(
            "--steps-jobs",
            type=non_negative_int,
            default=0,
            metavar="N",
            help="Also measure N jobs of ten durable steps (ctx.step) against 10 x N no-op jobs in the "
            "same run, with the first of --workers and --concurrency, --repeat pairs (0: skip).",
        )
        parser.add_argument(
            "--hot",
            action="store_true",
            help="Also measure HOT updates in a window where only heartbeats write (~10 s).",
        )
        parser.add_argument(
            "--worker-log-level",
            type=_log_levels,
            default=["info"],
            metavar="LEVEL[,LEVEL]",
            help="The workers' log level: info (runworker's default: start, stop, retries, failures, "
            "no line per successful job; to a file) or warning (runworker -v 0); warning,info "
            "measures processing at both.",
        )
        parser.add_argument(
            "--workflow",
            type=non_negative_int,
            default=0,
            metavar="N",
            help="Only measure a workflow: a fan-out/fan-in of N no-op jobs (one root, N - 2 after it, "
            "one callback after those) against the same N jobs without edges, alternating --repeat "
            "times, with the first of --workers and --concurrency (0: skip, the default).",
        )
        parser.add_argument(
            "--pressure",
            choices=pressure.KINDS,
            help="Only measure steadiness under database pressure: the most workers of --workers take "
            "no-op jobs offered at --rate through a clean phase, a pressure phase and an after phase "
            "(--phases): long-transaction (a session idle in a transaction holding an xid), analytics "
            "(four REPEATABLE READ sessions scanning the job table in a loop), scans (the same scans without "
            "a snapshot held between them) or none (a control run). "
            "--plot draws the run over time.",
        )
        parser.add_argument(
            "--rate",
            type=positive_float,
            metavar="JOBS/S",
            help="The load of --pressure (default: half the no-op drain rate measured first, the median "
            "of --repeat runs of --jobs); with --offered-load, the sustainable rate (no search).",
        )
        parser.add_argument(
            "--phases",
            type=_phases,
            default=[60.0, 180.0, 60.0],
            metavar="CLEAN,PRESSURE,AFTER",
            help="Seconds of each --pressure phase (60,180,60).",
        )
        parser.add_argument(
            "--late-commit",
            action="store_true",
            help="Only measure jobs that commit late: --producers threads each enqueue one no-op job per "
            "transaction and commit it 0 to --commit-delay ms later (a Django request working on after "
            "its enqueue), 100 jobs/s each; the most workers of --workers take them through a clean "
            "phase and one with a session idle in a transaction holding an xid (the first two of "
            "--phases); pickup latency is counted from each job's commit.",
        )
        parser.add_argument(
            "--producers",
            type=positive_int,
            default=8,
            metavar="N",
            help="Producer threads of --late-commit (8).",
        )
        parser.add_argument(
            "--commit-delay",
            type=positive_float,
            default=30.0,
            metavar="MS",
            help="The longest a --late-commit producer waits between its INSERT and its commit (30).",
        )
        parser.add_argument(
            "--offered-load",
            type=positive_ints,
            metavar="PERCENT[,PERCENT...]",
            help="Only measure pickup latency (p50, p95, p99, per level and over time) at a fixed offered "
            "load of 1 ms jobs with a 256-byte payload, inserted in bulk, at these percentages of the "
            "sustainable rate (the highest at which p99 stays under 100 ms), e.g. 50,100,150: first the "
            "drain rate of these jobs (the median of --repeat runs of --jobs), then a search for the "
            "sustainable rate from it (unless --rate gives it), then each level, with the most workers of "
            "--workers. --plot draws the latency over time per level.",
        )
        parser.add_argument(
            "--probe-seconds",
            type=positive_float,
            help="Measured seconds of each --offered-load search probe, after 5 s of load "
            "(default: --level-seconds; a rate that holds for less may not hold for a level).",
        )
        parser.add_argument(
            "--level-seconds",
            type=positive_float,
            default=30.0,
            help="Measured seconds of each --offered-load level, after 5 s of load (30).",
        )
        parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
        parser.add_argument(
            "--plot",
            metavar="FILE.png",
            help="Draw processing jobs/s against concurrency, one line per worker count; with --pressure, "
            "the run over time; with --offered-load, the latency over time per level (needs matplotlib).",
        )
        parser.add_argument(
            "--plot-backlog",
            metavar="FILE.png",
            help="Draw each --backlog drain's jobs/s as it goes (needs matplotlib).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for option in ("plot", "plot_backlog"):
            if options[option]:
                try:
                    import matplotlib  # noqa: F401
                except ImportError:
                    flag = "--" + option.replace("_", "-")
                    raise CommandError(f"{flag} needs matplotlib: pip install matplotlib") from None
        if options["plot_backlog"] and not options["backlog"]:
            raise CommandError("--plot-backlog draws the --backlog drains: give --backlog N.")
        b = Bench(
            verbosity=VERBOSITY[options["worker_log_level"][0]],
            progress=not options["json"],
            all_queues=options["all_queues"],
        )
        if options["workflow"]:
            self._workflow(b, options)
            return
        if options["pressure"]:
            self._pressure(b, options)
            return
        if options["offered_load"]:
            self._offered(b, options)
            return
        if options["late_commit"]:
            self._late_commit(b, options)
            return
        try:
            results = run_all(b, options, lambda text: self._step(options, text), self.stderr.write)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        finally:
            b.close()
        if options["json"]:
            self.stdout.write(to_json(results))
        else:
            self.stdout.write(render(results))
        if options["plot"]:
            plot(results, options["plot"])
            self.stderr.write(f"plot written to {options['plot']}")
        if options["plot_backlog"]:
            plot_backlog(results, options["plot_backlog"])
            self.stderr.write(f"plot written to {options['plot_backlog']}")

    def _workflow(self, b: Bench, options: dict[str, Any]) -> None:
        """``--workflow N``: the fan-out/fan-in against plain jobs, and nothing else."""
        from bench import workflows

        try:
            result = workflows.compare(
                b,
                options["workflow"],
                options["workers"][0],
                options["concurrency"][0],
                options["prefetch"],
                options["repeat"],
            )
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        finally:
            b.close()
        self.stdout.write(to_json(result) if options["json"] else workflows.render(result))

    def _pressure(self, b: Bench, options: dict[str, Any]) -> None:
        """``--pressure KIND``: the clean, pressure and after phases, and nothing else."""
        try:
            result = {
                "machine": machine(),
                **pressure.run(b, options, lambda text: self._step(options, text)),
            }
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        finally:
            b.close()
        self.stdout.write(to_json(result) if options["json"] else pressure.render(result))
        if options["plot"]:
            plot_pressure(result, options["plot"])
            self.stderr.write(f"plot written to {options['plot']}")

    def _late_commit(self, b: Bench, options: dict[str, Any]) -> None:
        """``--late-commit``: jobs committed late, clean and under a pinned horizon, and nothing else."""
        try:
            result = {
                "machine": machine(),
                **late_commit.run(b, options, lambda text: self._step(options, text)),
            }
        finally:
            b.close()
        self.stdout.write(to_json(result) if options["json"] else late_commit.render(result))

    def _offered(self, b: Bench, options: dict[str, Any]) -> None:
        """``--offered-load P[,P...]``: the sustainable rate and each level, and nothing else."""
        try:
            result = {
                "machine": machine(),
                **offered.run(b, options, lambda text: self._step(options, text)),
            }
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        finally:
            b.close()
        self.stdout.write(to_json(result) if options["json"] else offered.render(result))
        if options["plot"] and result["levels"]:
            plot_offered(result, options["plot"])
            self.stderr.write(f"plot written to {options['plot']}")

    def _step(self, options: dict[str, Any], text: str) -> None:
        if not options["json"] and options["verbosity"] > 0:
            self.stderr.write(f"... {text}")
