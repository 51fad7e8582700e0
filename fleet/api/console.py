"""REST endpoints the operator console reads: the rack snapshot it repairs its
live picture from, and the chart's samples."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.events import rack_state, visible_to
from fleet.models import Rack
from fleet.permissions import sees_all_tenants
from fleet.services.metrics import samples_since


def tenant_filter(user) -> set[int] | None:
    """None when the user sees every tenant; else the tenants it belongs to."""
    return None if sees_all_tenants(user) else set(user.tenants.values_list("id", flat=True))


class ConsoleRacksView(APIView):
    """The cell state of every rack (or of ``ids``), each at its version, in the
    shape of the live feed's ``rack`` events and redacted the same way."""

    @extend_schema(
        parameters=[OpenApiParameter("ids", str, description="Comma-separated rack ids; default all.")],
        responses=inline_serializer("ConsoleRacks", {"racks": serializers.ListField(child=serializers.DictField())}),
    )
    def get(self, request):
        raw = request.query_params.get("ids")
        try:
            ids = [int(x) for x in raw.split(",") if x] if raw else list(Rack.objects.values_list("id", flat=True))
        except ValueError:
            raise ValidationError({"ids": ["comma-separated integers"]}) from None
        tenants = tenant_filter(request.user)
        return Response({"racks": [visible_to(e, tenants) for e in rack_state(ids)]})


class FleetSamplesView(APIView):
    """Utilization and fragmentation samples of the last ``hours`` (default 24)."""

    @extend_schema(
        parameters=[OpenApiParameter("hours", float, description="How far back; 1 to 720.")],
        responses=inline_serializer(
            "FleetSamples", {"samples": serializers.ListField(child=serializers.DictField())}
        ),
    )
    def get(self, request):
        try:
            hours = min(720.0, max(1.0, float(request.query_params.get("hours", 24))))
        except ValueError:
            raise ValidationError({"hours": ["a number of hours"]}) from None
        return Response(
            {
                "samples": [
                    {"at": s.at.isoformat(), "utilization": s.utilization, "fragmentation": s.fragmentation,
                     "gpus_used": s.gpus_used, "jobs_pending": s.jobs_pending}
                    for s in samples_since(hours)
                ]
            }
        )
