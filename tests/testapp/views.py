"""A view that enqueues, for the tracing test: the request's trace must reach the job."""

from django.http import HttpRequest, JsonResponse

from tests.testapp.tasks import add, flaky


def enqueue(request: HttpRequest) -> JsonResponse:
    jobs = [add.enqueue(2, 3), flaky.enqueue(1)]
    return JsonResponse({"ids": [j.id for j in jobs]})
