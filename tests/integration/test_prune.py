"""manage.py leasejobs_prune: finished jobs older than the cutoff go, in batches; keys stay."""

import datetime as dt
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from leasejobs.models import Job, SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def make_job(status: str, finished_days_ago: float | None) -> Job:
    now = timezone.now()
    finished = None if finished_days_ago is None else now - dt.timedelta(days=finished_days_ago)
    return Job.objects.create(task_name="t", status=status, run_at=now, attempt=1, finished_at=finished)


def prune(*args: str) -> str:
    out = StringIO()
    call_command("leasejobs_prune", *args, stdout=out)
    return out.getvalue()


def test_only_finished_jobs_older_than_the_cutoff_are_deleted_in_batches():
    old = [make_job(status, 10) for status in ("done", "done", "failed", "cancelled", "done")]
    recent = make_job("done", 1)
    queued = make_job("queued", None)
    # A running job has no finished_at (the check leasejobs_job_finished_iff_ended refuses one).
    running = make_job("running", None)
    output = prune("--older-than", "7d", "--batch-size", "2")
    assert "Pruned 5 finished job(s)" in output and "in 3 batch(es) of at most 2" in output
    assert not Job.objects.filter(id__in=[j.id for j in old]).exists()
    assert set(Job.objects.values_list("id", flat=True)) == {recent.id, queued.id, running.id}


def test_side_effect_keys_outlive_their_job_unless_asked():
    job = make_job("done", 10)
    SideEffect.objects.create(job=job, key="receipt:1", fencing_token=1)
    assert "side-effect keys kept" in prune("--older-than", "7d")
    assert not Job.objects.filter(id=job.id).exists()
    effect = SideEffect.objects.get(key="receipt:1")
    assert effect.job_id is None  # unlinked, still a used key

    other = make_job("done", 10)
    SideEffect.objects.create(job=other, key="receipt:2", fencing_token=1)
    SideEffect.objects.filter(key="receipt:1").update(created_at=timezone.now() - dt.timedelta(days=10))
    young_orphan = SideEffect.objects.create(job=None, key="receipt:3", fencing_token=1)
    output = prune("--older-than", "7d", "--side-effects")
    assert "Pruned 1 finished job(s)" in output and "side-effect keys deleted (2)" in output
    assert list(SideEffect.objects.values_list("id", flat=True)) == [young_orphan.id]


@pytest.mark.parametrize("age", ["soon", "-1d", "7y"])
def test_a_bad_age_is_refused(age):
    with pytest.raises(CommandError, match="--older-than"):
        call_command("leasejobs_prune", "--older-than", age)
