"""The integration half of tests/unit/test_claim_limited.py: its tests that start workers or commit."""

import json
from typing import Any

import psycopg
import pytest
from django.db import connection

from leasejobs.db import sql
from leasejobs.db.connection import connection_params
from leasejobs.db.store import CLAIM_SETTINGS
from leasejobs.models import Slot
from leasejobs.queues import controls
from tests.testapp.tasks import add
from tests.unit.test_claim_limited import limited_params

# -- the model ------------------------------------------------------------------------------------


# -- the cost of a large limit -----------------------------------------------------------------------


def _explain(conn: psycopg.Connection, params: dict[str, Any]) -> dict[str, Any]:
    [(plan,)] = conn.execute("EXPLAIN (ANALYZE, WAL, BUFFERS, FORMAT JSON) " + sql.CLAIM_LIMITED, params)
    conn.rollback()
    return (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]


@pytest.mark.django_db(transaction=True)
def test_a_claim_under_a_100000_a_day_rate_locks_and_writes_only_the_places_it_takes() -> None:
    """100,000 places, half of them held: a claim of 4 reads, locks and writes about 4 of them."""
    controls.set_limits("quota", rate="100000/d")
    add.using(queue="quota").bulk_enqueue([((1, 2), {})] * 40)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE leasejobs_slot SET held_until = now() + interval '1 day' "
            "WHERE kind = 'rate' AND n <= 50000"
        )
        # As after a busy morning, with (auto)vacuum done: the old versions of those rows gone.
        cursor.execute("VACUUM ANALYZE leasejobs_slot")
    params = limited_params(4)
    options = " ".join(f"-c {name}={value}" for name, value in CLAIM_SETTINGS.items())
    with psycopg.connect(**connection_params(), options=options) as conn:
        plan = _explain(conn, params)
        # Locking every free place wrote one WAL record per place (50,000 here) and read them all.
        buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        print(f"\none claim of 4: {plan.get('WAL Records', 0)} WAL records, {buffers} buffers")
        assert plan.get("WAL Records", 0) < 300, plan.get("WAL Records")
        assert buffers < 2000, buffers
        taken = conn.execute(sql.CLAIM_LIMITED, params).fetchall()
        [(xid,)] = conn.execute("SELECT pg_current_xact_id()::text").fetchall()
        conn.commit()
    assert len(taken) == 4
    with connection.cursor() as cursor:
        # A place the claim updated keeps its lock on the new version: it wrote those.
        cursor.execute(
            "SELECT count(*) FILTER (WHERE xmin::text = %s), "
            "count(*) FILTER (WHERE xmax::text = %s AND xmin::text <> %s) FROM leasejobs_slot",
            [xid, xid, xid],
        )
        written, locked_only = cursor.fetchone()
    assert (written, locked_only) == (4, 0)
    places = Slot.objects.filter(kind="rate", name="quota", job_id__in=[r[0] for r in taken])
    assert places.count() == 4 and all(p.n > 50000 for p in places), "only free places are taken"
