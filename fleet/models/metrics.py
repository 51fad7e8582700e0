"""Time series for the console's chart."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class FleetSample(models.Model):
    """Fleet-wide utilization and fragmentation at one moment, written by the
    periodic ``fleet.tasks.sample_fleet`` task (every minute by default)."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    utilization = models.FloatField(help_text="GPUs used over GPUs total, 0..1.")
    fragmentation = models.FloatField(help_text="Fragmented over free GPUs, 0..1.")
    gpus_used = models.PositiveIntegerField(default=0)
    gpus_free = models.PositiveIntegerField(default=0)
    gpus_failed = models.PositiveIntegerField(default=0)
    jobs_pending = models.PositiveIntegerField(default=0)
    largest_job_gpus = models.PositiveIntegerField(default=0)
    wait_p50_s = models.FloatField(
        default=0.0, help_text="Median time the pending jobs have waited so far, seconds."
    )
    wait_p95_s = models.FloatField(
        default=0.0, help_text="95th percentile of the pending jobs' waits so far, seconds."
    )

    class Meta:
        ordering = ["at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} util {self.utilization:.2f} frag {self.fragmentation:.2f}"
