"""Fleet samples for the console's utilization and fragmentation chart."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from fleet.models import FleetSample
from fleet.services.defrag import fragmentation_report
from fleet.services.summary import fleet_summary

# Samples older than this are deleted when a new one is written.
KEEP = timedelta(days=14)


def record_sample() -> FleetSample:
    """Write one sample of the fleet now, and drop samples past ``KEEP``."""
    summary = fleet_summary()
    report = fragmentation_report()
    sample = FleetSample.objects.create(
        utilization=summary["utilization"],
        fragmentation=round(report.fraction, 4),
        gpus_used=summary["gpus_used"],
        gpus_free=summary["gpus_free"],
        gpus_failed=summary["gpus_failed"],
        jobs_pending=summary["jobs_by_state"].get("pending", 0),
        largest_job_gpus=report.largest_job_gpus,
    )
    FleetSample.objects.filter(at__lt=timezone.now() - KEEP).delete()
    return sample


def samples_since(hours: float, limit: int = 2000) -> list[FleetSample]:
    """Samples of the last ``hours``, thinned evenly to at most ``limit``."""
    rows = list(FleetSample.objects.filter(at__gte=timezone.now() - timedelta(hours=hours)))
    if len(rows) > limit:
        step = len(rows) / limit
        rows = [rows[int(i * step)] for i in range(limit)]
    return rows
