"""REST endpoints the operator console reads: the rack snapshot it repairs its
live picture from, and the chart's samples."""

from __future__ import annotations

import math

from django.conf import settings
from django.utils.decorators import method_decorator
from django.views.decorators.gzip import gzip_page
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.events import rack_state, visible_to
from fleet.models import Rack
from fleet.permissions import sees_all_tenants
from fleet.services.racks import change_cursor
from fleet.services.read.metrics import chart_markers, samples_since

MAX_SAMPLE_HOURS = 720.0
MAX_RACK_ID = 2**63 - 1  # the id column is a bigint
MAX_CURSOR = 2**63 - 1  # a transaction id, read as a bigint


def _rack_ids(raw: str) -> list[int]:
    """``ids`` as integers; a 400 for anything else, and for more ids than a page
    of racks holds (the list is one query's ``IN``)."""
    parts = [x for x in raw.split(",") if x]
    if len(parts) > settings.RACKWISE_API_MAX_LIMIT:
        raise ValidationError(
            {"ids": [f"at most {settings.RACKWISE_API_MAX_LIMIT} rack ids, got {len(parts)}"]}
        )
    if not all(p.isascii() and p.isdecimal() and len(p) <= 19 and int(p) <= MAX_RACK_ID for p in parts):
        raise ValidationError({"ids": ["comma-separated rack ids (positive integers)"]})
    return [int(p) for p in parts]


def tenant_filter(user) -> set[int] | None:
    """None when the user sees every tenant; else the tenants it belongs to."""
    return None if sees_all_tenants(user) else set(user.tenants.values_list("id", flat=True))


def _since(raw: str) -> int:
    """``since`` as an integer cursor (what an earlier answer's ``cursor`` was);
    a 400 for anything else. The cursor is a bigint like the ids."""
    if not (raw.isascii() and raw.isdecimal() and len(raw) <= 19 and int(raw) <= MAX_CURSOR):
        raise ValidationError(
            {"since": [f"a cursor from an earlier answer (an integer from 0 to {MAX_CURSOR})"]}
        )
    return int(raw)


@method_decorator(gzip_page, name="dispatch")
class ConsoleRacksView(APIView):
    """The cell state of every rack (or of ``ids``), each at its version, in the
    shape of the live feed's ``rack`` events and redacted the same way.

    Incremental: every answer carries a ``cursor``; ``?since=<cursor>`` answers
    only the racks changed since that answer (maybe a few the client already
    has, at the version it has: it compares versions; never one missed), and
    ``rack_ids``, every rack there is now (of ``ids``), so a client drops those
    gone (a topology import removes emptied racks). A cursor covers the racks
    its answer covered: ask ``since`` with the same ``ids``.

    Gzipped for clients that accept it (the console's first load is the whole
    fleet: 18 cells of 4 per rack compress well). Only this JSON is compressed,
    never a page with a CSRF token in it (BREACH)."""

    @extend_schema(
        parameters=[
            OpenApiParameter("ids", str, description="Comma-separated rack ids; default all."),
            OpenApiParameter(
                "since",
                int,
                description="The cursor of an earlier answer: only the racks changed since then "
                f"(an integer from 0 to {MAX_CURSOR}, else a 400).",
            ),
        ],
        responses=inline_serializer(
            "ConsoleRacks",
            {
                "racks": serializers.ListField(child=serializers.DictField()),
                "cursor": serializers.IntegerField(
                    help_text="Pass as ?since= for the racks changed after this answer."
                ),
                "rack_ids": serializers.ListField(
                    child=serializers.IntegerField(), help_text="Every rack there is now (of ids)."
                ),
            },
        ),
    )
    def get(self, request):
        raw = request.query_params.get("ids")
        raw_since = request.query_params.get("since")
        wanted = _rack_ids(raw) if raw else None
        since = _since(raw_since) if raw_since is not None else None
        # First: every change this answer's rows miss is stamped at or above it.
        cursor = change_cursor()
        racks = Rack.objects.order_by("id")
        if wanted is not None:
            racks = racks.filter(id__in=wanted)
        stamps = list(racks.values_list("id", "changed_xid"))
        rack_ids = [pk for pk, _ in stamps]
        changed = rack_ids if since is None else [pk for pk, stamp in stamps if stamp >= since]
        tenants = tenant_filter(request.user)
        return Response(
            {
                "cursor": cursor,
                "rack_ids": rack_ids,
                "racks": [visible_to(e, tenants) for e in rack_state(changed)],
            }
        )


class FleetSamplesView(APIView):
    """Samples of the last ``hours`` (default 24): utilization, fragmentation,
    queue depth and the pending jobs' wait percentiles; and the node failures and
    defrags to mark on the charts."""

    @extend_schema(
        parameters=[OpenApiParameter("hours", float, description="How far back; 1 to 720 (else a 400).")],
        responses=inline_serializer(
            "FleetSamples",
            {
                "samples": serializers.ListField(child=serializers.DictField()),
                "markers": serializers.ListField(child=serializers.DictField()),
            },
        ),
    )
    def get(self, request):
        raw = request.query_params.get("hours", "24")
        try:
            hours = float(raw) if len(raw) <= 20 else math.nan
        except ValueError:
            hours = math.nan
        # "nan" passed min/max clamping unnoticed; refuse what is not 1..720.
        if not 1.0 <= hours <= MAX_SAMPLE_HOURS:
            raise ValidationError(
                {"hours": [f"a number of hours from 1 to {MAX_SAMPLE_HOURS:g}, got {raw[:40]!r}"]}
            )
        return Response(
            {
                "samples": [
                    {
                        "at": s.at.isoformat(),
                        "utilization": s.utilization,
                        "fragmentation": s.fragmentation,
                        "gpus_used": s.gpus_used,
                        "jobs_pending": s.jobs_pending,
                        "wait_p50_s": s.wait_p50_s,
                        "wait_p95_s": s.wait_p95_s,
                    }
                    for s in samples_since(hours)
                ],
                "markers": chart_markers(hours),
            }
        )
