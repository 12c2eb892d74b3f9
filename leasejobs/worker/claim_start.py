"""Where the worker's next claim starts: on from its last keys, and what a front look found.

A claim from the front of the claim index (``sql.CLAIM``) visits every entry
VACUUM has not removed yet. On a healthy database that is a handful; while
something pins the xmin horizon (a transaction left idle, a long report in
``REPEATABLE READ``) it is every job finished since, and each claim slows
with the pressure's age (388,631 buffers a look after two minutes at 5,000
jobs a second: docs/performance.md, "Steady under pressure"). So the worker
claims on from the last job it kept of each priority (``sql.CLAIM_AFTER``),
and from the front only when it has no key yet or ``--burst`` asks whether
anything is left.

What only the front shows (a job due before a key: an expired lease, a job
another worker gave back, one enqueued with an earlier ``run_at`` or
committed long after its statement; a priority the worker has not claimed
from) a walk from the front finds, due once the last one is ``FRONT_GAP``
times its own duration old (at most ``FRONT_GAP_MAX_SECONDS``): a job only
it finds waits 20 times its duration, a few milliseconds on a healthy
database, 10 s at most. While that walk is cheap the claimer makes it
itself, as a claim from the front: no statement more. Once it is not (a
pinned horizon keeps every entry of the jobs finished since: three walks in
a row each took over ``LEASEJOBS["FRONT_WALK_INLINE_MS"]``, 5 ms, less
``PER_ROW_SECONDS`` for each job it claimed), a front look finds the
same jobs beside the claims (``sql.FRONT_LOOK``, on a thread and a
connection of its own: ``leasejobs.worker.front_look``), asked for by a
claim, so an idle worker looks no more often than it claims; the claimer
moves the key of each priority it found to just before that job. A look
stuck past ``FRONT_GAP_MAX_SECONDS`` (its backend hung) is walked past: the
claimer walks from the front itself again when one is due. Until 4 December
the claimer made every walk itself, and under a pinned horizon its claims
waited for them.

A job whose transaction commits after later jobs were claimed (a Django
request that enqueues, then works on) lies behind the keys too. Its NOTIFY
carries its place (``leasejobs.db.sql.fragments.keyed_payload``), and the
listener hands it to ``heard``, which moves that priority's key back to just
before it: found by the next claim, not by the next walk (with producers
committing 0 to 30 ms after their INSERT, pickup p99 was 63 ms on a healthy
database and 297 ms under a pinned horizon; docs/performance.md, "Jobs that
commit late").

Each priority the worker has claimed from keeps its key, and costs each
claim from the keys one index probe (a few buffers) while it has no jobs.
The claimer calls everything here but ``looked``, which the look's thread
calls; a lock keeps the two apart.
"""

import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime

from leasejobs import conf
from leasejobs.db.store import ClaimedRow, ClaimKey

#: A job's place in claim order, as a keyed NOTIFY carries it: its priority and key.
Place = tuple[int, ClaimKey]

#: Jobs heard of during one claim kept one by one; past it, the earliest per priority.
HEARD_KEPT = 256

#: Walks from the front asked for by NOTIFYs (``walk_front``) are this far apart at
#: least: an operator's resume is one, a program sending them in a loop is not a
#: walk at every claim.
ASKED_WALK_GAP_SECONDS = 1.0

#: A front look is due again this many times its own duration after it began,
FRONT_GAP = 20
#: and never later than this: its duration is a statement's wall time, which a
#: reconnect's back-off, a lock wait or a pause of the worker can stretch.
FRONT_GAP_MAX_SECONDS = 10.0
#: A walk from the front is costly when it took longer than this, less
#: ``PER_ROW_SECONDS`` for each job it claimed (``LEASEJOBS["FRONT_WALK_INLINE_MS"]``'s
#: default). A walk that claims nothing takes under 1 ms on a healthy database;
#: under a pinned horizon it grows with the pin's age, past 5 ms within 20 s at
#: 2,500 jobs a second, and every millisecond of it delays the claims behind it.
INLINE_SECONDS = conf.DEFAULTS["FRONT_WALK_INLINE_MS"] / 1000
#: What claiming one job adds to a walk: a healthy claim from the front of
#: hundreds of jobs takes 10 to 30 ms on two busy cores (docs/performance.md).
PER_ROW_SECONDS = 0.0002
#: The next walk goes to the front look's thread after this many costly walks
#: in a row; one cheap walk (the claimer's or a look's) gives it back. One walk
#: stretched by a busy machine is not a pinned horizon.
COSTLY_IN_A_ROW = 3


class ClaimStart:
    """The keys a claim starts after, per priority, and when a front look is due."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, inline_seconds: float = INLINE_SECONDS
    ) -> None:
        self._clock = clock
        self._inline_seconds = inline_seconds
        #: Costly walks in a row that hand the next to a look; 0 (no walk is cheap): all do.
        self._in_a_row = COSTLY_IN_A_ROW if inline_seconds > 0 else 0
        self._lock = threading.Lock()
        self._keys: dict[int, ClaimKey] = {}
        self._front_due = 0.0
        #: Costly walks from the front in a row, the claimer's or the looks'.
        self._costly_walks = 0
        #: When the look under way began (None: none is).
        self._look_began: float | None = None
        #: What finished looks found, for the claimer to take in: (priority, job's key).
        self._found: list[tuple[int, ClaimKey]] = []
        #: Priorities whose key went back since the look under way began (None: all).
        self._went_back: set[int] | None = set()
        #: A claim from the keys took jobs since the last walk from the front.
        self._took_since_walk = False
        #: The jobs ``heard`` of since the claim under way began: its rows, read before
        #: those jobs committed, must not move the keys past the ones it did not take.
        self._heard: list[Place] = []
        #: Past ``HEARD_KEPT`` of them (a worker with no room claims nothing while a
        #: million jobs are announced), the earliest of each priority only: moving a
        #: key back to it never skips a job, and may walk again what the claim took.
        self._heard_earliest: dict[int, ClaimKey] = {}
        #: A NOTIFY asked for a walk from the front (``walk_front``), not made yet; when
        #: the last asked walk began; whether the claim under way is one.
        self._front_asked = False
        self._asked_at = -math.inf
        self._asked_walk = False

    def after(self, *, front: bool = False) -> dict[int, ClaimKey] | None:
        """The keys the next claim starts after; None: from the front (``front`` or
        ``walk_front`` asks for it; a walk is due and cheap, or due with the look
        under way stuck).

        Each job a finished look found moves its priority's key to just before
        it, unless that key went back since the look began (``claimed``): what
        it went back to may lie before the job, and a key never skips a job it
        was before (the next look finds the job instead).
        """
        now = self._clock()
        with self._lock:
            self._heard.clear()
            self._heard_earliest.clear()
            found, self._found = self._found, []
            for priority, key in found:
                self._keys[priority] = ClaimKey(key.run_at, key.id - 1)
            asked = self._front_asked and now - self._asked_at >= ASKED_WALK_GAP_SECONDS
            if asked:
                self._front_asked, self._asked_at, self._asked_walk = False, now, True
            if front or asked or not self._keys:
                return None
            if now >= self._front_due:
                if self._look_began is None and self._costly_walks < self._in_a_row:
                    return None  # walks are cheap: the claimer's own
                if self._look_began is not None and now - self._look_began > FRONT_GAP_MAX_SECONDS:
                    return None  # the look under way is stuck
            return dict(self._keys)

    def walk_due_in(self) -> float | None:
        """Seconds until a walk from the front is due, when the claimer makes its walks and
        claims from the keys took jobs since the last one; else None.

        The claim loop waits no longer than this: once the keys run dry (a
        priority it has not claimed from, a job given back behind them), what
        only the front shows is due within milliseconds, not a poll interval.
        An idle worker, whose claims took nothing since its last walk, walks no
        more often than it polls.
        """
        with self._lock:
            if (
                not self._took_since_walk
                or self._look_began is not None
                or self._costly_walks >= self._in_a_row
            ):
                return None
            return max(0.0, self._front_due - self._clock())

    def look_due(self) -> dict[int, ClaimKey] | None:
        """The keys a front look should compare against, when a walk is due, too costly
        for the claimer, and no look is under way (the caller then starts one); else None."""
        now = self._clock()
        with self._lock:
            if (
                self._look_began is not None
                or not self._keys
                or now < self._front_due
                or self._costly_walks < self._in_a_row
            ):
                return None
            self._look_began = now
            self._went_back = set()
            return dict(self._keys)

    def looked(self, seconds: float, found: Iterable[tuple[int, ClaimKey]], *, failed: bool = False) -> bool:
        """The look under way took ``seconds`` and found these jobs (one per priority at
        most); True when the claimer should claim again to take them. A look that
        ``failed`` leaves the next walk to the claimer."""
        with self._lock:
            began = self._look_began if self._look_began is not None else self._clock()
            self._look_began = None
            self._front_due = max(self._front_due, began + min(FRONT_GAP * seconds, FRONT_GAP_MAX_SECONDS))
            self._walked(0.0 if failed else seconds, rows=0)
            went_back = self._went_back
            kept = [(p, key) for p, key in found if went_back is not None and p not in went_back]
            self._found.extend(kept)
            return bool(kept)

    def heard(self, places: Iterable[Place]) -> bool:
        """Jobs a NOTIFY announced, each by its priority and key: each that lies behind
        its priority's key moves the key back to just before it. True when one lay
        behind its key (a key made for a priority that had none says nothing of that).

        A priority with no key gets one (the claims from the keys would not walk
        it), unless no priority has one: the next claim walks from the front.
        Like a job given back (``claimed``), a key that went back drops what the
        look under way finds for its priority, and what looks found and the
        claimer has not taken in yet is kept by moving the key to the earliest.
        Keys that cannot be compared (a ``run_at`` text Python cannot read) stay.
        """
        moved = False
        with self._lock:
            for priority, job in places:
                back = ClaimKey(job.run_at, job.id - 1)
                self._hear(priority, job)  # a claim under way may not see it
                if not self._keys:
                    continue
                current = self._keys.get(priority)
                if current is not None and _before(back, current) is not True:
                    continue
                for found_priority, found in self._found:
                    if found_priority == priority and _before(found, back):
                        back = ClaimKey(found.run_at, found.id - 1)
                self._found = [(p, key) for p, key in self._found if p != priority]
                if self._went_back is not None:
                    self._went_back.add(priority)
                self._keys[priority] = back
                moved = moved or current is not None
        return moved

    def asked_walk_in(self) -> float | None:
        """Seconds until a walk asked for may be made (None: none is asked for): the
        claim loop waits no longer."""
        with self._lock:
            if not self._front_asked:
                return None
            return max(0.0, self._asked_at + ASKED_WALK_GAP_SECONDS - self._clock())

    def walk_front(self) -> None:
        """Make the next claim a walk from the front, however costly walks have been
        (``ASKED_WALK_GAP_SECONDS`` after the last one asked for, at the soonest).

        Asked for by a NOTIFY that jobs may lie behind every key: a queue resumed
        (its jobs were passed over while it was paused), its limits changed. Those
        are an operator's, a few a day; the walk they cost is one claim's. A walk
        that came back full (jobs before them filled the room) is asked for again:
        the priorities it did not reach keep keys past the resumed jobs."""
        with self._lock:
            self._front_asked = True

    def claimed(
        self,
        after: dict[int, ClaimKey] | None,
        began: float,
        seconds: float,
        rows: Sequence[ClaimedRow],
        given_back: Collection[int],
        *,
        full: bool = False,
    ) -> None:
        """A claim that started after ``after`` (None: the front) at ``began`` (this
        object's clock) and took ``seconds`` returned ``rows``, in claim order; the jobs
        of ``given_back`` (ids) went back to the queue unrun; ``full``: as many rows as
        it asked for.

        Each priority's key becomes its last row, or, if one of its rows went back,
        the place just before the first of those, so the next claim finds it again.
        A claim from the front is a walk (the next is due after it; its cost says
        who makes the next) and may move any key back.
        """
        # Each priority's last row is remembered and made a key once: a key per row
        # cost the worker 0.4 µs a job, on claims of hundreds of rows.
        last: dict[int, tuple[str | datetime, int]] = {}
        stopped: dict[int, ClaimKey] = {}
        for row in rows:
            if row.priority in stopped or row.run_at is None:
                continue
            if row.id in given_back:
                stopped[row.priority] = ClaimKey(row.run_at, row.id - 1)
            else:
                last[row.priority] = (row.run_at, row.id)
        with self._lock:
            if after is None and self._asked_walk:
                self._asked_walk = False
                self._front_asked = self._front_asked or full
            # What a look found is dropped where a key went back before the claimer took it in.
            if after is None:
                self._front_due = max(
                    self._front_due, began + min(FRONT_GAP * seconds, FRONT_GAP_MAX_SECONDS)
                )
                self._walked(seconds, rows=len(rows))
                self._went_back = None
                self._found.clear()
                self._took_since_walk = False
            elif rows:
                self._took_since_walk = True
            if after is not None and stopped:
                if self._went_back is not None:
                    self._went_back.update(stopped)
                self._found = [(p, key) for p, key in self._found if p not in stopped]
            self._keys.update({p: ClaimKey(*key) for p, key in last.items() if p not in stopped})
            self._keys.update(stopped)
            # A job heard of during the claim and taken by it is behind the key, as it
            # should be: walking past it again would cost every next claim its rows.
            taken = {row.id for row in rows} - set(given_back)
            earliest = [(p, ClaimKey(k.run_at, k.id + 1)) for p, k in self._heard_earliest.items()]
            for priority, job in self._heard + earliest:
                back, current = ClaimKey(job.run_at, job.id - 1), self._keys.get(priority)
                if job.id in taken and priority not in self._heard_earliest:
                    continue
                if (self._keys and current is None) or (current and _before(back, current) is True):
                    self._keys[priority] = back

    def _hear(self, priority: int, job: ClaimKey) -> None:
        """Keep a job heard of for the claim under way (lock held), in bounded memory."""
        if len(self._heard) < HEARD_KEPT:
            self._heard.append((priority, job))
            return
        for p, kept in [*self._heard, (priority, job)]:
            back, earliest = ClaimKey(kept.run_at, kept.id - 1), self._heard_earliest.get(p)
            if earliest is None or _before(back, earliest) is True:
                self._heard_earliest[p] = back
        self._heard.clear()

    def _walked(self, seconds: float, *, rows: int) -> None:
        """Count a walk from the front that took ``seconds`` and claimed ``rows`` (lock held)."""
        if seconds - rows * PER_ROW_SECONDS > self._inline_seconds:
            self._costly_walks += 1
        else:
            self._costly_walks = 0


def _before(a: ClaimKey, b: ClaimKey) -> bool | None:
    """Whether key ``a`` comes before ``b`` in claim order; None when a ``run_at``
    cannot be read (text in a ``DateStyle`` other than ISO, a year past 9999)."""
    try:
        a_at, b_at = (
            key.run_at if isinstance(key.run_at, datetime) else datetime.fromisoformat(key.run_at)
            for key in (a, b)
        )
        return (a_at, a.id) < (b_at, b.id)
    except (ValueError, TypeError):
        return None
