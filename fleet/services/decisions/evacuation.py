"""Proposals to move long gangs off racks whose NVLink fabric is degraded
(issue #31, the rack as a failure domain). The engine plans
(:mod:`placement.evacuate`); each move is a proposal of its own, so an operator
can approve one gang's move and not another's; the approval policy of
``evacuation`` is manual by default."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from fleet import engine
from fleet.choices import ActionKind, ActionState
from fleet.models import Action, Job, Rack
from fleet.services.actions import propose as action_services
from fleet.steps import Checkpoint, Start, Stop
from placement.evacuate import evacuate


def propose_evacuations(actor=None) -> list[Action]:
    """Propose a move for every long gang on a degraded rack that no open action
    holds yet; expire the proposals whose rack is healthy again. Returns the new
    proposals."""
    _expire_healed(actor)
    busy = {str(j) for j in action_services.open_action_job_ids()}
    with engine.live_snapshot() as snap:
        if not snap.fleet.degraded:
            return []
        plan = evacuate(
            snap.fleet,
            now=timezone.now().timestamp(),
            min_remaining_s=settings.RACKWISE_EVACUATE_MIN_REMAINING_S,
            policy=engine.policy(),
            skip=frozenset(busy),
        )
        names = dict(Job.objects.filter(pk__in=[int(m.job_id) for m in plan.moves]).values_list("pk", "name"))
        proposals = []
        for move in plan.moves:
            job_id = int(move.job_id)
            fleet = snap.fleet
            src = sorted({snap.rack_names[fleet.nodes[n].rack] for n in move.from_nodes})
            dst = sorted({snap.rack_names[fleet.nodes[n].rack] for n in move.to_nodes})
            proposals.append(
                action_services.Proposal(
                    kind=ActionKind.EVACUATION,
                    title=(
                        f"move job #{job_id} {names[job_id]} off {', '.join(src)} "
                        f"(NVLink fabric degraded) to {', '.join(dst)}"
                    ),
                    steps=[
                        Checkpoint(job=job_id),
                        Stop(job=job_id),
                        snap.allocate_step(job_id, move.to_nodes, move.to_segments, move.reason),
                        Start(job=job_id),
                    ],
                    jobs=[job_id],
                    engine_plan={"moves": [move.to_dict()]},
                    cost_gpu_hours=move.cost_gpu_hours,
                    benefit={"reason": f"off the degraded fabric of {', '.join(src)}", "racks": src},
                )
            )
    return action_services.propose_many(proposals, actor=actor) if proposals else []


def _expire_healed(actor) -> None:
    """A proposal made for a rack whose fabric is healthy again is moot."""
    healthy = set(Rack.objects.filter(fabric_degraded="").values_list("name", flat=True))
    for action in Action.objects.filter(kind=ActionKind.EVACUATION, state=ActionState.PROPOSED):
        racks = set((action.benefit or {}).get("racks", []))
        if racks and racks <= healthy:
            action_services.expire(
                actor,
                action.pk,
                [f"the NVLink fabric of {', '.join(sorted(racks))} is healthy again"],
                replan=False,
            )
