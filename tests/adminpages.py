"""The admin pages as the tests read and drive them: URLs, jobs in a given state, rows, actions."""

import datetime as dt
import html
import re

from django.contrib.auth.models import Permission, User
from django.db.models.functions import Now
from django.test import Client

from leasejobs.models import Job

CHANGELIST = "/admin/leasejobs/job/"
OVERVIEW = "/admin/leasejobs/joboverview/"
SIDE_EFFECTS = "/admin/leasejobs/sideeffect/"
SCRIPT = "<script>alert(1)</script>"


def secs(n: float) -> dt.timedelta:
    return dt.timedelta(seconds=n)


def make_job(**fields) -> Job:
    # Every attempt so far started its body: runs counts them (max_attempts limits runs).
    fields.setdefault("runs", fields.get("attempt", 0))
    fields.setdefault("task_name", "tests.testapp.tasks.add")
    fields.setdefault("run_at", Now())
    if fields.get("status") in ("done", "failed", "cancelled"):
        fields.setdefault("finished_at", Now())  # a finished job has a finish time (a check says so)
    job = Job.objects.create(**fields)
    job.refresh_from_db()
    return job


def running(left: float, lease: float = 30, worker: str = "w-3f2a", attempt: int = 1, **fields) -> Job:
    """A running job with ``left`` seconds of a ``lease``-second lease, by the database clock."""
    return make_job(
        status="running",
        attempt=attempt,
        leased_by=worker,
        lease_until=Now() + secs(left),
        heartbeat_at=Now() - secs(lease - left),
        started_at=Now(),
        **fields,
    )


def page(client: Client, url: str = CHANGELIST) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def row(text: str, job: Job) -> str:
    """The changelist row of one job."""
    match = re.search(rf'<tr>(?:(?!</tr>).)*?value="{job.pk}" class="action-select".*?</tr>', text, re.S)
    if match is None:
        match = re.search(rf'<tr>(?:(?!</tr>).)*?name="leasejobs_seen" value="{job.pk}:.*?</tr>', text, re.S)
    assert match, f"job {job.pk} is not on the page"
    return match.group(0)


def cell(text: str, job: Job, column: str) -> str:
    match = re.search(rf'<td class="field-{column}[^"]*">(.*?)</td>', row(text, job), re.S)
    assert match, f"no {column} cell for job {job.pk}"
    return html.unescape(re.sub(r"<[^>]+>", "", match.group(1))).strip()


def ids_on(text: str) -> set[int]:
    """The jobs listed on a changelist page."""
    return {
        int(i) for i in re.findall(r'<th class="field-id"><a href="/admin/leasejobs/job/(\d+)/change/', text)
    }


def tokens_on(text: str) -> dict[int, str]:
    return {int(t.split(":")[0]): t for t in re.findall(r'name="leasejobs_seen" value="([^"]+)"', text)}


def act(
    client: Client, action: str, jobs: list[Job], tokens: dict[int, str] | None = None, **extra
) -> list[str]:
    """Post an action for ``jobs`` with the tokens a page showed; the messages it left."""
    if tokens is None:
        tokens = tokens_on(page(client))
    data = {
        "action": action,
        "index": "0",
        "_selected_action": [str(j.pk) for j in jobs],
        "leasejobs_seen": [tokens[j.pk] for j in jobs if j.pk in tokens],
        **extra,
    }
    response = client.post(CHANGELIST, data, follow=True)
    assert response.status_code == 200
    return [m.message for m in response.context["messages"]]


def side_effects_on(text: str) -> list[tuple[str, int]]:
    """(key, fencing token) of each side effect inline on a job page."""
    found = re.findall(
        r'<td class="field-key">\s*<p>(.*?)</p>\s*</td>\s*<td class="field-fencing_token">\s*<p>(\d+)</p>',
        text,
    )
    return [(html.unescape(key), int(token)) for key, token in found]


def fresh(job: Job) -> Job:
    job.refresh_from_db()
    return job


def staff(*codenames: str) -> Client:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="leasejobs", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


# -- the changelist ---------------------------------------------------------------
