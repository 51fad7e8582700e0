"""Fleet samples for the console's charts (utilization and fragmentation, queue
depth and waits), and the failure and defrag markers drawn on them."""

from __future__ import annotations

import math
from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from fleet.choices import ActionKind, JobState
from fleet.models import Action, AuditEvent, FleetSample, Job
from fleet.services.read import read_models
from fleet.services.read.summary import fleet_summary

# Samples older than this are deleted when a new one is written.
KEEP = timedelta(days=14)


# At most this many markers of each kind on a chart (the latest).
MAX_MARKERS = 200


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0..100) of sorted values; 0 for none."""
    if not sorted_values:
        return 0.0
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def record_sample() -> FleetSample:
    """Write one sample of the fleet now, and drop samples past ``KEEP``.

    The fragmentation figure is the read model's (``fragmentation_report()``,
    shared with the header, the API and /metrics), so the chart's latest point is
    the number they show, not one computed a moment apart."""
    summary = fleet_summary()
    report = read_models.fragmentation()
    now = timezone.now()
    waits = sorted(
        (now - at).total_seconds()
        for at in Job.objects.filter(state=JobState.PENDING).values_list("submitted_at", flat=True)
    )
    sample = FleetSample.objects.create(
        utilization=summary["utilization"],
        fragmentation=round(report.fraction, 4),
        gpus_used=summary["gpus_used"],
        gpus_free=summary["gpus_free"],
        gpus_failed=summary["gpus_failed"],
        jobs_pending=summary["jobs_by_state"].get("pending", 0),
        largest_job_gpus=report.largest_job_gpus,
        wait_p50_s=round(percentile(waits, 50), 1),
        wait_p95_s=round(percentile(waits, 95), 1),
    )
    FleetSample.objects.filter(at__lt=timezone.now() - KEEP).delete()
    return sample


def samples_since(hours: float, limit: int = 2000) -> list[FleetSample]:
    """Samples of the last ``hours``, thinned evenly to at most ``limit``; the
    latest is always kept (the chart's readout shows it next to the header)."""
    rows = list(FleetSample.objects.filter(at__gte=timezone.now() - timedelta(hours=hours)))
    if len(rows) > limit:
        step = (len(rows) - 1) / (limit - 1) if limit > 1 else len(rows)
        rows = [rows[round(i * step)] for i in range(limit - 1)] + [rows[-1]]
    return rows


def chart_markers(hours: float) -> list[dict]:
    """Node failures and defrags of the last ``hours``, as the charts mark them:
    ``{at, kind, text, url}``, oldest first."""
    since = timezone.now() - timedelta(hours=hours)
    failures = AuditEvent.objects.filter(action="node.fail", created_at__gte=since).order_by("-created_at")[
        :MAX_MARKERS
    ]
    defrags = Action.objects.filter(kind=ActionKind.DEFRAG, started_at__gte=since).order_by("-started_at")[
        :MAX_MARKERS
    ]
    markers = [
        {
            "at": e.created_at.isoformat(),
            "kind": "failure",
            "text": f"{e.object_repr} failed: {e.message}".strip(": "),
            "url": "",
        }
        for e in failures
    ] + [
        {
            "at": a.started_at.isoformat(),
            "kind": "defrag",
            "text": f"defrag #{a.pk} ({a.state})",
            "url": f"{reverse('actions')}?state=all#action-{a.pk}",
        }
        for a in defrags
        if a.started_at is not None  # all of them: started_at__gte leaves out NULL
    ]
    return sorted(markers, key=lambda m: m["at"])
