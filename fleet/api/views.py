"""The REST API. Views translate HTTP to service calls and back; they hold no
business rules (those live in fleet.services)."""

from __future__ import annotations

from django.db.models import Prefetch, Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api import serializers as s
from fleet.choices import Role
from fleet.export import export_job
from fleet.filtersets import AuditEventFilterSet, JobFilterSet, NodeFilterSet, RackFilterSet
from fleet.models import GPU, Allocation, AuditEvent, Job, Node, Rack
from fleet.permissions import may_cancel, role_of, sees_all_tenants, visible_audit_events, visible_jobs
from fleet.services.decisions import scheduling as scheduling_services
from fleet.services.jobs import allocations as job_allocations
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services
from fleet.services.read import attention as attention_services
from fleet.services.read import job_logs, read_models
from fleet.services.read import signals as signal_services
from fleet.services.read.summary import rack_summaries

# Bodies the API accepts, in the schema (and so in /api/docs/ and for fuzzers).
JOB_EXAMPLES = [
    OpenApiExample("one GPU", value={"name": "notebook", "tenant": "llm", "num_gpus": 1}, request_only=True),
    OpenApiExample(
        "a 2-node gang in one rack",
        value={
            "name": "llama-70b-ft",
            "tenant": "llm",
            "num_nodes": 2,
            "gpus_per_node": 4,
            "locality": "required",
            "expected_duration_s": 3600,
        },
        request_only=True,
    ),
]


class JobViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Submit, list, read and cancel jobs. Submitters see their tenants' jobs only."""

    serializer_class = s.JobSerializer
    filterset_class = JobFilterSet
    write_roles = {"create": Role.SUBMITTER, "cancel": Role.SUBMITTER, "what_if": Role.SUBMITTER}
    conflict_actions = ("export",)  # for the schema: 409 until the job is placed

    def get_queryset(self):
        qs = Job.objects.select_related("owner", "tenant").prefetch_related(
            Prefetch("allocations", queryset=job_allocations.held_or_last_allocations())
        )
        return visible_jobs(self.request.user, qs)

    def get_serializer_class(self):
        return s.JobSubmitSerializer if self.action == "create" else s.JobSerializer

    @extend_schema(
        request=s.JobSubmitSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                location=OpenApiParameter.HEADER,
                description="Unique per tenant; a retry with the same key and request returns the "
                "first submission's job with 200; the same key with another request is a 409.",
            )
        ],
        responses={201: s.JobSerializer, 200: s.JobSerializer},
        examples=JOB_EXAMPLES,
    )
    def create(self, request, *args, **kwargs):
        """Submit a job: 201 with the job; 200 with the same job for a retry that
        repeats an earlier submission's Idempotency-Key."""
        form = _job_form(request, context={"idempotency_key_header": request.headers.get("Idempotency-Key")})
        job, created = job_services.submit_job_once(request.user, job_services.JobSpec(**form.validated_data))
        if created:
            # Built from the row just created, not re-read: once the job is
            # committed, nothing may turn this answer into an error.
            return Response(
                s.JobSerializer(job, context={"just_submitted": True}).data, status=status.HTTP_201_CREATED
            )
        return Response(s.JobSerializer(self.get_queryset().get(pk=job.pk)).data, status=status.HTTP_200_OK)

    @extend_schema(request=s.JobSubmitSerializer, responses={200: s.WhatIfSerializer}, examples=JOB_EXAMPLES)
    @action(detail=False, methods=["post"], url_path="what-if")
    def what_if(self, request):
        """What would happen to this job if it were submitted now: where it would
        start, or why it waits, the largest free slice and the expected start. The
        same validation as submission; nothing is submitted."""
        form = _job_form(request)
        answer = scheduling_services.what_if(request.user, job_services.JobSpec(**form.validated_data))
        return Response(s.WhatIfSerializer(answer).data)

    @extend_schema(request=None, responses={200: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()  # 404 for jobs the user cannot see
        if not may_cancel(request.user, job):
            return Response(
                {"detail": "You can cancel only your tenants' jobs."}, status=status.HTTP_403_FORBIDDEN
            )
        job_services.cancel_job(request.user, job.pk)
        return Response(s.JobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "queue",
                str,
                description="Kueue LocalQueue: the manifest gets its label and the TAS annotations",
            )
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"])
    def export(self, request, pk=None):
        """The job's placement in the forms the cluster takes: Kubernetes affinity,
        Kueue annotations and a Job manifest; Slurm nodelist, segment and #SBATCH
        lines. 409 unless the job is placed or running."""
        job = self.get_object()  # 404 for jobs the user cannot see
        return Response(export_job(job, queue=request.query_params.get("queue") or None))

    @extend_schema(parameters=[s.JobLogQuerySerializer], responses={200: s.JobLogSerializer})
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """The job's log (Slurm: its output file; the simulated cluster: its own
        lines), redacted, for whoever may see the job. Follow it by asking again
        with ``offset=next_offset`` until ``eof``; no log to read is a 200 with
        ``available: false`` and the reason."""
        job = self.get_object()  # 404 for jobs the user cannot see
        query = s.JobLogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        answer = job_logs.read_job_log(job, **query.validated_data)
        return Response(s.JobLogSerializer(answer).data)


def _job_form(request, context: dict | None = None) -> s.JobSubmitSerializer:
    """The job request's form, validated: a 400 names every field that is wrong
    or missing at once (the tenant and the size too, which the service checks)."""
    form = s.JobSubmitSerializer(data=request.data, context=context or {})
    if not form.is_valid():
        missing = job_services.missing_fields(request.user, request.data)
        raise ValidationError({**missing, **form.errors})
    return form


class RackViewSet(viewsets.ReadOnlyModelViewSet):
    """Racks (NVLink domains) with GPU and node counts; detail has every cell."""

    queryset = Rack.objects.all()
    filterset_class = RackFilterSet

    def get_serializer_class(self):
        return s.RackDetailSerializer if self.action == "retrieve" else s.RackSerializer

    def get_queryset(self):
        qs = Rack.objects.all()
        if self.action == "retrieve":
            qs = qs.prefetch_related(Prefetch("nodes", queryset=Node.objects.prefetch_related("gpus")))
        return qs

    def list(self, request, *args, **kwargs):
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        racks = page if page is not None else list(queryset)
        data = self.get_serializer(racks, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    def get_serializer(self, *args, **kwargs):
        context = kwargs.pop("context", None) or self.get_serializer_context()
        if args:
            racks = args[0] if isinstance(args[0], list) else [args[0]]
            # Summaries for exactly the racks being serialised, in a few grouped queries.
            context["summaries"] = rack_summaries(Rack.objects.filter(id__in=[r.id for r in racks]))
            if self.action == "retrieve":
                context.update(_cell_context(self.request, Q(gpu__node__rack_id=racks[0].id)))
        return self.get_serializer_class()(*args, context=context, **kwargs)

    @extend_schema(responses=s.RackSignalsSerializer)
    @action(detail=True, methods=["get"])
    def signals(self, request, pk=None):
        """Every node's health at a glance: its hottest GPU, power, clock events,
        flags set, error counters rising, fabric, the last hour's temperature and
        power a minute, and the health rules' verdicts in force with their reasons."""
        return Response(signal_services.rack_signals(self.get_object().pk))


def _cell_context(request, allocation_filter: Q) -> dict:
    """Which job holds each GPU, for GPU cells in rack and node details."""
    active = Allocation.objects.filter(allocation_filter, released_at__isnull=True).select_related(
        "job__tenant"
    )
    return {
        "job_by_gpu": {a.gpu_id: a.job for a in active},
        "my_tenant_ids": set(request.user.tenants.values_list("id", flat=True))
        if not sees_all_tenants(request.user)
        else set(),
    }


_MOVE_409 = OpenApiResponse(
    s.NodeImpactSerializer,
    description="The node's state does not allow the move; or the move is disruptive, the node holds jobs "
    "and ``confirm`` was not sent: ``impact`` names the jobs and the GPU-hours it would cost.",
)


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes, and the operator actions on them."""

    filterset_class = NodeFilterSet

    def get_queryset(self):
        qs = Node.objects.select_related("rack")
        if self.action != "list":
            qs = qs.prefetch_related(Prefetch("gpus", queryset=GPU.objects.order_by("index")))
        return qs

    def get_serializer_class(self):
        return s.NodeSerializer if self.action == "list" else s.NodeDetailSerializer

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if "pk" in self.kwargs:
            context.update(_cell_context(self.request, Q(gpu__node_id=self.kwargs["pk"])))
        return context

    def _act(self, request, move: str) -> Response:
        node = self.get_object()
        form = s.NodeMoveSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        node_services.operator_move(
            request.user, node.pk, move, form.validated_data["reason"], confirm=form.validated_data["confirm"]
        )
        fresh = self.get_queryset().get(pk=node.pk)
        return Response(s.NodeDetailSerializer(fresh, context=self.get_serializer_context()).data)

    @extend_schema(responses=s.NodeSignalsSerializer)
    @action(detail=True, methods=["get"])
    def signals(self, request, pk=None):
        """The health signals its agent last read from NVML per GPU (and those the
        GPU does not support), counter rates across resets, the last hour's
        temperature and power, the IMEX status and the NVLink fabric identity."""
        return Response(signal_services.node_signals(self.get_object().pk))

    @extend_schema(request=s.NodeMoveSerializer, responses={200: s.NodeDetailSerializer, 409: _MOVE_409})
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        """Stop new work landing here; jobs on it finish in place. Needs a reason,
        and ``confirm: true`` when jobs run on it."""
        return self._act(request, "drain")

    @extend_schema(request=s.NodeMoveSerializer, responses={200: s.NodeDetailSerializer, 409: _MOVE_409})
    @action(detail=True, methods=["post"])
    def undrain(self, request, pk=None):
        return self._act(request, "undrain")

    @extend_schema(request=s.NodeMoveSerializer, responses={200: s.NodeDetailSerializer, 409: _MOVE_409})
    @action(detail=True, methods=["post"], url_path="mark-failed")
    def mark_failed(self, request, pk=None):
        """Take the node out of service; its jobs go to recovering. Needs a
        reason, and ``confirm: true`` when jobs run on it."""
        return self._act(request, "mark-failed")

    @extend_schema(request=s.NodeMoveSerializer, responses={200: s.NodeDetailSerializer, 409: _MOVE_409})
    @action(detail=True, methods=["post"], url_path="return-to-service")
    def return_to_service(self, request, pk=None):
        return self._act(request, "return-to-service")


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit log. Submitters see their own actions and their tenants' jobs."""

    queryset = AuditEvent.objects.none()  # for the schema; see get_queryset
    serializer_class = s.AuditEventSerializer
    filterset_class = AuditEventFilterSet

    def get_queryset(self):
        qs = AuditEvent.objects.all()
        if getattr(self, "swagger_fake_view", False):
            return qs
        return visible_audit_events(self.request.user, qs)


class FleetSummaryView(APIView):
    """Totals, utilization and free nodes per rack."""

    @extend_schema(responses=s.FleetSummarySerializer)
    def get(self, request):
        return Response(s.FleetSummarySerializer(read_models.summary()).data)


class FragmentationView(APIView):
    """Fragmentation, fleet-wide and per rack: the share of free GPUs (spares kept
    for recovery left out) that the typical multi-node job (the median of the
    pending jobs and the last day's) cannot use, because they sit on partly used
    nodes or in racks whose free slice is smaller than its share of a rack. Also
    the largest free slice (the largest rack-local gang placeable now, spares
    kept). The console header, the Fleet chart and /metrics show these figures;
    the definition in full: docs/fragmentation.md."""

    @extend_schema(responses=s.FragmentationSerializer)
    def get(self, request):
        return Response(s.FragmentationSerializer(read_models.fragmentation().to_dict()).data)


class AttentionView(APIView):
    """What needs a person now: actions awaiting approval (and the oldest's age),
    recovering jobs, jobs waiting longer than RACKWISE_WAIT_WARN_S, and nodes
    suspect, failed or in repair; each with the console page to act on it."""

    @extend_schema(responses=s.AttentionSerializer)
    def get(self, request):
        return Response(s.AttentionSerializer(attention_services.attention(request.user)).data)


class MeView(APIView):
    """Who is calling, and with which role."""

    @extend_schema(responses=s.MeSerializer)
    def get(self, request):
        role = role_of(request.user)
        data = {
            "username": request.user.get_username(),
            "role": role.value if role else None,
            "tenants": list(request.user.tenants.values_list("name", flat=True)),
        }
        return Response(s.MeSerializer(data).data)
