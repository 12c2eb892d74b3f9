"""The admin's "retry all N failed jobs matching this filter", with a confirmation page.

Selecting across pages is refused for the row actions (rows never shown
have no state to fence on). This page is the way to act on a whole filter:
it counts the failed jobs the changelist's filters and search match, and
stamps the page with the database time it was shown. Confirming retries
those jobs that were already failed then (``finished_at`` at or before that
time) and still are, each fenced on the status and attempt it is matched
with (``leasejobs.operations.bulk``); a job that failed after the page was shown, or
that someone retried meanwhile, is left alone and counted.
"""

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from leasejobs.db import facade
from leasejobs.models import Job
from leasejobs.operations import bulk


def _database_now() -> dt.datetime:
    """The database clock at this statement (inside a test's transaction ``now()`` stands still)."""
    return facade.statement_now()


def view(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: the count and a confirm button. POST: the fenced retry, then back to the list."""
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    query = request.GET.urlencode()
    back = reverse("admin:leasejobs_job_changelist") + (f"?{query}" if query else "")
    try:
        changelist = model_admin.get_changelist_instance(request)
    except IncorrectLookupParameters:
        model_admin.message_user(request, "That filter is not one the job list knows.", messages.ERROR)
        return HttpResponseRedirect(reverse("admin:leasejobs_job_changelist"))
    failed = changelist.get_queryset(request).filter(status=Job.Status.FAILED)
    if request.method == "POST":
        try:
            shown_at = dt.datetime.fromisoformat(request.POST["shown_at"])
            shown = int(request.POST["count"])
        except (KeyError, ValueError):
            model_admin.message_user(
                request, "The confirmation was incomplete; nothing was changed.", messages.ERROR
            )
            return HttpResponseRedirect(back)
        outcome = bulk.apply(
            "retry", failed.filter(finished_at__lte=shown_at), by=request.user.get_username()
        )
        changed = len(outcome.changed)
        text = f"Queued {changed} of the {shown} failed jobs to run now."
        if shown > changed:
            text += f" {shown - changed} changed since the count was shown and were left alone."
        model_admin.message_user(request, text, messages.SUCCESS if shown == changed else messages.WARNING)
        return HttpResponseRedirect(back)
    count = failed.count()
    if not count:
        model_admin.message_user(
            request, "No failed job matches this filter; nothing to retry.", messages.INFO
        )
        return HttpResponseRedirect(back)
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "title": f"Retry all {count} failed jobs matching this filter?",
        "opts": model_admin.opts,
        "count": count,
        "shown_at": _database_now().isoformat(),
        "filters": [(key, value) for key, values in request.GET.lists() for value in values],
        "back": back,
    }
    return TemplateResponse(request, "admin/leasejobs/job/retry_failed.html", context)
