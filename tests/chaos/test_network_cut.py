"""Network cut: a worker in its own network namespace loses its link past the lease.

The worker inside reaches PostgreSQL over a veth pair only. Its link is cut
while it runs a slow job; nothing tells it, and its heartbeats vanish. The
lease runs out, a worker on the host takes the job over and finishes it.
The cut-off worker's zygote kills that body as its lease ends (the worker
could not renew it), before any other worker can take the job over. When
the link returns, the cut-off worker's connections carry on where they
stopped: it learns the lease is lost, anything of the old attempt it still
writes is rejected (its token is stale), and it goes on to run new work.
"""

import time
from contextlib import ExitStack
from urllib.parse import urlsplit

from leasejobs.models import Job
from tests.chaos import pgserver
from tests.chaos.helpers import Fleet, cannot_run_here, check, enqueue_effects, wait_finished
from tests.chaos.netns import CannotMakeNamespace, network_namespace
from tests.chaos.tasks import effect
from tests.helpers import database_url, wait_until

LEASE = 2.0


def test_a_worker_cut_off_past_its_lease_is_fenced_off_and_carries_on(start_worker, record_figures):
    with ExitStack() as stack:
        try:
            ns = stack.enter_context(network_namespace())
            stack.enter_context(pgserver.accepting(ns.host_address, ns.subnet))
        except (CannotMakeNamespace, pgserver.Unavailable) as exc:
            cannot_run_here(str(exc))
        url = urlsplit(database_url())
        userinfo = url.netloc.rpartition("@")[0]
        via_veth = url._replace(netloc=f"{userinfo}@{ns.host_address}:{url.port or 5432}")
        fleet = Fleet(start_worker, "netcut", ["--lease", str(LEASE), "--concurrency", "4"])
        # Attempt 1 sleeps 4 s, records its side effect, sleeps 4 s; later attempts are short.
        slow = effect.using(queue="netcut", priority=10).enqueue(0.2, first_attempt_seconds=8).id
        cut_off = fleet.start(
            "--queue",
            "netcut",
            "--queue",
            "after-the-cut",
            env={"DATABASE_URL": via_veth.geturl()},
            prefix=ns.exec_prefix,
        )
        cut_off_id = fleet.worker_id(cut_off)
        # However the test ends, the link is up when the worker is killed, so
        # its backends see it go (and any left over are terminated).
        stack.callback(lambda: pgserver.terminate([b[0] for b in pgserver.backends_of({cut_off_id})]))
        stack.callback(cut_off.stop)
        stack.callback(ns.restore)
        wait_until(lambda: Job.objects.filter(id=slow, leased_by=cut_off_id).exists(), what="slow claimed")
        job_ids = [slow, *enqueue_effects(100, seconds=0.2, queue="netcut")]
        wait_until(
            lambda: (
                Job.objects.filter(id__in=job_ids, status="done", attempt=1, leased_by=cut_off_id).count()
                >= 5
            ),
            what="the namespaced worker does jobs over the veth",
        )

        ns.cut()
        cut_at = time.monotonic()
        fleet.start("--queue", "netcut")
        wait_until(
            lambda: Job.objects.filter(id=slow, status="done").exists(),
            timeout=30,
            what="the slow job taken over and done on the host",
        )
        # The link stays down well past the lease, then returns.
        wait_until(lambda: time.monotonic() - cut_at > LEASE + 1, what="the lease passes")
        ns.restore()
        cut_seconds = time.monotonic() - cut_at

        # The cut-off worker could not renew the slow job's lease: its zygote killed the body
        # before the lease ended (before anyone could take the job over), or, had the body
        # reached its side effect first, the write is rejected once the link is back.
        cut_off.wait_for_log(rf"lease lost job={slow} attempt=1 worker={cut_off_id}", timeout=30)
        stopped = cut_off.count(r"was killed by the zygote: its body ran past its lease")
        rejected = cut_off.count(rf"stale write rejected job={slow} attempt=1 worker={cut_off_id}")
        assert stopped + rejected >= 1, cut_off.log()[-3000:]
        # It carries on: a job only it listens for is done by it.
        after = effect.using(queue="after-the-cut").enqueue(0.1).id
        job_ids.append(after)
        wait_finished(job_ids, timeout=40)
        assert Job.objects.get(id=after).attempt_workers == [cut_off_id]
        assert Job.objects.get(id=slow).attempt == 2
        fleet.stop_all()
        record_figures(
            "network cut",
            check(
                job_ids,
                fleet,
                cuts=1,
                **{"seconds cut": round(cut_seconds, 1), "lease": LEASE},
            ),
        )
