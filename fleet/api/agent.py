"""The API the node agents talk to (heartbeats), and the operator endpoint that
issues their tokens.

Agents authenticate with ``Authorization: Agent <node_id>.<secret>`` and are
scoped to their node; they are not users and hold no role, so the heartbeat view
has its own authentication and permission classes while every other view keeps
the default ``fleet.permissions.HasRole``.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    get_authorization_header,
)
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.auth import TokenAuthentication
from fleet.choices import GpuHealth, NodeState
from fleet.models import Node
from fleet.services.intake import health


class AgentTokenAuthentication(BaseAuthentication):
    """``Authorization: Agent <node_id>.<secret>`` -> an AgentPrincipal for that node.

    Returns None for any other scheme, so user tokens and sessions can still be
    recognised (and then refused with 403 by :class:`IsNodeAgent`)."""

    keyword = "Agent"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Invalid agent token header: expected 'Agent <node_id>.<secret>'.")
        try:
            token = parts[1].decode()
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed("Invalid agent token header: not ASCII.") from exc
        principal = health.authenticate_agent(token)
        if principal is None:
            raise AuthenticationFailed("Invalid or rotated agent token.")
        return principal, None

    def authenticate_header(self, request) -> str:
        # Makes a missing credential a 401 (with this challenge) rather than a 403.
        return self.keyword


class AgentTokenAuthenticationScheme(OpenApiAuthenticationExtension):
    """Documents the Agent scheme in the OpenAPI schema."""

    target_class = "fleet.api.agent.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "Node agent token, as 'Agent <node_id>.<secret>' (see create_agent_token).",
        }


class IsNodeAgent(BasePermission):
    """Only the agent of the node in the URL. Users are refused even when they are
    operators: a heartbeat must come from the machine it describes."""

    message = "Heartbeats are accepted only from the node's agent (Authorization: Agent <node_id>.<secret>)."

    def has_permission(self, request, view) -> bool:
        principal = request.user
        if not isinstance(principal, health.AgentPrincipal):
            return False
        if str(principal.node_id) != str(view.kwargs.get("pk")):
            self.message = f"This agent token belongs to node {principal.node_id} ({principal.hostname})."
            return False
        return True


class HeartbeatGpuSerializer(serializers.Serializer):
    # Documentation of the bounds fleet.services.intake.health enforces (it names the
    # field of every violation in its 400).
    index = serializers.IntegerField(
        min_value=0, help_text="One of the node's GPU indices, each at most once."
    )
    state = serializers.ChoiceField(choices=GpuHealth.choices)
    xids = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=health.MAX_XID),
        required=False,
        max_length=health.MAX_XIDS_PER_GPU,
        help_text="XID events seen since the last delivered heartbeat.",
    )
    temperature_c = serializers.FloatField(
        allow_null=True,
        required=False,
        min_value=health.TEMPERATURE_RANGE_C[0],
        max_value=health.TEMPERATURE_RANGE_C[1],
    )
    error = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=health.MAX_ERROR_CHARS,
        help_text="What went wrong, when there is no XID (no NUL characters).",
    )


class HeartbeatSerializer(serializers.Serializer):
    """A heartbeat. Only documents the body: fleet.services.intake.health validates it.
    A refused body (400) still counts as a sign of life: ``last_heartbeat_at``
    is stamped before the report is read."""

    gpus = HeartbeatGpuSerializer(many=True, help_text="At most one entry per GPU of the node.")
    agent_version = serializers.CharField(required=False, max_length=health.MAX_VERSION_CHARS)


class GpuChangeSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    health_before = serializers.ChoiceField(choices=GpuHealth.choices)
    health = serializers.ChoiceField(choices=GpuHealth.choices)
    last_error = serializers.CharField()


class HeartbeatResultSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    hostname = serializers.CharField()
    node_state_before = serializers.ChoiceField(choices=NodeState.choices)
    node_state = serializers.ChoiceField(choices=NodeState.choices)
    last_heartbeat_at = serializers.DateTimeField()
    agent_version = serializers.CharField()
    gpus_changed = GpuChangeSerializer(many=True)


class AgentTokenSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    hostname = serializers.CharField()
    token = serializers.CharField(help_text="Shown once; only a hash is stored. Issuing again rotates it.")


class NodeHeartbeatView(APIView):
    """A heartbeat from a node's agent: per-GPU health and XID events."""

    # Agent tokens first (its challenge makes "no credentials" a 401); user tokens
    # and sessions are recognised only so that they can be refused with 403.
    authentication_classes = [AgentTokenAuthentication, TokenAuthentication, SessionAuthentication]
    permission_classes = [IsNodeAgent]
    parser_classes = [JSONParser]

    @extend_schema(
        operation_id="nodes_heartbeat",
        request=HeartbeatSerializer,
        responses={
            200: HeartbeatResultSerializer,
            400: OpenApiResponse(description="Invalid payload; field messages say what is wrong."),
            401: OpenApiResponse(description="Missing, invalid or rotated agent token."),
            403: OpenApiResponse(description="Not this node's agent."),
        },
    )
    def post(self, request, pk: int):
        result = health.record_heartbeat(pk, request.data)
        return Response(HeartbeatResultSerializer(result).data)


class NodeAgentTokenView(APIView):
    """Issue (or rotate) a node's agent token. Operators only (HasRole's default
    for writes); the token is returned once."""

    @extend_schema(operation_id="nodes_agent_token", request=None, responses={201: AgentTokenSerializer})
    def post(self, request, pk: int):
        node = Node.objects.get(pk=pk)  # 404 via the exception handler
        token = health.issue_agent_token(request.user, node.pk)
        data = {"node_id": node.pk, "hostname": node.hostname, "token": token}
        # The secret must not linger in caches along the way.
        return Response(
            AgentTokenSerializer(data).data,
            status=status.HTTP_201_CREATED,
            headers={"Cache-Control": "no-store"},
        )
