"""Placement policies: the four baselines and rackwise, one module each."""

from __future__ import annotations

from collections.abc import Callable

from placement.model import Fleet, JobRequest, Rack
from placement.plans import PlacementPlan
from placement.policies.baselines import first_fit, random_fit
from placement.policies.common import Context
from placement.policies.kueue_tas import kueue_tas
from placement.policies.rackwise import rackwise
from placement.policies.slurm_block import slurm_block

PolicyFn = Callable[[Fleet, JobRequest, list[Rack], Context], PlacementPlan]

POLICIES: dict[str, PolicyFn] = {
    "rackwise": rackwise,
    "first-fit": first_fit,
    "random": random_fit,
    "slurm-block": slurm_block,
    # The same block placement; the simulator gives it today's greedy queue (any job
    # that fits starts) instead of sched/backfill.
    "slurm-block-greedy": slurm_block,
    "kueue-tas": kueue_tas,
}

__all__ = ["POLICIES", "Context", "PolicyFn"]
