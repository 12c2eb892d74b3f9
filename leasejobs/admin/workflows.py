"""The workflow page: a workflow's graph drawn as SVG, server-side, with its counts and timings.

Each node is a job, coloured by its state and linked to its page; a level
(the longest chain of parents above a job) with more jobs than fit is drawn
as one box with the count of each state, so a fan-in of 10,000 parents is
still one page. Failed jobs, the chain of jobs above them and the jobs
their failure cancelled are drawn as the path that failed (red). No script,
nothing fetched; the same facts follow as a table for screen readers.
"""

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from leasejobs.admin.overview import JobPagesAdmin
from leasejobs.db import facade
from leasejobs.models import Workflow
from leasejobs.operations.workflows import cancel_workflow

#: Colours by state (readable on the light and the dark admin theme).
COLOURS = {
    "queued": "#7f8c8d",
    "waiting": "#bdc3c7",
    "running": "#2f7ed8",
    "done": "#5cb85c",
    "failed": "#d9534f",
    "cancelled": "#f0ad4e",
}
#: Jobs drawn one by one in a level; more are drawn as one box.
PER_LEVEL = 12
BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 120, 34, 16, 46, 12


@dataclass
class Node:
    id: int
    task: str
    status: str
    attempt: int
    pending: int
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_error: str
    parents: list[int] = field(default_factory=list)
    children: list[int] = field(default_factory=list)
    level: int = 0

    @property
    def state(self) -> str:
        """The status, with a queued job still waiting for its parents shown as ``waiting``."""
        return "waiting" if self.status == "queued" and self.pending > 0 else self.status


@dataclass
class Graph:
    nodes: dict[int, Node]
    levels: list[list[int]]
    failed_path: set[int]

    def counts(self) -> list[tuple[str, int]]:
        found = Counter(n.state for n in self.nodes.values())
        return [(state, found[state]) for state in COLOURS if found[state]]

    def timings(self) -> dict[str, Any]:
        starts = [n.started_at for n in self.nodes.values() if n.started_at]
        ends = [n.finished_at for n in self.nodes.values() if n.finished_at]
        done = all(n.status in ("done", "failed", "cancelled") for n in self.nodes.values())
        first, last = min(starts, default=None), max(ends, default=None)
        return {
            "created": min((n.created_at for n in self.nodes.values()), default=None),
            "first_start": first,
            "last_finish": last if done else None,
            "seconds": (last - first).total_seconds() if done and first and last else None,
        }


def build(workflow_id: int) -> Graph:
    """The workflow's nodes, their levels (longest chain of parents) and the path that failed."""
    rows, edges = facade.workflow_graph(workflow_id)
    nodes = {r[0]: Node(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8]) for r in rows}
    for parent, child, _run, _resolved in edges:
        if parent in nodes and child in nodes:
            nodes[parent].children.append(child)
            nodes[child].parents.append(parent)
    for job_id in sorted(nodes):  # ids grow with add(), and a parent is always added first
        node = nodes[job_id]
        node.level = 1 + max((nodes[p].level for p in node.parents), default=-1)
    levels: dict[int, list[int]] = defaultdict(list)
    for node in nodes.values():
        levels[node.level].append(node.id)
    return Graph(nodes, [sorted(levels[k]) for k in sorted(levels)], _failed_path(nodes))


def _failed_path(nodes: dict[int, Node]) -> set[int]:
    """Failed jobs, every job above them, and the jobs cancelled below them because of them."""
    path: set[int] = set()
    failed = [n.id for n in nodes.values() if n.status == "failed"]
    stack = list(failed)
    while stack:  # upwards
        job_id = stack.pop()
        if job_id not in path:
            path.add(job_id)
            stack.extend(nodes[job_id].parents)
    stack = [c for f in failed for c in nodes[f].children]
    while stack:  # downwards, through what the failure cancelled
        job_id = stack.pop()
        node = nodes[job_id]
        if node.status == "cancelled" and node.attempt == 0 and job_id not in path:
            path.add(job_id)
            stack.extend(node.children)
    return path


def _short(name: str) -> str:
    tail = name.rsplit(".", 1)[-1]
    return tail if len(tail) <= 16 else tail[:15] + "…"


def render_svg(graph: Graph, job_url: str) -> SafeString:
    """The graph as an inline SVG: one row per level, boxes linked to their jobs' pages."""
    width = max(1, max((min(len(level), PER_LEVEL + 1) for level in graph.levels), default=1))
    w = 2 * MARGIN + width * BOX_W + (width - 1) * GAP_X
    h = 2 * MARGIN + len(graph.levels) * BOX_H + max(0, len(graph.levels) - 1) * GAP_Y
    centres: dict[int, tuple[float, float]] = {}
    boxes: list[SafeString] = []
    for row, level in enumerate(graph.levels):
        y = MARGIN + row * (BOX_H + GAP_Y)
        shown = level if len(level) <= PER_LEVEL + 1 else level[:PER_LEVEL]
        slots = len(shown) + (0 if shown is level else 1)
        left = (w - (slots * BOX_W + (slots - 1) * GAP_X)) / 2
        for i, job_id in enumerate(shown):
            node = graph.nodes[job_id]
            x = left + i * (BOX_W + GAP_X)
            centres[job_id] = (x + BOX_W / 2, y)
            boxes.append(
                _box(node, x, y, job_url.replace("__id__", str(job_id)), job_id in graph.failed_path)
            )
        if shown is not level:
            rest = [graph.nodes[j] for j in level[PER_LEVEL:]]
            x = left + PER_LEVEL * (BOX_W + GAP_X)
            for node in rest:
                centres[node.id] = (x + BOX_W / 2, y)
            boxes.append(_group(rest, x, y, any(n.id in graph.failed_path for n in rest)))
    lines: set[tuple[float, float, float, float, bool]] = set()
    for node in graph.nodes.values():
        for child in node.children:
            (x1, y1), (x2, y2) = centres[node.id], centres[child]
            red = node.id in graph.failed_path and child in graph.failed_path
            lines.add((x1, y1 + BOX_H, x2, y2, red))
    drawn = format_html_join(
        "",
        '<line class="leasejobs-edge{}" x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="{}"/>',
        (
            (
                " leasejobs-failed-edge" if red else "",
                x1,
                y1,
                x2,
                y2,
                "#d9534f" if red else "#999",
                2 if red else 1,
            )
            for x1, y1, x2, y2, red in sorted(lines)
        ),
    )
    return format_html(
        '<svg class="leasejobs-workflow" viewBox="0 0 {} {}" width="{}" role="img" '
        'aria-label="The workflow\'s jobs, one row per level, coloured by state">{}{}</svg>',
        int(w),
        int(h),
        int(w),
        drawn,
        mark_safe("".join(boxes)),  # each box is built by format_html
    )


def _box(node: Node, x: float, y: float, url: str, failed: bool) -> SafeString:
    tip = f"#{node.id} {node.task}: {node.state}, attempt {node.attempt}"
    if node.last_error:
        tip += f" — {node.last_error[:200]}"
    return format_html(
        '<a href="{}"><g class="leasejobs-node leasejobs-node-{}"><title>{}</title>'
        '<rect x="{}" y="{}" width="{}" height="{}" rx="4" fill="{}" stroke="{}" stroke-width="{}"/>'
        '<text x="{}" y="{}" text-anchor="middle" font-size="11">#{} {}</text>'
        '<text x="{}" y="{}" text-anchor="middle" font-size="10">{}</text></g></a>',
        url,
        node.state,
        tip,
        round(x, 1),
        y,
        BOX_W,
        BOX_H,
        COLOURS[node.state],
        "#a94442" if failed else "#555",
        3 if failed else 1,
        round(x + BOX_W / 2, 1),
        y + 14,
        node.id,
        _short(node.task),
        round(x + BOX_W / 2, 1),
        y + 27,
        node.state,
    )


def _group(nodes: list[Node], x: float, y: float, failed: bool) -> SafeString:
    counts = Counter(n.state for n in nodes)
    worst = next(
        s for s in ("failed", "running", "cancelled", "queued", "waiting", "done") if counts[s] or s == "done"
    )
    summary = ", ".join(f"{counts[s]} {s}" for s in COLOURS if counts[s])
    return format_html(
        '<g class="leasejobs-node leasejobs-node-group"><title>{} more jobs: {}</title>'
        '<rect x="{}" y="{}" width="{}" height="{}" rx="4" fill="{}" stroke="{}" stroke-dasharray="4 2"/>'
        '<text x="{}" y="{}" text-anchor="middle" font-size="11">+{} jobs</text>'
        '<text x="{}" y="{}" text-anchor="middle" font-size="9">{}</text></g>',
        len(nodes),
        summary,
        round(x, 1),
        y,
        BOX_W,
        BOX_H,
        COLOURS[worst],
        "#a94442" if failed else "#555",
        round(x + BOX_W / 2, 1),
        y + 14,
        len(nodes),
        round(x + BOX_W / 2, 1),
        y + 27,
        summary[:28],
    )


@admin.register(Workflow)
class WorkflowAdmin(JobPagesAdmin):
    """The workflows, each opening its page; viewable by whoever may view jobs."""

    list_display = ("id", "name", "created_at")
    search_fields = ("name",)
    ordering = ("-id",)

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<int:workflow_id>/cancel/", wrap(self.cancel_view), name="leasejobs_workflow_cancel"),
            *super().get_urls(),
        ]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        workflow = self.get_object(request, object_id)
        if workflow is None:
            raise Http404(f"No workflow {object_id}: it may have been deleted.")
        graph = build(workflow.id)
        unfinished = sum(1 for n in graph.nodes.values() if n.status in ("queued", "running"))
        failed = [graph.nodes[j] for j in sorted(graph.failed_path)]
        context = {
            **self.admin_site.each_context(request),
            "title": f"Workflow {workflow.name} (#{workflow.id})",
            "opts": self.opts,
            "original": workflow,
            "workflow": workflow,
            "graph_svg": render_svg(graph, reverse("admin:leasejobs_job_change", args=["__id__"])),
            "counts": graph.counts(),
            "colours": COLOURS,
            "timings": graph.timings(),
            "total": len(graph.nodes),
            "failed_path": failed,
            "nodes": [graph.nodes[j] for level in graph.levels for j in level][:500],
            "unfinished": unfinished,
            "may_cancel": unfinished and self.may(request, ("change",)),
        }
        return TemplateResponse(request, "admin/leasejobs/workflow/workflow.html", context)

    def cancel_view(self, request: HttpRequest, workflow_id: int) -> HttpResponse:
        """POST: cancel every unfinished job of the workflow (running ones through a cancel request)."""
        if request.method != "POST" or not self.may(request, ("change",)):
            raise PermissionDenied
        changed = cancel_workflow(workflow_id, by=f"admin:{request.user.get_username()}")
        self.message_user(
            request,
            f"Cancelled {len(changed.changed)} of the workflow's unfinished jobs "
            f"(running ones are asked to stop); {changed.moved_on} had changed meanwhile.",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(reverse("admin:leasejobs_workflow_change", args=[workflow_id]))
