"""Hostile and bad input: a clear error, or the job failed alone; nothing lost, nothing run.

What tests/integration/test_enqueue.py and tests/integration/test_worker.py already cover is not
repeated here (non-JSON arguments, an oversized payload, a naive run_at, bad
queue names and priorities, the unknown task ``os.system``, args that are not
a list, and most bad runworker options); docs/guarantees.md lists them all.
"""

import pytest
from django.db import DataError, transaction

from leasejobs.models import Job
from tests.testapp.tasks import add


@pytest.mark.django_db
def test_a_nul_character_is_refused_at_enqueue_and_nothing_is_inserted():
    """PostgreSQL text and jsonb cannot hold NUL: refused (by psycopg, by the server for JSON, or
    by ``validate_key`` for an idempotency key, in one sentence)."""
    with pytest.raises(ValueError, match=r"^queue must not contain a NUL character"):
        add.using(queue="a\x00b").enqueue(1, 2)
    with pytest.raises(ValueError, match=r"^idempotency_key must not contain a NUL character"):
        add.using(idempotency_key="key\x00").enqueue(1, 2)
    with pytest.raises(DataError, match="u0000 cannot be converted to text"), transaction.atomic():
        add.enqueue("a\x00b", 2)
    assert Job.objects.count() == 0
