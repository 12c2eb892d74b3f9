"""The queue's tables: one row per job, one row per recorded side effect.

The worker never reads or writes these through the ORM (its statements are
in ``leasejobs.db.sql``); the models exist for migrations, the admin and the
users' own queries.

Schema choices that matter for a hot queue table:
- the claim is served by a small partial index over unfinished rows only,
  whose predicate (``finished_at IS NULL``) a claim does not change: a claim
  is a HOT update, like a heartbeat;
- ``lease_until`` and ``heartbeat_at`` are in no index, so a heartbeat is a
  HOT update (no index writes, and the page's free space is reused, which
  the table's fillfactor leaves room for — see the migration);
- a job's row versions carry no byte they need not, since each is written to
  the WAL: ``errors`` and ``worker_ids`` are NULL until there is an entry
  (``JsonList``), ``heartbeat_at`` until the attempt's first heartbeat, and
  the latest claim's worker is in ``leased_by`` only (docs/performance.md);
- ``SideEffect.key`` is unique: that constraint, not a read-then-write, is
  what makes a side effect happen at most once.
"""

from typing import Any

from django.db import models
from django.db.models import F, Func, Q
from django.db.models.fields.json import KeyTransform

#: Queued or running jobs, as the claim index's predicate: a filter that
#: includes it is served by that index instead of scanning the history.
UNFINISHED = Q(finished_at__isnull=True)


class JsonList(models.JSONField):
    """A JSON list stored as NULL while it is empty, and read back as a list.

    Each of a job's row versions goes to the WAL, and ``[]`` took 5 bytes in
    every one of them where NULL takes none (a bit of the row's null bitmap).
    Python sees a list either way; SQL that reads the column says
    ``COALESCE(column, '[]')`` where it needs one, and so does a filter:
    ``errors=[]`` matches no row stored empty (``errors__isnull=True`` does).
    """

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        value = super().from_db_value(value, expression, connection)
        # The column itself only: a key transform (``errors__0``) keeps its None.
        return [] if value is None and not isinstance(expression, KeyTransform) else value

    def get_db_prep_save(self, value: Any, connection: Any) -> Any:
        # None, not a JSON null: JSONField stores None as SQL NULL on save only.
        return None if value == [] else super().get_db_prep_save(value, connection)


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    id = models.BigAutoField(primary_key=True)
    task_name = models.CharField(max_length=255)
    queue = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0, help_text="Higher runs first.")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    attempt = models.IntegerField(
        default=0, help_text="Claims so far; also the fencing token of the current claim."
    )
    max_attempts = models.IntegerField(default=5)
    runs = models.IntegerField(
        default=0,
        db_default=0,
        help_text="Attempts whose body started; these, not claims, count toward max_attempts.",
    )
    run_at = models.DateTimeField(help_text="Not claimed before this time.")
    lease_until = models.DateTimeField(null=True, blank=True)
    leased_by = models.CharField(max_length=255, blank=True, default="")
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="The attempt's last heartbeat; empty until its first."
    )
    cancel_requested = models.BooleanField(default=False)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    errors = JsonList(
        null=True, default=list, blank=True, help_text="One entry per failed attempt, with its traceback."
    )
    worker_ids = JsonList(
        null=True,
        default=list,
        blank=True,
        help_text="Workers of the earlier attempts, in order; the latest's is leased_by.",
    )
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text="When the latest attempt was claimed.")
    finished_at = models.DateTimeField(null=True, blank=True)
    concurrency_key = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="At most concurrency_limit jobs with this key run at once.",
    )
    concurrency_limit = models.IntegerField(null=True, blank=True)
    trace_context = models.JSONField(
        null=True,
        blank=True,
        help_text="W3C trace context of the enqueue, when tracing is on.",
    )
    snoozes = models.IntegerField(
        default=0,
        db_default=0,
        help_text="Times the body raised Snooze; those claims do not count toward max_attempts.",
    )
    retry_policy = models.JSONField(
        null=True, blank=True, help_text="A retry policy given with .using(retry=...); else the task's."
    )
    #: The workflow this job is a node of (``leasejobs.workflow``), or None.
    workflow_id = models.BigIntegerField(null=True, blank=True)
    #: Parents not yet settled: the job is never due (``run_at`` in year 9999)
    #: until the finish of its last parent brings this to 0.
    pending_parents = models.IntegerField(
        default=0, db_default=0, help_text="Parents in its workflow not yet done."
    )

    class Meta:
        db_table = "leasejobs_job"
        # Besides these, migrations 0012 and 0014 make leasejobs_job_task_bloom, a
        # BRIN bloom index on task_name for the admin's search by task name
        # (leasejobs.admin.task_search), in SQL: Django's BrinIndex would ask
        # every project to install django.contrib.postgres.
        indexes = [
            # The claim's index: only unfinished (queued and running) rows, in
            # claim order. Its predicate names finished_at, not status, so a
            # claim (which changes status and leaves finished_at NULL) is a
            # HOT update: no index entry written (see the check below).
            models.Index(
                fields=["-priority", "run_at", "id"],
                name="leasejobs_job_claim",
                condition=Q(finished_at__isnull=True),
            ),
            # Pruning and the admin's "recently finished" views.
            models.Index(
                fields=["finished_at"],
                name="leasejobs_job_finished",
                condition=Q(finished_at__isnull=False),
            ),
            # A workflow's jobs; plain jobs (NULL) are not in it, so their
            # updates write nothing to it.
            models.Index(
                fields=["workflow_id"],
                name="leasejobs_job_workflow",
                condition=Q(workflow_id__isnull=False),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"],
                name="leasejobs_job_idempotency_key",
                condition=Q(idempotency_key__isnull=False),
            ),
            # What the two partial indexes rely on: a job is queued or running
            # exactly when it has no finished_at. A write that breaks it (a
            # hand-written UPDATE) fails, instead of hiding a job from claims.
            models.CheckConstraint(
                condition=Q(status__in=["queued", "running"], finished_at__isnull=True)
                | Q(status__in=["done", "failed", "cancelled"], finished_at__isnull=False),
                name="leasejobs_job_finished_iff_ended",
            ),
        ]

    @property
    def attempt_workers(self) -> list[str]:
        """The worker of each claim, in order.

        A claim writes its worker to ``leased_by`` only; ``worker_ids`` gets a
        holder when the next claim replaces it, so a job claimed once carries
        one copy of its worker id in each row version (the WAL of a job,
        docs/performance.md). Rows claimed before migration 0013 list every
        claim's worker, the latest included; those are read as they are.
        """
        workers = [str(w) for w in self.worker_ids] if isinstance(self.worker_ids, list) else []
        if self.leased_by and len(workers) < self.attempt:
            workers.append(self.leased_by)
        return workers

    def __str__(self) -> str:
        return f"{self.task_name}#{self.id} ({self.status}, attempt {self.attempt})"


class SideEffect(models.Model):
    """The dedupe memory of side effects: one row per key, ever.

    ``fencing_token`` is the attempt that recorded it. Rows outlive their job
    (``job`` becomes NULL when the job is pruned) so a key stays used.
    """

    id = models.BigAutoField(primary_key=True)
    # The database-level ON DELETE SET NULL is added by the migration, so raw
    # deletes (pruning) keep the key too.
    job = models.ForeignKey(
        Job,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
        related_name="side_effects",
    )
    key = models.CharField(max_length=255, unique=True)
    fencing_token = models.IntegerField()
    data = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "leasejobs_sideeffect"

    def __str__(self) -> str:
        return f"{self.key} (token {self.fencing_token})"


class Step(models.Model):
    """One durable step of a job (``ctx.step``, ``ctx.sleep``, ``ctx.wait_for``): the
    memory that lets a later attempt pass what an earlier one completed.

    Written only in a fenced transaction of the attempt that holds the job
    (``attempt`` is that attempt). ``kind``: ``step`` (``result`` is the
    function's JSON result), ``sleep`` (``wake_at`` is when it ends) or
    ``wait`` (for ``event_key``; ``done`` once the event was received, its
    ``event_id`` and payload in ``result``, or once it timed out at
    ``wake_at`` with no event). Deleted with the job (``ON DELETE CASCADE``,
    added by the migration, so raw deletes such as pruning take them too).
    """

    pk = models.CompositePrimaryKey("job_id", "name")
    job = models.ForeignKey(
        Job, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="steps"
    )
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=8)
    attempt = models.IntegerField(help_text="The attempt that wrote it.")
    result = models.JSONField(null=True, blank=True)
    event_key = models.CharField(max_length=255, null=True, blank=True)
    event_id = models.BigIntegerField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    done = models.BooleanField(default=True)
    created_at = models.DateTimeField()
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "leasejobs_step"
        indexes = [
            # The jobs waiting for a key: what send_event wakes.
            models.Index(
                fields=["event_key"], name="leasejobs_step_waiting", condition=Q(kind="wait", done=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} of job {self.job_id}"


class Event(models.Model):
    """An event sent by ``leasejobs.send_event``: a keyed fact, one row per key.

    Inserted in the sender's transaction; every job that waits for the key
    (``ctx.wait_for``), before or after it was sent, receives it. Pruned by
    ``leasejobs_prune`` once older than its cutoff.
    """

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=255, unique=True)
    payload = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "leasejobs_event"

    def __str__(self) -> str:
        return self.key


class JobOverview(Job):
    """No data of its own: gives the admin's overview page its entry on the admin index.

    The admin index lists registered models only, so a page of its own needs
    a model to hang from (django-rq does the same with an unmanaged
    ``Queue`` model). A proxy has no table; no permissions of its own either:
    the page is shown to whoever may view jobs.
    """

    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = "overview"
        verbose_name_plural = "overview"


class LiveWorker(models.Model):
    """One row per running worker, refreshed by its heartbeat thread (see ``leasejobs.db.sql.workers``).

    Read by ``manage.py leasejobs_health --worker`` and the live-worker
    gauges; written only by workers, with raw SQL.
    """

    worker_id = models.CharField(max_length=255, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    interval_seconds = models.FloatField(help_text="The heartbeat interval the worker keeps.")

    class Meta:
        db_table = "leasejobs_worker"
        indexes = [models.Index(fields=["hostname", "started_at"], name="leasejobs_worker_host")]

    def __str__(self) -> str:
        return self.worker_id


class ChartPoint(models.Model):
    """One value of an admin overview chart for one closed time bucket (see ``leasejobs.admin.charts``).

    A cache, not a record: it only spares the overview from reading a whole
    day of jobs on every refresh (measured in docs/admin.md). Kept two days.
    """

    id = models.BigAutoField(primary_key=True)
    chart = models.CharField(max_length=32)
    step_seconds = models.IntegerField()
    t = models.DateTimeField()
    series = models.CharField(max_length=100, blank=True)
    value = models.FloatField(null=True)

    class Meta:
        db_table = "leasejobs_chartpoint"
        constraints = [
            models.UniqueConstraint(
                fields=["chart", "step_seconds", "t", "series"], name="leasejobs_chartpoint_key"
            )
        ]


class PeriodicSchedule(models.Model):
    """The database's memory of one periodic schedule (see ``leasejobs.periodic``).

    ``last_tick`` only ever moves forward, in the same statement that inserts
    the tick's job: that row, not a leader, is what makes each tick enqueued
    once. ``signature`` is the definition (task, expression, zone, arguments)
    the ticks follow, and ``declared_at`` the database time at which the
    worker that wrote it started: a worker started later with another
    definition takes the schedule over; one started earlier leaves it alone.
    A schedule removed from code keeps its row, for the record.
    """

    name = models.CharField(max_length=200, primary_key=True)
    task_name = models.CharField(max_length=255)
    cron = models.CharField(max_length=255)
    timezone = models.CharField(max_length=100)
    signature = models.CharField(max_length=64, help_text="Hash of task, expression, zone and arguments.")
    declared_at = models.DateTimeField(help_text="Start of the worker whose definition the ticks follow.")
    last_tick = models.DateTimeField(help_text="The newest tick decided (enqueued or skipped).")
    last_job_id = models.BigIntegerField(null=True, blank=True)
    enqueued = models.BigIntegerField(default=0, help_text="Ticks enqueued as jobs.")
    skipped = models.BigIntegerField(default=0, help_text="Ticks skipped (overlap, or too late).")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "leasejobs_periodic_schedule"
        verbose_name = "periodic schedule"

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"


class Queue(models.Model):
    """The controls of one queue: paused, and its limits, read by every claim.

    A row exists only for a queue that was paused or given limits. Limits
    from ``LEASEJOBS["QUEUES"]`` are written here when a worker starts
    (``limits_from_settings`` true); limits changed in the admin win over
    the settings from then on. The claim reads this table in the same
    statement, so a pause or a new limit applies to the very next claim.
    """

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    concurrency = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most jobs of this queue running at once, across all workers."
    )
    rate_count = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most claims in any window of rate_seconds."
    )
    rate_seconds = models.FloatField(null=True, blank=True)
    limits_from_settings = models.BooleanField(
        default=False, help_text="The limits are LEASEJOBS['QUEUES']'s; false once changed here."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "leasejobs_queue"

    def __str__(self) -> str:
        return self.name


def held_until_or_never() -> Func:
    """``COALESCE(held_until, '-infinity')``: a place's expiry, a never-held place first.

    A place is free when this is before ``now()``: one range of an index on
    it, which ``NULL OR < now()`` is not. ``CLAIM_LIMITED`` writes the same
    expression, so that PostgreSQL matches it to the index.
    """
    return Func(
        F("held_until"),
        template="COALESCE(%(expressions)s, '-infinity'::timestamptz)",
        output_field=models.DateTimeField(),
    )


class Slot(models.Model):
    """One numbered place under a limit: a queue's concurrency, its rate, or a key's concurrency.

    A limit of N is N rows (``kind``, ``name``, 1..N); a claim takes free
    rows with ``FOR UPDATE SKIP LOCKED`` in the claim statement itself, so
    two claims can never take one place. A concurrency or key slot is held
    by one attempt (``job_id``, ``attempt``) until ``held_until``, which
    follows that attempt's lease: its finish or a lease given back frees it,
    and a lease that runs out frees it too. A rate slot is held for the rate
    window from its claim and freed by nothing but time.
    """

    class Kind(models.TextChoices):
        CONCURRENCY = "concurrency"
        RATE = "rate"
        KEY = "key"

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=255, help_text="The queue, or the concurrency key.")
    n = models.PositiveIntegerField()
    job_id = models.BigIntegerField(null=True, blank=True)
    attempt = models.IntegerField(null=True, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "leasejobs_slot"
        constraints = [
            models.UniqueConstraint(fields=["kind", "name", "n"], name="leasejobs_slot_place"),
        ]
        indexes = [
            models.Index(fields=["job_id", "attempt"], name="leasejobs_slot_holder"),
            # The free places of a limit first: a claim reads the few it
            # needs without walking the held ones (issue 28: a 100000/d
            # rate made each claim read and lock every free place).
            models.Index(F("kind"), F("name"), held_until_or_never(), name="leasejobs_slot_free"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} #{self.n}"


class Workflow(models.Model):
    """A graph of jobs made by one ``with leasejobs.workflow(name) as wf:`` block."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "leasejobs_workflow"

    def __str__(self) -> str:
        return f"{self.name}#{self.id}"


class WorkflowEdge(models.Model):
    """``child`` runs after ``parent``: one row per edge of a workflow.

    ``resolved`` turns true, once, in the transaction that settles the edge
    (the parent's fenced finish, or the cascade of a failure): that flag is
    what keeps a parent retried later from counting twice against its child.
    ``run_on_failure``: the child's ``on_parent_failure="run"``. No foreign
    keys: pruning deletes finished jobs without touching this table.
    """

    id = models.BigAutoField(primary_key=True)
    parent_id = models.BigIntegerField()
    child_id = models.BigIntegerField()
    run_on_failure = models.BooleanField(default=False)
    resolved = models.BooleanField(default=False)

    class Meta:
        db_table = "leasejobs_workflowedge"
        constraints = [
            models.UniqueConstraint(fields=["child_id", "parent_id"], name="leasejobs_edge_child_parent"),
        ]
        indexes = [models.Index(fields=["parent_id"], name="leasejobs_edge_parent")]

    def __str__(self) -> str:
        return f"{self.parent_id} -> {self.child_id}"
