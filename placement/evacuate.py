"""Moving long gangs off racks whose NVLink fabric is degraded.

A degraded fabric (NVSwitch trays, IMEX, NVLink errors across the rack's nodes)
fails every multi-node job of the rack at once when it goes. New gangs keep off
such a rack (:func:`placement.queues.degraded_for`); the gangs already there are
asked to move while the fabric still carries them: checkpoint, stop, restart on
healthy racks. A gang due to end soon stays (its move would cost more than the
risk it escapes), as does one with no room elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from placement.model import REQUIRED, Fleet
from placement.place import place
from placement.plans import Move
from placement.recover import DEFAULT_RESTART_MINUTES

# A gang with less than this left runs its course on the degraded rack.
DEFAULT_MIN_REMAINING_S = 3600.0


@dataclass
class Evacuation:
    """What to move off the degraded racks (``moves``, biggest gangs first) and
    why each gang that stays does (``stays``: job id -> reason)."""

    moves: list[Move] = field(default_factory=list)
    stays: dict[str, str] = field(default_factory=dict)


def evacuate(
    fleet: Fleet,
    *,
    now: float | None = None,
    min_remaining_s: float = DEFAULT_MIN_REMAINING_S,
    policy: str = "rackwise",
    restart_minutes: float = DEFAULT_RESTART_MINUTES,
    skip: frozenset[str] = frozenset(),
) -> Evacuation:
    """Plan a move for each multi-node gang holding nodes in a degraded rack
    (``fleet.degraded``) that has at least ``min_remaining_s`` left (unknown
    counts as long), except the jobs in ``skip`` (already in an open plan).

    1. Biggest gangs first: they are the hardest to place and lose the most.
    2. Each is released and placed again, rack-local (``place()`` keeps gangs off
       degraded racks); where it fits, it takes the new nodes before the next gang
       is planned, so no two moves claim the same nodes.
    3. Cost: the restart (the gang is checkpointed before it stops).
    The fleet is left as it was."""
    out = Evacuation()
    if not fleet.degraded:
        return out
    gangs = []
    for jid, alloc in fleet.allocations.items():
        if jid in skip or len(alloc.nodes) < 2:
            continue
        if not any(fleet.nodes[n].rack in fleet.degraded for n in alloc.nodes):
            continue
        left = None if now is None or alloc.expected_end is None else alloc.expected_end - now
        if left is not None and left < min_remaining_s:
            out.stays[jid] = f"ends in {left / 60:.0f} min, before a move would pay"
            continue
        gangs.append(alloc)
    gangs.sort(key=lambda a: (-a.gpus, a.job_id))
    with fleet.trial():
        for alloc in gangs:
            fleet.release(alloc.job_id)
            plan = place(fleet, replace(alloc.job, locality=REQUIRED), policy)
            if not plan.placed:
                fleet.allocate(alloc, restore=True)
                out.stays[alloc.job_id] = f"no room on a healthy rack: {plan.reason}"
                continue
            fleet.allocate(replace(alloc, nodes=dict(plan.nodes), segments=plan.segments))
            out.moves.append(
                Move(
                    job_id=alloc.job_id,
                    from_nodes=list(alloc.nodes),
                    to_nodes=dict(plan.nodes),
                    to_segments=[list(s) for s in plan.segments],
                    # Checkpointed first: only the restart is lost.
                    cost_gpu_hours=alloc.gpus * restart_minutes / 60.0,
                    reason=plan.reason,
                )
            )
    return out
