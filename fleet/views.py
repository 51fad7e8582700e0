"""Server-rendered pages. Every page needs a login (middleware) and a role.

Pages render the frame and the tables; the grids are drawn in the browser from
the console snapshot (``/api/console/racks/``) and kept current by the live feed
(``/ws/fleet/``), see ``static/rackwise/live.js``."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, Q
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.views.generic import TemplateView

from fleet import engine, redact
from fleet.api.webhooks import WebhookDeliverySerializer, WebhookEndpointSerializer
from fleet.choices import (
    ACTIVE_JOB_STATES,
    FINISHED_JOB_STATES,
    OPEN_ACTION_STATES,
    ActionKind,
    ActionState,
    ApprovalMode,
    JobState,
    Locality,
    NodeState,
    Role,
    WebhookEvent,
)
from fleet.export import EXPORTABLE_STATES, export_job
from fleet.filtersets import JOB_SORTS, ActionPageFilterForm, AuditEventFilterSet, JobPageFilterForm
from fleet.models import Action, Allocation, AuditEvent, Job, Rack, Tenant, WebhookEndpoint
from fleet.permissions import (
    has_role,
    may_cancel,
    tenant_ids_of,
    visible_actions,
    visible_audit_events,
    visible_jobs,
    visible_tenant_names,
)
from fleet.services.actions.propose import describe_step
from fleet.services.actions.propose import policies as action_policies
from fleet.services.decisions.scheduling import segment_room
from fleet.services.jobs.capacity import fleet_capacity
from fleet.services.nodes import moves as node_services
from fleet.services.read import read_models
from fleet.services.read.attention import age_text, attention
from fleet.services.read.signals import rack_signals
from fleet.services.read.summary import rack_summaries
from fleet.services.read.tenants import tenant_figures
from fleet.services.tenants.usage import capacity_by_shape
from placement.place import largest_free

PAGE_ROWS = 200
DELIVERY_ROWS = 10  # per webhook endpoint on its page


class RoleRequiredMixin:
    """Logged-in users without a Rackwise role (outsiders) are refused."""

    minimum_role = Role.VIEWER

    def dispatch(self, request, *args, **kwargs):
        if not has_role(request.user, self.minimum_role):
            raise PermissionDenied("You need a Rackwise role; ask an operator to add you.")
        return super().dispatch(request, *args, **kwargs)

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["is_operator"] = has_role(self.request.user, Role.OPERATOR)
        return context


class FilteredPageMixin:
    """A page whose query string did not validate answers 400, with the messages in
    ``filter_errors`` (shown by the template) and an empty list."""

    def get(self, request, *args, **kwargs):
        context = self.get_context_data(**kwargs)
        response = self.render_to_response(context)
        if context.get("filter_errors"):
            response.status_code = 400
        return response


class FleetView(RoleRequiredMixin, TemplateView):
    """Every rack, grouped by site and row. A fleet of more than ``open_limit``
    racks starts with its groups collapsed to their headers (the cards wait in a
    ``<template>`` until a group opens, see fleet.js)."""

    template_name = "fleet/fleet.html"
    open_limit = 48

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        racks = list(Rack.objects.all())
        context["summary"] = read_models.summary()
        context["attention"] = attention(self.request.user)
        context["wait_warn"] = age_text(settings.RACKWISE_WAIT_WARN_S)
        # The cards' and groups' counts come from the live snapshot (fleet.js), so
        # no per-rack summary here (it cost ~0.3 s for 1,000 racks).
        context["racks"] = racks
        # Racks come ordered by site, row, position: a group is a run of them.
        groups: dict[tuple[str, str], list[Rack]] = {}
        for rack in racks:
            groups.setdefault((rack.site, rack.row), []).append(rack)
        context["groups"] = [
            {
                "site": site,
                "row": row,
                "racks": members,
                "gpus_total": sum(r.nodes_per_domain * r.gpus_per_node for r in members),
            }
            for (site, row), members in groups.items()
        ]
        context["open_limit"] = self.open_limit
        context["collapsed"] = len(racks) > self.open_limit
        context["sites"] = sorted({r.site for r in racks if r.site})
        context["rows"] = sorted({r.row for r in racks if r.row})
        context["node_states"] = NodeState.choices
        context["tenants"] = visible_tenant_names(self.request.user)
        return context


class RackView(RoleRequiredMixin, TemplateView):
    """One rack large: its nodes with state and history, its jobs, its spares."""

    template_name = "fleet/rack.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        rack = get_object_or_404(Rack, pk=kwargs["pk"])
        nodes = list(rack.nodes.order_by("slot"))
        busy = set(
            Allocation.objects.filter(released_at__isnull=True, gpu__node__rack=rack).values_list(
                "gpu__node_id", flat=True
            )
        )
        idle = [n for n in nodes if n.state == NodeState.HEALTHY and n.pk not in busy]
        # The same rule as the grid's legend: the rack's last spare_nodes idle nodes.
        spares = idle[-rack.spare_nodes :] if rack.spare_nodes else []
        job_ids = Allocation.objects.filter(released_at__isnull=True, gpu__node__rack=rack).values("job_id")
        node_ids = [str(n.pk) for n in nodes]
        for n in nodes:
            n.moves = node_services.moves_for(n.state)
        context.update(
            rack=rack,
            node_moves=[
                {"name": m.name, "label": m.label, "from": list(m.allowed_from), "disruptive": m.disruptive}
                for m in node_services.MOVES.values()
            ],
            summary=rack_summaries(Rack.objects.filter(pk=rack.pk))[rack.pk],
            nodes=nodes,
            spares=spares,
            jobs=visible_jobs(self.request.user, Job.objects.select_related("tenant").filter(pk__in=job_ids)),
            history=visible_audit_events(
                self.request.user, AuditEvent.objects.filter(object_type="node", object_id__in=node_ids)
            )[:100],
            signals=rack_signals(rack.pk),
        )
        return context


class RackSignalsFragmentView(RoleRequiredMixin, TemplateView):
    """The rack page's node health table alone, for the page to refresh it
    (racks.js); the same template as the page, so there is one renderer."""

    template_name = "fleet/_rack_signals.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        try:
            context["signals"] = rack_signals(kwargs["pk"])
        except Rack.DoesNotExist:
            raise Http404("no such rack") from None
        return context


class JobListView(FilteredPageMixin, RoleRequiredMixin, TemplateView):
    """The queue and the running jobs, with filters."""

    template_name = "fleet/jobs.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        params = self.request.GET
        qs = visible_jobs(self.request.user, Job.objects.select_related("tenant", "owner"))
        form = JobPageFilterForm(params)
        sort, page = "newest", 1
        if form.is_valid():
            sort, page = form.cleaned_data["sort"], form.cleaned_data["page"]
            state = form.cleaned_data["state"]
            if state == "active":
                qs = qs.filter(state__in=ACTIVE_JOB_STATES)
            elif state in JobState.values:
                qs = qs.filter(state=state)
            if form.cleaned_data["tenant"]:
                qs = qs.filter(tenant__name=form.cleaned_data["tenant"])
            if q := form.cleaned_data["q"]:
                job_id = form.job_id()
                qs = qs.filter(
                    Q(name__icontains=q) | Q(pk=job_id) if job_id is not None else Q(name__icontains=q)
                )
        else:
            state, qs = "active", qs.none()
            context["filter_errors"] = form.errors_text()
        total = qs.count()
        first = (page - 1) * PAGE_ROWS
        jobs = list(qs.order_by(*JOB_SORTS[sort][1])[first : first + PAGE_ROWS])
        query = {
            k: v
            for k, v in (("state", state), ("tenant", params.get("tenant", "")), ("q", params.get("q", "")))
            if v
        }
        context.update(
            jobs=jobs,
            total=total,
            shown_from=first + 1 if jobs else 0,
            shown_to=first + len(jobs),
            previous_page=urlencode({**query, "sort": sort, "page": page - 1}) if page > 1 else "",
            next_page=urlencode({**query, "sort": sort, "page": page + 1})
            if first + len(jobs) < total
            else "",
            sort=sort,
            page_rows=PAGE_ROWS,
            sorts=[
                (name, label, urlencode({**query, "sort": name})) for name, (label, _) in JOB_SORTS.items()
            ],
            # For jobs.js, which keeps the rows live and must match new jobs as this view does.
            active_states=" ".join(ACTIVE_JOB_STATES),
            finished_states=FINISHED_JOB_STATES,
            # A submitter sees only its tenants' jobs, so may_cancel holds for every
            # row it sees; the API decides again on the click.
            can_submit=has_role(self.request.user, Role.SUBMITTER),
            # Live rows (jobs.js) are added only to the first page of the newest-first order.
            page_full=len(jobs) == PAGE_ROWS or sort != "newest" or page > 1,
            states=JobState.choices,
            state=state,
            tenant=params.get("tenant", ""),
            q=params.get("q", ""),
            tenants=visible_tenant_names(self.request.user),
        )
        return context


def waiting_reason(job: Job) -> str:
    """Why a pending job waits, in words, from the fleet as it is now: the room
    the engine offers this job (spares kept unless it may borrow them), the
    what-if's figure (``placement.place.largest_free``), so the words never say
    there is room the job could not use."""
    if job.state != JobState.PENDING:
        return ""
    if job.num_nodes:
        with engine.live_snapshot() as snap:
            largest, _unit = largest_free(snap.fleet, engine.job_request(job))
        need = job.segment_nodes or job.num_nodes
        words = f"needs {need} nodes in one rack; the largest free slice is {largest}"
        if job.num_nodes > need:
            words = (
                f"needs {job.num_nodes} nodes in segments of {need}, each inside one rack; "
                + segment_room(largest, job.num_nodes, need)
            )
    else:
        words = f"needs {job.num_gpus} GPU(s) on one node"
    return f"{words}. {job.state_reason}".strip() if job.state_reason else words


def span_text(seconds: float) -> str:
    """A duration as the job page writes it (job.js has the same rule):
    "45 s", "12 min", "3 h 5 min", "2 d 4 h"."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def job_times(job: Job, now: datetime) -> dict:
    """The job page's times, kept current by job.js from the same fields: the run
    time from the first start to the end (or now), the expected end from the
    first start and the expected duration, and the wait from submission to the
    first start (or to the end of a job that never started, or now)."""
    started, ended = job.started_at, job.finished_at
    expected = timedelta(seconds=job.expected_duration_s) if job.expected_duration_s else None
    return {
        "run_time": span_text(((ended or now) - started).total_seconds()) if started else "",
        "expected_duration": span_text(expected.total_seconds()) if expected else "",
        "expected_end": started + expected if started and expected else None,
        "waited": span_text(((started or ended or now) - job.submitted_at).total_seconds()),
    }


class JobDetailView(RoleRequiredMixin, TemplateView):
    """A job: its placement on the grids, why it waits, and its history."""

    template_name = "fleet/job.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        qs = visible_jobs(self.request.user, Job.objects.select_related("tenant", "owner"))
        job = get_object_or_404(qs, pk=kwargs["pk"])
        racks = sorted(
            set(
                Allocation.objects.filter(job=job, released_at__isnull=True).values_list(
                    "gpu__node__rack_id", "gpu__node__rack__name"
                )
            )
        )
        rack_ids = [rack_id for rack_id, _name in racks]
        tenants = tenant_ids_of(self.request.user)  # once, not per action
        actions = [redact.action_for(a, tenants) for a in job.actions.prefetch_related("jobs")[:50]]
        now = timezone.now()
        context.update(
            job=job,
            racks=racks,
            rack_ids=rack_ids,
            export=export_job(job) if job.state in EXPORTABLE_STATES and rack_ids else None,
            waiting=waiting_reason(job),
            history=AuditEvent.objects.filter(object_type="job", object_id=str(job.pk))[:200],
            actions=actions,
            # The scheduler leaves a job alone while an open action holds it.
            open_states=OPEN_ACTION_STATES,
            held_by=sorted((a for a in actions if a.state in OPEN_ACTION_STATES), key=lambda a: a.created_at),
            times=job_times(job, now),
            now=now,
            can_cancel=may_cancel(self.request.user, job),
            finished_states=FINISHED_JOB_STATES,
        )
        return context


def compact(action: Action) -> bool:
    """An automatic decision: a placement the policy ran without a person. The
    Actions page folds these into a compact table, so those that need someone
    stand out."""
    return (
        action.kind in (ActionKind.PLACEMENT, ActionKind.PLACEMENT_SPILL)
        and action.state != ActionState.PROPOSED
    )


def _for_page(actions: list[Action]) -> list[Action]:
    """What the action templates read besides the model: steps in words and
    the plan the page's grids simulate."""
    for a in actions:
        a.step_texts = [describe_step(step) for step in a.steps]
        a.plan_json = json.dumps(
            {
                "steps": a.steps,
                "jobs": [j.pk for j in a.jobs.all()],
                "state": a.state,
                "step_index": a.step_index,
            }
        )
        # Jobs by name, except other tenants' (fleet.redact): those by id only.
        foreign = getattr(a, "foreign_jobs", set())
        a.job_links = [(j.pk, "" if j.pk in foreign else j.name) for j in a.jobs.all()]
    return actions


class ActionListView(FilteredPageMixin, RoleRequiredMixin, TemplateView):
    """The approval queue: each decision as before/after grids, its cost and
    benefit; Approve/Reject for operators (confirmed above
    RACKWISE_CONFIRM_GPU_HOURS); automatic placements in a compact table; new
    proposals added live (``ActionFragmentView``); and for operators, a defrag
    request and the approval policy."""

    template_name = "fleet/actions.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        qs = visible_actions(self.request.user, Action.objects.prefetch_related("jobs"))
        form = ActionPageFilterForm(self.request.GET)
        if form.is_valid():
            state, kind = form.cleaned_data["state"], form.cleaned_data["kind"]
            if state == "open":
                qs = qs.filter(state__in=OPEN_ACTION_STATES)
            elif state in ActionState.values:
                qs = qs.filter(state=state)
            if kind:
                qs = qs.filter(kind=kind)
        else:
            state, kind, qs = "open", "", qs.none()
            context["filter_errors"] = form.errors_text()
        # Other tenants' jobs by id only, as in /api/actions/ (fleet.redact).
        tenants = tenant_ids_of(self.request.user)
        actions = _for_page([redact.action_for(a, tenants) for a in qs[:PAGE_ROWS]])
        policies = action_policies()
        sizes = Rack.objects.aggregate(racks=Count("id"), nodes=Max("nodes_per_domain"))
        context.update(
            cards=[a for a in actions if not compact(a)],
            rows=[a for a in actions if compact(a)],
            state=state,
            kind=kind,
            states=ActionState.choices,
            kinds=ActionKind.choices,
            policy=[(value, label, policies[value]) for value, label in ActionKind.choices],
            modes=ApprovalMode.choices,
            confirm_gpu_hours=settings.RACKWISE_CONFIRM_GPU_HOURS,
            limits={
                "racks": sizes["racks"] or 1,
                "nodes_per_rack": sizes["nodes"] or 1,
                "budget": settings.RACKWISE_DEFRAG_BUDGET_GPU_HOURS,
                "max_moves": settings.RACKWISE_DEFRAG_MAX_MOVES,
            },
        )
        return context


class ActionFragmentView(RoleRequiredMixin, TemplateView):
    """One action as the Actions page draws it (a card, or a compact row for an
    automatic placement), for the page to add a new proposal without a reload;
    the same templates as the page, so there is one renderer."""

    def get_template_names(self):
        return ["fleet/_action_row.html" if self.compact else "fleet/_action_card.html"]

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        qs = visible_actions(self.request.user, Action.objects.prefetch_related("jobs"))
        action = get_object_or_404(qs, pk=kwargs["pk"])
        action = _for_page([redact.action_for(action, tenant_ids_of(self.request.user))])[0]
        self.compact = compact(action)
        context["a"] = action
        return context

    def get(self, request, *args, **kwargs):
        response = super().get(request, *args, **kwargs)
        response["X-Rackwise-Compact"] = "1" if self.compact else "0"
        return response


class AuditView(RoleRequiredMixin, TemplateView):
    """The audit log, filterable like ``/api/audit/``."""

    template_name = "fleet/audit.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        qs = visible_audit_events(self.request.user, AuditEvent.objects.all())
        # Always bound: an empty query string is a valid "no filter" (unbound,
        # the set is invalid and the first visit showed nothing).
        filterset = AuditEventFilterSet(self.request.GET, queryset=qs)
        events = filterset.qs if filterset.is_valid() else qs.none()
        context.update(events=list(events[:PAGE_ROWS]), filters=self.request.GET, errors=filterset.errors)
        return context


class WebhooksView(RoleRequiredMixin, TemplateView):
    """Webhook endpoints and their recent deliveries, with the forms and buttons
    that manage them through ``/api/webhooks/`` (operators only: the
    configuration is theirs; secrets are never in the page, only in the answer
    to a create or a rotation)."""

    template_name = "fleet/webhooks.html"
    minimum_role = Role.OPERATOR

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        # The API's own serializers (without secrets): static/rackwise/webhooks.js
        # draws the cards from this at load and from the API after every action,
        # so there is one renderer and one shape.
        webhooks = []
        for endpoint in WebhookEndpoint.objects.select_related("created_by"):
            recent = endpoint.deliveries.order_by("-created_at", "-id")[:DELIVERY_ROWS]
            # Payloads are not shown: leave them out of the page.
            deliveries = [
                {k: v for k, v in d.items() if k != "payload"}
                for d in WebhookDeliverySerializer(recent, many=True).data
            ]
            webhooks.append(WebhookEndpointSerializer(endpoint).data | {"deliveries": deliveries})
        context.update(webhooks=webhooks, events=WebhookEvent.choices, delivery_rows=DELIVERY_ROWS)
        return context


class JobSubmitView(RoleRequiredMixin, TemplateView):
    """The job submission form (submitters and operators). static/rackwise/submit.js
    asks ``POST /api/jobs/what-if/`` as it is filled in and submits to
    ``POST /api/jobs/``: the API validates every value against the fleet and its
    messages are shown as they come."""

    template_name = "fleet/submit.html"
    minimum_role = Role.SUBMITTER

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        user = self.request.user
        # The tenants a submission may name (fleet.services.jobs.submit.resolve_tenant).
        tenants = Tenant.objects.all() if has_role(user, Role.OPERATOR) else user.tenants.all()
        context.update(
            tenants=list(tenants.order_by("name").values_list("name", flat=True)),
            localities=Locality.choices,
            slurm=settings.RACKWISE_CLUSTER == "slurm",
            # A starting value for the form, not a limit: the API bounds it.
            gpus_per_node=fleet_capacity().dominant_gpus_per_node or 4,
        )
        return context


# The edit form's fields per node shape, with what a blank one means.
QUOTA_FORM_FIELDS = (
    ("nominal_gpus", "no quota"),
    ("borrowing_limit_gpus", "no limit"),
    ("lending_limit_gpus", "lends all"),
)


# The per-shape figures drawn as bars ("<kind>_gpus" in tenant_figures).
SHAPE_BARS = ("nominal", "in_use", "borrowed", "lent", "pending", "fair_share")


def _blank(value: int | None) -> str:
    return "" if value is None else str(value)


def _bar(value: float, scale: float) -> float:
    """A bar's width in percent of ``scale`` (0 to 100; an empty scale draws none)."""
    return round(min(100.0, max(0.0, 100.0 * value / scale)), 1) if scale > 0 else 0.0


class TenantsView(RoleRequiredMixin, TemplateView):
    """Tenants sharing the fleet: per node shape their quota, what they hold,
    borrow and lend; their pending demand, fair share and decayed usage, all
    from the read model ``/api/tenants/`` serves (``tenant_figures``), drawn as
    bars here. Operators edit quotas, weight and cohort in the page through
    ``/api/tenants/`` (static/rackwise/tenants.js), so the service's checks and
    audit apply as for any client; everyone else sees the figures only."""

    template_name = "fleet/tenants.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        tenants = tenant_figures()
        shapes = sorted(capacity_by_shape().items())
        # One scale per page for the tenant-wide figures, so bars compare across tenants.
        most_pending = max((t["pending_gpus"] for t in tenants), default=0)
        most_usage = max((t["decayed_usage_gpu_hours"] for t in tenants), default=0.0)
        for t in tenants:
            t["pending_bar"] = _bar(t["pending_gpus"], most_pending)
            t["usage_bar"] = _bar(t["decayed_usage_gpu_hours"], most_usage)
            t["share_bar"] = _bar(t["fair_share"], 1.0)
            for q in t["quotas"]:
                scale = max(q["cohort_capacity_gpus"], q["nominal_gpus"], q["in_use_gpus"])
                q["bars"] = {k: _bar(q[f"{k}_gpus"], scale) for k in SHAPE_BARS}
            # The edit form: one row per shape of the fleet, filled where the tenant
            # has a quota (a shape it only borrows in reads as nominal 0, no limits:
            # left blank, as no quota is the same thing).
            own = {
                q["gpus_per_node"]: q
                for q in t["quotas"]
                if q["nominal_gpus"] or any(q[f] is not None for f, _ in QUOTA_FORM_FIELDS[1:])
            }
            t["form_rows"] = [
                {
                    "gpus_per_node": shape,
                    "capacity": capacity,
                    "fields": [
                        (field, _blank(own.get(shape, {}).get(field)), hint)
                        for field, hint in QUOTA_FORM_FIELDS
                    ],
                }
                for shape, capacity in shapes
            ]
        context.update(tenants=tenants, shapes=shapes)
        return context
