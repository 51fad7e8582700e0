"""API for actions: the approval queue, operator decisions, defrag requests,
the approval policy, the webhook cluster's callbacks, and the step kinds."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet import redact, steps
from fleet.api.serializers import MAX_INT32, FiniteFloatField, KnownFieldsOnly
from fleet.choices import ActionKind, ApprovalMode
from fleet.filtersets import ActionFilterSet
from fleet.locks import Busy, decisions
from fleet.models import Action, HoldRole
from fleet.permissions import tenant_ids_of, visible_actions
from fleet.services.actions import propose as action_services
from fleet.services.actions.lifecycle import HOLD_KINDS
from fleet.services.decisions import defrag as defrag_services
from fleet.services.execution import callbacks as callback_services

# The schema's bound; RACKWISE_DEFRAG_MAX_BUDGET_GPU_HOURS (checked by the service) may be lower.
MAX_BUDGET_GPU_HOURS = 1e9


class HoldSerializer(serializers.Serializer):
    node = serializers.IntegerField(source="node_id")
    hostname = serializers.CharField(source="node.hostname")
    rack = serializers.IntegerField(source="node.rack_id")
    rack_name = serializers.CharField(source="node.rack.name")
    role = serializers.ChoiceField(
        choices=HoldRole.choices, help_text="empty: the plan moves jobs off it; fill: it moves jobs onto it."
    )


class ActionSerializer(serializers.ModelSerializer):
    jobs = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    steps = serializers.SerializerMethodField()
    redacted = serializers.SerializerMethodField()
    holds = serializers.SerializerMethodField()
    replaced_by = serializers.SerializerMethodField()

    class Meta:
        model = Action
        fields = [
            "id",
            "kind",
            "state",
            "title",
            "jobs",
            "steps",
            "plan",
            "cost_gpu_hours",
            "benefit",
            "fleet_version",
            "proposed_by_name",
            "decided_by_name",
            "decided_at",
            "decision_note",
            "step_index",
            "progress",
            "log",
            "error",
            "created_at",
            "updated_at",
            "started_at",
            "finished_at",
            "redacted",
            "holds",
            "lost_gpu_hours",
            "replaces",
            "replaced_by",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "lost_gpu_hours": {
                "help_text": "What the plan's end cost: the GPU-hours of work lost by every job it stopped "
                "(null until a plan that holds nodes ends)."
            },
            "replaces": {"help_text": "The plan this one was made to replace (it had gone stale)."},
        }

    @extend_schema_field(HoldSerializer(many=True))
    def get_holds(self, obj: Action) -> list[dict]:
        """The nodes held for the plan from its approval to its end."""
        # Read through .all(), so that a list's prefetch (ActionViewSet) serves it.
        holds = sorted(obj.holds.all(), key=lambda h: h.node_id)
        return HoldSerializer(holds, many=True).data

    def get_replaced_by(self, obj: Action) -> int | None:
        """The plan made to replace this one, when it went stale."""
        return max((r.pk for r in obj.replacements.all()), default=None)

    def to_representation(self, instance: Action) -> dict:
        # A submitter reads other tenants' jobs in an action by id only (fleet.redact);
        # the view puts the reader's tenants in the context (absent: the full action).
        return super().to_representation(redact.action_for(instance, self.context.get("tenant_ids")))

    def get_redacted(self, obj: Action) -> bool:
        """True when other tenants' job details were withheld from this answer."""
        return bool(getattr(obj, "redacted", False))

    def get_steps(self, obj: Action) -> list[dict]:
        """The ordered steps, each in words, with whether it is done."""
        return [
            {"index": i, "op": s["op"], "text": action_services.describe_step(s), "done": i < obj.step_index}
            for i, s in enumerate(obj.steps)
        ]


class DecisionSerializer(KnownFieldsOnly):
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class ReplannedSerializer(serializers.Serializer):
    """A 409 to an approval: ``detail`` says why; when the plan had gone stale
    and was made again, the new plan (``action``) and its cost come with it."""

    detail = serializers.CharField()
    replanned = serializers.BooleanField(required=False)
    action = ActionSerializer(
        required=False, help_text="The new plan, proposed: approve it to confirm its cost."
    )
    cost_gpu_hours = serializers.FloatField(required=False)
    previous_cost_gpu_hours = serializers.FloatField(required=False)


class DefragRequestSerializer(KnownFieldsOnly):
    """A defrag request. The counts are bounded here by the columns' range and, in
    ``DefragGoal.check``, by what the fleet has (a 400 says what fits)."""

    free_racks = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_INT32,
        help_text="Target: this many whole free racks (at most the fleet's racks).",
    )
    room_for_nodes = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_INT32,
        help_text="Target: room for a rack-local job of this many nodes "
        "(at most the fleet's nodes of that size).",
    )
    gpus_per_node = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_INT32,
        help_text="With room_for_nodes: the node size (one the fleet has); default the largest.",
    )
    budget_gpu_hours = FiniteFloatField(required=False, min_value=0.001, max_value=MAX_BUDGET_GPU_HOURS)
    max_moves = serializers.IntegerField(required=False, min_value=1, max_value=MAX_INT32)


class PolicySerializer(KnownFieldsOnly):
    kind = serializers.ChoiceField(choices=ActionKind.choices)
    mode = serializers.ChoiceField(choices=ApprovalMode.choices)


# What an action's answer reads besides its row: one query each for a whole list.
PREFETCH = ("jobs", "replacements", "holds__node__rack")


class ActionViewSet(viewsets.ReadOnlyModelViewSet):
    """Placement, recovery, defrag and drain decisions; operators approve them."""

    queryset = Action.objects.prefetch_related(*PREFETCH)
    serializer_class = ActionSerializer
    filterset_class = ActionFilterSet
    write_roles: dict = {}  # every write here is for operators (the default)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset
        return visible_actions(self.request.user, Action.objects.prefetch_related(*PREFETCH))

    def get_serializer_context(self) -> dict:
        context = super().get_serializer_context()
        if not getattr(self, "swagger_fake_view", False):
            context["tenant_ids"] = tenant_ids_of(self.request.user)
        return context

    def _decide(self, request, service) -> Response:
        action_obj = self.get_object()
        form = DecisionSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        service(request.user, action_obj.pk, form.validated_data["note"])
        return Response(self._read(action_obj.pk))

    def _read(self, pk: int) -> dict:
        return ActionSerializer(self.get_queryset().get(pk=pk), context=self.get_serializer_context()).data

    @extend_schema(
        request=DecisionSerializer,
        responses={
            200: ActionSerializer,
            409: OpenApiResponse(
                ReplannedSerializer,
                description="Conflicts with the action's state; "
                "or the plan had gone stale and was made again: "
                "``action`` is the new plan, which waits for the operator to confirm its cost (approve it).",
            ),
        },
    )
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Approve a proposed action. A plan that holds nodes (a defrag plan, a
        migration) is checked on the fleet as it is now, under the decision lock,
        and holds its nodes from here; one that went stale is made again and the
        answer is a 409 with the new plan and its cost, to be confirmed."""
        action_obj = self.get_object()
        form = DecisionSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        note = form.validated_data["note"]
        try:
            if action_obj.kind in HOLD_KINDS:
                with decisions(wait=30):
                    action_services.approve(request.user, action_obj.pk, note)
            else:
                action_services.approve(request.user, action_obj.pk, note)
        except Busy:
            return Response(
                {"detail": "another decision is in progress; try again in a moment"},
                status=status.HTTP_409_CONFLICT,
            )
        except action_services.Replanned as exc:
            body = {
                "detail": str(exc),
                "replanned": True,
                "action": self._read(exc.successor.pk),
                "cost_gpu_hours": exc.successor.cost_gpu_hours,
                "previous_cost_gpu_hours": exc.action.cost_gpu_hours,
            }
            return Response(body, status=status.HTTP_409_CONFLICT)
        return Response(self._read(action_obj.pk))

    @extend_schema(request=DecisionSerializer, responses=ActionSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._decide(request, action_services.reject)

    @extend_schema(request=DecisionSerializer, responses=ActionSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._decide(request, action_services.cancel)

    @extend_schema(
        request=DefragRequestSerializer,
        responses={
            201: ActionSerializer,
            200: inline_serializer(
                "DefragNothingToDo",
                {
                    "proposed": serializers.BooleanField(),
                    "reason": serializers.CharField(),
                    "plan": serializers.DictField(),
                },
            ),
        },
    )
    @action(detail=False, methods=["post"])
    def defrag(self, request):
        """Plan a defragmentation now (optional target and budget). The plan
        waits in the queue for approval."""
        form = DefragRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            with decisions(wait=30):
                outcome = defrag_services.plan_defrag(
                    request.user, defrag_services.DefragGoal(**form.validated_data)
                )
        except Busy:
            return Response(
                {"detail": "another decision is in progress; try again in a moment"},
                status=status.HTTP_409_CONFLICT,
            )
        if outcome.action is None:
            return Response({"proposed": False, "reason": outcome.reason, "plan": outcome.plan})
        return Response(ActionSerializer(outcome.action).data, status=status.HTTP_201_CREATED)


class ApprovalPolicyView(APIView):
    """Which kinds of action run automatically and which wait for an operator."""

    @extend_schema(
        responses=inline_serializer(
            "ApprovalPolicies", {k: serializers.CharField() for k in ActionKind.values}
        )
    )
    def get(self, request):
        return Response(action_services.policies())

    @extend_schema(
        request=PolicySerializer,
        responses=inline_serializer(
            "ApprovalPoliciesUpdated", {k: serializers.CharField() for k in ActionKind.values}
        ),
    )
    def put(self, request):
        form = PolicySerializer(data=request.data)
        form.is_valid(raise_exception=True)
        action_services.set_policy(request.user, form.validated_data["kind"], form.validated_data["mode"])
        return Response(action_services.policies())


class ActionCallbackView(APIView):
    """Signed callbacks from the webhook cluster's receiver (HMAC, no user login)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        request=inline_serializer(
            "StepCallback",
            {
                "action_id": serializers.IntegerField(
                    help_text="The action of the step, as the step's POST said."
                ),
                "step_index": serializers.IntegerField(),
                "status": serializers.ChoiceField(choices=["succeeded", "failed"]),
                "message": serializers.CharField(required=False),
                "external_id": serializers.CharField(
                    required=False, max_length=64, help_text="The job's id in the receiver's cluster."
                ),
            },
        ),
        responses={
            202: inline_serializer(
                "StepCallbackAccepted",
                {"status": serializers.CharField(), "message": serializers.CharField()},
            ),
            400: OpenApiResponse(description="Malformed body."),
            403: OpenApiResponse(description="Bad or missing signature, or signed for another action."),
            404: OpenApiResponse(description="No such action."),
            409: OpenApiResponse(
                description="The action is not executing this step, or the step was already reported."
            ),
        },
    )
    def post(self, request, pk: int):
        # The signature is checked first (in record_callback): the state of an
        # action is nobody's business until the caller proves it is the receiver.
        try:
            result = callback_services.record_callback(
                pk, request.body, request.headers.get("X-Rackwise-Signature")
            )
        except PermissionError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        except ValueError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        return Response(result, status=status.HTTP_202_ACCEPTED)


class StepKindSerializer(serializers.Serializer):
    op = serializers.CharField()
    label = serializers.CharField()
    description = serializers.CharField()
    effect = serializers.ChoiceField(
        choices=["allocate", "swap", "release", "drain", "undrain", "none"],
        help_text="What the step does to the racks' picture (the console's before/after grids).",
    )
    fields = serializers.ListField(
        child=serializers.CharField(), help_text="The keys a stored step of this kind may have, besides op."
    )


class StepKindsView(APIView):
    """The kinds of step an action is made of (fleet.steps), for any
    signed-in reader; the console's action page draws plans from this list."""

    @extend_schema(responses=StepKindSerializer(many=True))
    def get(self, request):
        return Response(StepKindSerializer(steps.kinds(), many=True).data)
