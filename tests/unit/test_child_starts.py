"""A child starts no body that its zygote would stop at once.

The zygote stops whatever body runs in a slot once the slot's watchdog
deadline has passed (its worker could not renew a lease of that child's
jobs: paused, cut off). A job still queued in the child then must not
start: its body would spend a counted run on a start and a kill.
"""

import os
import socket
import time

import pytest

from leasejobs.worker.channel import Channel
from leasejobs.worker.child import Child, ChildChannel, ChildConfig
from leasejobs.worker.messages import UNSTARTED, BodyJob, run_message
from leasejobs.worker.slots import SlotTable


def job(seq: int, lease_ends: float) -> BodyJob:
    return BodyJob(
        seq=seq,
        id=seq,
        attempt=1,
        task_name="no.such.task",  # never looked up: the body must not start
        args="[]",
        kwargs="{}",
        retry_policy=None,
        trace_context=None,
        runs=1,
        max_attempts=1,
        snoozes=0,
        queue="default",
        lease_seconds=30.0,
        lease_ends=lease_ends,
        places=0,
    )


def run_child(slots: SlotTable, jobs: list[BodyJob]) -> list[object]:
    """Hand ``jobs`` to a child (in this process), close the worker's end; what the child said."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    worker = Channel(ours)
    worker.send(run_message(jobs))
    worker.flush()
    ours.shutdown(socket.SHUT_WR)  # the worker is gone once the child has read the jobs
    child = Child(ChildChannel(os.dup(theirs.fileno())), 0, slots, ChildConfig(worker_id="w"))
    theirs.close()
    assert child.run() == 0
    child.channel.sock.close()  # the child has left: the worker's end reads its socket to the end
    said: list[object] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        got = worker.receive()
        if got is None:
            break
        said.extend(got)
    worker.close()
    return said


@pytest.mark.parametrize("past", ["the slot's watchdog deadline", "the claim's lease"])
def test_a_job_past_its_watchdog_deadline_or_lease_is_reported_unstarted(past):
    slots = SlotTable(1)
    now = time.monotonic()
    if past == "the slot's watchdog deadline":
        slots.set_deadline(0, now - 0.01)  # the worker has not renewed: the zygote stops bodies here
        lease_ends = now + 30  # the claim's own lease is still good
    else:
        lease_ends = now - 0.01
    said = run_child(slots, [job(1, lease_ends), job(2, lease_ends)])
    assert said == [(UNSTARTED, [1, 2])]
    assert slots[0].started == 0  # no body began
