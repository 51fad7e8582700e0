"""Demo mode: a workload generator and a failure model, so the console shows a
living fleet. Jobs complete through the simulated cluster (fleet.cluster.simulated); this adds the rest:
a stream of submissions, a node failing now and then, and repairs."""

from __future__ import annotations

import random
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from fleet.choices import HOLDING_JOB_STATES, JobState, Locality, NodeState
from fleet.models import Allocation, Job, Node
from fleet.services.errors import ServiceError
from fleet.services.jobs import submit as job_services
from fleet.services.nodes import moves as node_services
from fleet.services.read.summary import fleet_summary

# (weight, spec) — from single GPUs to a two-rack gang in segments of 16 nodes.
WORKLOAD_MIX: list[tuple[float, dict]] = [
    (0.14, {"num_gpus": 1, "name": "notebook"}),
    (0.08, {"num_gpus": 2, "name": "finetune-small"}),
    (0.12, {"num_gpus": 4, "name": "eval"}),
    (0.16, {"num_nodes": 2, "gpus_per_node": 4, "name": "finetune-8b"}),
    (0.16, {"num_nodes": 4, "gpus_per_node": 4, "name": "train-moe"}),
    (0.14, {"num_nodes": 8, "gpus_per_node": 4, "name": "train-70b"}),
    (0.12, {"num_nodes": 16, "gpus_per_node": 4, "name": "pretrain"}),
    (
        0.04,
        {
            "num_nodes": 32,
            "gpus_per_node": 4,
            "segment_nodes": 16,
            "locality": Locality.PREFERRED,
            "name": "frontier",
        },
    ),
    (0.04, {"num_nodes": 12, "gpus_per_node": 4, "locality": Locality.PREFERRED, "name": "rl-rollout"}),
]
TARGET_LOAD = 0.85  # GPUs held or asked for, over the fleet's GPUs
FAILURES_PER_MINUTE = 0.3
REPAIR_AFTER = timedelta(minutes=2)
DEMO_SUBMITTERS = {"submitter": "llm", "vision-submitter": "vision"}


def _duration(rng: random.Random) -> int:
    # Heavy-tailed: median about three minutes, a few much longer.
    return int(min(1800, max(30, rng.lognormvariate(5.2, 0.8))))


def tick(
    rng: random.Random | None = None,
    tick_seconds: float = 5.0,
    failures_per_minute: float = FAILURES_PER_MINUTE,
) -> str:
    rng = rng or random.Random()
    notes: list[str] = []
    User = get_user_model()
    submitters = list(User.objects.filter(username__in=DEMO_SUBMITTERS))
    summary = fleet_summary()
    total = summary["gpus_total"] or 1
    asked = sum(Job.objects.filter(state=JobState.PENDING).values_list("num_gpus", flat=True))
    load = (summary["gpus_used"] + asked) / total

    # 1. Submissions, while the fleet is below the target load.
    if submitters and load < TARGET_LOAD:
        weights = [w for w, _ in WORKLOAD_MIX]
        for _ in range(rng.randint(1, 3)):
            spec = dict(rng.choices(WORKLOAD_MIX, weights)[0][1])
            user = rng.choice(submitters)
            name = f"{spec.pop('name')}-{rng.randint(100, 999)}"
            try:
                job = job_services.submit_job(
                    user,
                    job_services.JobSpec(
                        name=name,
                        tenant=DEMO_SUBMITTERS[user.username],
                        priority=rng.choice([0, 0, 0, 10]),
                        preemptible=rng.random() < 0.8,
                        checkpoint_interval_s=rng.choice([600, 1800, 3600]),
                        expected_duration_s=_duration(rng),
                        **spec,
                    ),
                )
                notes.append(f"submitted #{job.pk}")
            except ServiceError as exc:
                notes.append(f"skipped a submission: {exc}")

    # 2. Now and then a node running a job fails (an XID 79, say).
    if rng.random() < failures_per_minute * tick_seconds / 60:
        busy_nodes = list(
            Allocation.objects.filter(
                released_at__isnull=True,
                job__state__in=HOLDING_JOB_STATES,
                gpu__node__state=NodeState.HEALTHY,
            )
            .values_list("gpu__node_id", flat=True)
            .distinct()
        )
        if busy_nodes:
            node_id = rng.choice(sorted(busy_nodes))
            try:
                node = node_services.mark_node_failed(
                    None, node_id, "XID 79: GPU has fallen off the bus (demo)"
                )
                notes.append(f"node {node.hostname} failed")
            except ServiceError:
                pass

    # 3. Repairs: failed nodes come back after a while.
    for node in Node.objects.filter(
        state=NodeState.FAILED, state_changed_at__lte=timezone.now() - REPAIR_AFTER
    ):
        try:
            node_services.return_node_to_service(None, node.pk, "repaired (demo)")
            notes.append(f"node {node.hostname} repaired")
        except ServiceError:
            pass
    return "; ".join(notes) or "quiet"
