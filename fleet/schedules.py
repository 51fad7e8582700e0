"""Default periodic tasks, created after migrations if missing. They are
django-celery-beat rows, so operators can change or disable them in the admin;
an edited row is never overwritten."""

from __future__ import annotations

from django.conf import settings

# name -> (task, seconds between runs)
DEFAULT_SCHEDULES: dict[str, tuple[str, int]] = {
    "scheduling tick": ("fleet.tasks.schedule_pending", 30),
    "reconcile": ("fleet.tasks.reconcile", 30),
    # Half the recheck period, so no waiting proposal goes unchecked for longer
    # than RACKWISE_PROPOSAL_RECHECK_S (rack changes recheck sooner).
    "proposal recheck": ("fleet.tasks.recheck_proposals", max(1, settings.RACKWISE_PROPOSAL_RECHECK_S // 2)),
    "detect failed nodes": ("fleet.tasks.detect_failures", 15),
    # What the cluster did (jobs ended there; for Slurm also nodes, blocks and
    # held jobs to adopt); the simulated cluster also asks for a sync when a job
    # is due to end.
    "cluster sync": (
        "fleet.tasks.sync_cluster",
        settings.RACKWISE_SLURM_SYNC_S
        if settings.RACKWISE_CLUSTER == "slurm"
        else settings.RACKWISE_CLUSTER_SYNC_S,
    ),
    "defrag plan (hourly)": ("fleet.tasks.plan_defrag", 3600),
    "defrag thresholds": ("fleet.tasks.defrag_watch", 60),
    "fleet sample (console chart)": ("fleet.tasks.sample_fleet", 60),
    "webhook retries": ("fleet.tasks.sweep_webhooks", 15),
    "demo workload": ("fleet.tasks.demo_tick", 5),
}


def ensure_periodic_tasks(**_kwargs) -> None:
    from django_celery_beat.models import (  # a post_migrate hook: apps loaded by then
        IntervalSchedule,
        PeriodicTask,
    )

    for name, (task, seconds) in DEFAULT_SCHEDULES.items():
        if PeriodicTask.objects.filter(name=name).exists():
            continue
        interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.create(name=name, task=task, interval=interval)
