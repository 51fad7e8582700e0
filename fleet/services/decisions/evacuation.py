"""Proposals to move long jobs off hardware about to fail (issue #31): gangs off
racks whose NVLink fabric is degraded, and jobs off nodes a health rule drains.
The engine plans (:mod:`placement.evacuate`); each move is a proposal of its
own, so an operator can approve one job's move and not another's; the approval
policy of ``evacuation`` is manual by default."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from fleet import engine
from fleet.choices import ActionKind, ActionState, GpuHealth, NodeState
from fleet.models import Action, Job, Node, Rack
from fleet.services.actions import propose as action_services
from placement.evacuate import evacuate


def flagged_nodes() -> dict[int, str]:
    """Nodes a health rule drains, expected to fail: draining with a GPU the rule
    marked degraded (an operator's drain for maintenance marks no GPU). Node id
    -> hostname."""
    return dict(
        Node.objects.filter(state=NodeState.DRAINING, gpus__health=GpuHealth.DEGRADED)
        .distinct()
        .values_list("pk", "hostname")
    )


def propose_evacuations(actor=None) -> list[Action]:
    """Propose a move for every long job at risk that no open action holds yet;
    expire the proposals whose risk has gone. Returns the new proposals."""
    flagged = flagged_nodes()
    _expire_moot(actor, flagged)
    busy = {str(j) for j in action_services.open_action_job_ids()}
    with engine.live_snapshot() as snap:
        fleet = snap.fleet
        plan = evacuate(
            fleet,
            flagged=frozenset(str(n) for n in flagged),
            now=timezone.now().timestamp(),
            min_remaining_s=settings.RACKWISE_EVACUATE_MIN_REMAINING_S,
            policy=engine.policy(),
            skip=frozenset(busy),
        )
        names = dict(Job.objects.filter(pk__in=[int(m.job_id) for m in plan.moves]).values_list("pk", "name"))
        proposals = []
        for move in plan.moves:
            job_id = int(move.job_id)
            left = sorted(set(move.from_nodes) - set(move.to_nodes))
            bad_racks = sorted(
                {snap.rack_names[fleet.nodes[n].rack] for n in left if fleet.nodes[n].rack in fleet.degraded}
            )
            if bad_racks:
                risk = {"racks": bad_racks}
                why = f"{', '.join(bad_racks)} (NVLink fabric degraded)"
            else:
                risk = {"nodes": [snap.hostnames[n] for n in left if int(n) in flagged]}
                why = f"{', '.join(risk['nodes'])} (drained by a health rule)"
            dst = sorted({snap.rack_names[fleet.nodes[n].rack] for n in move.to_nodes})
            proposals.append(
                action_services.Proposal(
                    kind=ActionKind.EVACUATION,
                    title=f"move job #{job_id} {names[job_id]} off {why} to {', '.join(dst)}",
                    steps=snap.move_steps(move),
                    jobs=[job_id],
                    engine_plan={"moves": [move.to_dict()]},
                    cost_gpu_hours=move.cost_gpu_hours,
                    benefit={"reason": f"off {why}", **risk},
                )
            )
    return action_services.propose_many(proposals, actor=actor) if proposals else []


def _expire_moot(actor, flagged: dict[int, str]) -> None:
    """A proposal whose rack is healthy again, or whose node is no longer
    flagged (returned to service, failed meanwhile: recovery's), is moot."""
    healthy = set(Rack.objects.filter(fabric_degraded="").values_list("name", flat=True))
    still = set(flagged.values())
    for action in Action.objects.filter(kind=ActionKind.EVACUATION, state=ActionState.PROPOSED):
        risk = action.benefit or {}
        racks, nodes = set(risk.get("racks", [])), set(risk.get("nodes", []))
        if racks and racks <= healthy:
            why = f"the NVLink fabric of {', '.join(sorted(racks))} is healthy again"
        elif nodes and not nodes & still:
            why = f"{', '.join(sorted(nodes))} no longer drained by a health rule"
        else:
            continue
        action_services.expire(actor, action.pk, [why], replan=False)
