"""The benchmark of leasejobs: ``manage.py leasejobs_bench`` and the scripts beside it.

It lives beside the library, not in it (as River's ``cmd/river/riverbench``
and Oban's ``bench/``): nothing here is in the wheel, and a user's project
never sees ``leasejobs_bench``. It is a Django app that this repository's
demo project (``demo_site.settings``) and test settings install, so
``python manage.py leasejobs_bench`` runs from the repository's root.

The command, on the database Django is configured for, measures:

- enqueue: ``task.enqueue()`` one job per transaction through Django's
  connection, and ``task.bulk_enqueue()`` and ``bulk_enqueue_ids()`` 1,000 jobs per call;
- processing: real ``runworker`` processes drain no-op jobs. The workers are
  started first and wait, idle, on LISTEN; then all jobs are committed in one
  transaction, so every worker sees them at the same moment. The figure runs
  from the first claim to the last finish, both stamped by the database
  (``started_at``, ``finished_at``), the same clock and method as the peer
  benchmark in the project's research notes;
- latency: one idle worker, jobs enqueued one at a time at a steady rate;
  each body returns how long ago (wall clock, same machine) its enqueue call
  began;
- the raw-SQL limit (``--raw-sql``): the least a lease queue must do, a
  fenced claim and a fenced finish of ``batch`` jobs per statement with
  prepared statements through psycopg, no Python job handling at all, on a
  table of its own. It bounds what any Python worker can reach on this
  machine in this run;
- a large table (``--table-rows N``): N finished jobs are inserted first, the
  processing run is repeated, and the claim's plan is printed;
- a backlog (``--backlog N``): N queued jobs drained while more arrive, each
  round against the empty table measured just before it, its pace sampled
  every half second at the claim index's front; ``--backlog-without-vacuum``
  drains it again with ``runworker --no-vacuum`` (``--plot-backlog`` draws both);
- HOT updates: ``n_tup_hot_upd / n_tup_upd`` of the jobs table, for the
  processing runs and for a window in which only heartbeats write;
- worker memory: the resident set size of each worker process while it works;
- the database's cost per job of each processing run (``dbcost``): WAL bytes
  and full-page images after a checkpoint, transactions, row versions written
  and left dead, statements (with ``pg_stat_statements``) and the backends' CPU.
- steadiness under database pressure (``--pressure``, ``pressure``): pickup
  latency and throughput at a fixed offered load through a clean phase, a
  phase with a long transaction or analytics readers, and a phase after it,
  with dead tuples and the table's and indexes' sizes sampled every second.

Every job the bench makes is on the ``leasejobs-bench`` queue (the finished
rows of ``--table-rows`` on ``leasejobs-bench-history``) and is deleted at the
end. The workers are started with ``--queue leasejobs-bench``; a worker of
your own that listens to all queues would take bench jobs and fail them as
unknown tasks, so run the bench against a database no other worker uses.

The bench tasks are registered only in the bench's processes: the worker
processes run ``runworker`` after ``register_tasks()``, so production workers
never know them.

The command's modules: ``management/commands/leasejobs_bench`` (its
options), ``run`` (the session: enqueue, processing, latency, HOT updates,
and ``run_all`` which runs what the command's options ask), ``workers``
(the ``runworker`` processes), ``raw`` (the raw-SQL limit), ``db`` (its own
psycopg connections, the machine), ``tasks`` (the bench tasks), ``host``
(the CPU time the host takes), ``dbcost`` (the database's cost per job),
``report`` (the table), ``plot`` (the PNGs) and ``pressure``
(``--pressure``). ``leasejobs`` never imports any of it.

The scripts beside them, each run on its own (see its docstring):
``compare/`` (leasejobs against PgQueuer and procrastinate, in a virtualenv
of its own; it reads ``host`` only, so this package imports nothing at its
top), ``cpu_ab.py`` (CPU per job of two trees, alternating), ``pooler.py``
(workers through PgBouncer), ``history.py`` (a large job history),
``pinned_front.py`` (the claim's first look while the horizon is pinned),
``periodic/cost.py`` (periodic scheduling per tick) and ``queue_controls/``
(the cost of queue limits).
"""
