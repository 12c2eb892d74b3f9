"""What a worker tells a newcomer (issue 29): what it serves, a queue no task uses, what it
did each minute, and what ``--burst`` leaves behind. Real ``runworker`` processes."""

import re

from leasejobs.models import Job
from tests.helpers import wait_until
from tests.testapp.tasks import add, fails_once_retried_later


def test_the_start_line_lists_the_tasks_it_serves_with_their_queues(start_worker):
    worker = start_worker("--burst")
    assert worker.wait(timeout=60) == 0
    line = next(line for line in worker.log().splitlines() if "worker started" in line)
    assert re.search(r" tasks=\d+ \(", line)
    assert "tests.testapp.tasks.add@default" in line


def test_a_queue_no_task_uses_is_warned_about_at_start(start_worker):
    worker = start_worker("--burst", "--queue", "reciepts", "--queue", "default")
    assert worker.wait(timeout=60) == 0
    assert worker.count(r"WARNING \S+ --queue reciepts worker=\S+: no task uses it") == 1
    assert worker.count("--queue default") == 0


def test_a_working_worker_says_what_it_did_at_the_default_level(start_worker):
    jobs = [add.enqueue(i, 1) for i in range(5)]
    worker = start_worker(env={"LEASEJOBS_TEST_SUMMARY_SECONDS": "1"})
    wait_until(lambda: all(Job.objects.get(id=j.id).status == "done" for j in jobs), what="5 jobs")
    worker.wait_for_log(r"INFO \S+ worker working worker=\S+ in the last \d+ s: claimed=5 done=5 ")


def test_burst_says_it_leaves_retries_behind_and_waits_for_them_when_asked(start_worker):
    job = fails_once_retried_later.enqueue()  # its retry is due 3 s after its first attempt
    first = start_worker("--burst")
    assert first.wait(timeout=60) == 0
    assert first.count(r"1 job\(s\) of this worker's queues wait for a retry or a snooze") == 1
    assert first.count("exiting without them; runworker --burst --wait-for-retries waits") == 1
    second = start_worker("--burst", "--wait-for-retries")
    assert second.wait(timeout=60) == 0
    job.refresh_from_db()
    assert (job.status, job.result) == ("done", 2)


def test_wait_for_retries_needs_burst(start_worker):
    worker = start_worker("--wait-for-retries")
    assert worker.wait(timeout=60) != 0
    assert "--wait-for-retries only makes sense with --burst; add --burst." in worker.log()
