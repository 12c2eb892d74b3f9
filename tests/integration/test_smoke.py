from leasejobs.models import Job
from tests.testapp.tasks import add


def test_burst_worker_runs_a_job(start_worker):
    job = add.enqueue(2, 3)
    worker = start_worker("--burst")
    assert worker.wait() == 0, worker.log()
    job.refresh_from_db()
    assert (job.status, job.result, job.attempt) == (Job.Status.DONE, 5, 1)
