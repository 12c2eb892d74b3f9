"""``manage.py demo``: the receipt story, reproduced, then prevented.

Runs the four scenarios of ``demo_site.receipts.story`` with real worker
processes, shows a live line per scenario while it runs, prints the table of
what happened, and says where to look next (the admin, with a superuser made
for a local database).
"""

import secrets
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from demo_site.receipts.story import FAST, FULL, SCENARIOS, Result, Scenario, Snapshot, Story, StoryError

COLUMNS = ("scenario", "body runs", "receipts sent", "stale writes rejected", "attempts")
LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1")
ADMIN_USER = "admin"

LEGEND = """\
body runs: how often the job's body started. receipts sent: emails in the outbox.
stale writes rejected: writes of an attempt that had lost the job, refused by its
fencing token: a side effect (ctx.side_effect raised LeaseLost) or a finish (the
worker dropped it). attempts: the job's last attempt, which is its fencing token.
In 4 the paused worker's body never tries a stale write: a worker that cannot renew
a lease has the body killed at the lease's end (its zygote does it while it is paused)."""


class Command(BaseCommand):
    help = (
        "Reproduce the double receipt with real workers (no heartbeat, no fencing), then show "
        "fencing, idempotency keys and heartbeats preventing it, and a paused worker's body stopped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--fast",
            action="store_true",
            help=f"Shorter timings, same outcomes (lease {FAST.lease:g} s, slow attempt {FAST.slow:g} s).",
        )
        parser.add_argument(
            "--log-dir",
            type=Path,
            metavar="DIR",
            help="Where the workers' logs go (default .leasejobs/demo-logs).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            raise CommandError("The database has unapplied migrations: run `python manage.py migrate` first.")
        timings = FAST if options["fast"] else FULL
        log_dir = options["log_dir"] or Path(settings.BASE_DIR) / ".leasejobs" / "demo-logs"
        live = LiveLine(self.stdout)
        story = Story(timings, log_dir, live.update)
        self.stdout.write(
            f"The story: a receipt job renders a PDF and emails it. The lease is {timings.lease:g} s, "
            f"but the PDF service\ntakes {timings.slow:g} s on the job's first attempt, so the lease "
            "runs out and another worker takes\nthe job over. Each scenario: one job and two runworker "
            "processes, demo-a and demo-b;\nthe first to claim the job gets the slow attempt."
        )
        results: list[Result] = []
        with _sigterm_as_interrupt():
            try:
                story.prepare()
                for scenario in SCENARIOS:
                    how = scenario.how.format(
                        lease=timings.lease, beat=timings.lease / 3, pause=timings.pause
                    )
                    self.stdout.write(f"\n{scenario.number}. {scenario.title}\n   {how}")
                    results.append(story.run(scenario))
                    live.end()
            except KeyboardInterrupt:
                live.end()
                raise CommandError(
                    "interrupted; every worker the demo started is stopped.", returncode=130
                ) from None
            except StoryError as exc:
                live.end()
                raise CommandError(str(exc)) from None
            finally:
                story.stop_all()
        self.stdout.write("")
        self.stdout.write(format_table(results))
        self.stdout.write("")
        self.stdout.write(LEGEND)
        self.stdout.write("")
        self._where_next(log_dir)

    def _where_next(self, log_dir: Path) -> None:
        self.stdout.write("Where to look next:")
        self.stdout.write("  .venv/bin/python manage.py runserver")
        self.stdout.write(
            "  http://127.0.0.1:8000/admin/leasejobs/job/       the demo's jobs, attempts and side effects"
        )
        self.stdout.write("  http://127.0.0.1:8000/admin/receipts/message/    the outbox: every receipt sent")
        host = connection.settings_dict["HOST"] or ""
        if host in LOCAL_HOSTS or host.startswith("/"):
            password = _reset_superuser()
            self.stdout.write(
                f"  log in as {ADMIN_USER} / {password} (a superuser, its password reset by each demo run)"
            )
        else:
            self.stdout.write(
                f"  no superuser made: the database is on {host}, not this machine; "
                "make one with: .venv/bin/python manage.py createsuperuser"
            )
        self.stdout.write(f"  the workers' logs: {log_dir}")


def _reset_superuser() -> str:
    """Create the demo's superuser, or give it a fresh password; return the password."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(**{user_model.USERNAME_FIELD: ADMIN_USER})
    password = secrets.token_urlsafe(9)
    user.is_staff = user.is_superuser = user.is_active = True
    user.set_password(password)
    user.save()
    return password


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C, so the workers are stopped before the demo exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def format_table(results: list[Result]) -> str:
    """The closing table: plain text, the scenario left-aligned, the counts right-aligned."""
    rows = [
        (f"{r.scenario.number} {r.scenario.title}", r.body_runs, r.receipts, r.stale_writes, r.attempts)
        for r in results
    ]
    cells = [COLUMNS, *[tuple(str(c) for c in row) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))])
        for row in cells
    )


def describe(s: Snapshot) -> str:
    """The live line's text: who holds the job, the lease time left, the attempt, what the bodies did."""
    if s.status == "running":
        left = s.seconds_left or 0.0
        lease = f"{left:.1f} s left" if left >= 0 else f"lease expired {-left:.1f} s ago"
        parts = [f"held by {s.holder}", lease]
    elif s.status == "queued":
        parts = ["queued"]
    else:
        parts = [f"{s.status} by {s.holder}"]
    runs = _plural(s.body_runs, "body run") + (f" ({s.bodies_running} running)" if s.bodies_running else "")
    parts += [f"attempt {s.attempt}", runs, _plural(s.receipts, "receipt") + " sent"]
    if s.note:
        parts.append(s.note)
    return " · ".join(parts)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class LiveLine:
    """One line per scenario: rewritten in place on a terminal, else a new line per change."""

    def __init__(self, out: OutputWrapper) -> None:
        self.out = out
        self.tty = out.isatty()
        self.last: tuple[Any, ...] | None = None
        self.open = False

    def update(self, scenario: Scenario, s: Snapshot) -> None:
        text = f"   scenario {scenario.number}  {describe(s)}"
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            self.out.write(f"\r{text[:width]}\x1b[K", ending="")
            self.out.flush()
            self.open = True
            return
        expired = s.seconds_left is not None and s.seconds_left < 0
        key = (
            scenario.number,
            s.status,
            s.holder,
            s.attempt,
            expired,
            s.body_runs,
            s.bodies_running,
            s.receipts,
        )
        if (*key, s.note) != self.last:
            self.out.write(text)
            self.last = (*key, s.note)

    def end(self) -> None:
        """Close the scenario's line (on a terminal the cursor is still on it)."""
        if self.open:
            self.out.write("")
            self.open = False
