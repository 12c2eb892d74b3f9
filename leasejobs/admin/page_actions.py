"""The buttons of a job's page: retry now, cancel, release lease, on that job alone.

Each button posts the job's state as the page showed it (``leasejobs_seen``,
"id:status:attempt") to this view, which runs the same action as the job
list (``leasejobs.admin.actions``) on that one job: fenced on that state,
for whoever may change jobs, with the same messages, then back to the
job's page. Releasing a lease still held asks first (the question is the
action's own, see ``actions.release_lease``).
"""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from leasejobs.admin import actions
from leasejobs.models import Job

#: The actions a job's page offers, by the name its buttons post.
ACTIONS = {
    "retry_now": actions.retry_now,
    "cancel": actions.cancel,
    "release_lease": actions.release_lease,
}


def view(model_admin: admin.ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """POST: run one action on the job, then back to its page. GET: the job's page."""
    if not object_id.isdigit():
        raise Http404("No job has that id.")
    back = reverse("admin:leasejobs_job_change", args=[object_id], current_app=model_admin.admin_site.name)
    if request.method != "POST":
        return HttpResponseRedirect(back)
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    action = ACTIONS.get(request.POST.get("action", ""))
    if action is None:
        model_admin.message_user(request, "That action is not one a job's page offers.", messages.ERROR)
        return HttpResponseRedirect(back)
    job = Job.objects.filter(pk=int(object_id))
    if not job.exists():
        raise Http404("No job has that id.")
    response = action(model_admin, request, job)
    if response is not None:
        return response
    return HttpResponseRedirect(back)
