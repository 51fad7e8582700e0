"""Moving long jobs off hardware about to fail, while it still runs them.

- A rack whose NVLink fabric is degraded (NVSwitch trays, IMEX, NVLink errors
  across its nodes) fails every multi-node gang of the rack at once when it goes.
  New gangs keep off it (:func:`placement.queues.degraded_for`); the gangs already
  there are moved whole to healthy racks.
- A node flagged by a health signal (a rule's drain verdict: a pending row remap,
  errors rising) takes no new work and is expected to fail; a job on it has the
  flagged node swapped for an idle one of the same rack, or moves whole
  (:func:`placement.recover.recover` without preemption: a precaution stops no
  other job for a failure that may not come). This is the simulator's
  drain-before-failure (``placement/sim/precursors.py``) for the live fleet.

Each move is checkpoint, stop, restart on the new nodes. A job due to end soon
stays (a move would cost more than the risk it escapes), as does one with no
room elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from placement.model import HEALTHY, Allocation, Fleet
from placement.plans import Move
from placement.queues import degraded_for
from placement.recover import DEFAULT_RESTART_MINUTES, apply_recovery, recover, whole_move

# A job with less than this left runs its course where it is.
DEFAULT_MIN_REMAINING_S = 3600.0


@dataclass
class Evacuation:
    """What to move (``moves``, biggest jobs first) and why each job at risk
    stays (``stays``: job id -> reason)."""

    moves: list[Move] = field(default_factory=list)
    stays: dict[str, str] = field(default_factory=dict)


def evacuate(
    fleet: Fleet,
    *,
    flagged: frozenset[str] = frozenset(),
    now: float | None = None,
    min_remaining_s: float = DEFAULT_MIN_REMAINING_S,
    policy: str = "rackwise",
    restart_minutes: float = DEFAULT_RESTART_MINUTES,
    skip: frozenset[str] = frozenset(),
) -> Evacuation:
    """Plan a move for each job at risk with at least ``min_remaining_s`` left
    (unknown counts as long), except the jobs in ``skip`` (in an open plan
    already): multi-node gangs holding nodes in a degraded rack
    (``fleet.degraded``), and jobs holding a node in ``flagged``.

    1. Biggest jobs first: they are the hardest to place and lose the most.
    2. A gang on a degraded rack is released and placed again, rack-local
       (``place()`` keeps gangs off degraded racks). A job on flagged nodes is
       recovered from them without preemption: a swap in the same rack, else a
       whole move.
    3. Where it fits, it takes its new nodes before the next job is planned, so
       no two moves claim the same nodes.
    4. Cost: the restart (the job is checkpointed before it stops).
    The fleet is left as it was."""
    out = Evacuation()
    if not fleet.degraded and not flagged:
        return out
    at_risk: list[tuple[Allocation, list[str]]] = []
    for jid, alloc in fleet.allocations.items():
        if jid in skip:
            continue
        bad = degraded_for(fleet, alloc.job)  # none for one-node work
        on_bad_rack = any(fleet.nodes[n].rack in bad for n in alloc.nodes)
        hit = [n for n in alloc.nodes if n in flagged]
        if not on_bad_rack and not hit:
            continue
        left = None if now is None or alloc.expected_end is None else alloc.expected_end - now
        if left is not None and left < min_remaining_s:
            out.stays[jid] = f"ends in {left / 60:.0f} min, before a move would pay"
            continue
        at_risk.append((alloc, [] if on_bad_rack else hit))
    at_risk.sort(key=lambda a: (-a[0].gpus, a[0].job_id))
    with fleet.trial():
        for alloc, hit in at_risk:
            moved = _off_flagged(fleet, alloc, hit, policy) if hit else _off_rack(fleet, alloc, policy)
            if isinstance(moved, str):
                out.stays[alloc.job_id] = moved
                continue
            new, reason = moved
            out.moves.append(
                Move(
                    job_id=alloc.job_id,
                    from_nodes=list(alloc.nodes),
                    to_nodes=dict(new.nodes),
                    to_segments=[list(s) for s in new.segments],
                    cost_gpu_hours=alloc.gpus * restart_minutes / 60.0,
                    reason=reason,
                )
            )
    return out


def _off_rack(fleet: Fleet, alloc: Allocation, policy: str) -> tuple[Allocation, str] | str:
    plan = whole_move(fleet, alloc, policy)
    if not plan.placed:
        return f"no room on a healthy rack: {plan.reason}"
    new = replace(alloc, nodes=dict(plan.nodes), segments=plan.segments)
    fleet.release(alloc.job_id)
    fleet.allocate(new)
    return new, plan.reason


def _off_flagged(
    fleet: Fleet, alloc: Allocation, hit: list[str], policy: str
) -> tuple[Allocation, str] | str:
    # A restart is a new allocation: it leaves every node that takes no new work
    # (an operator's drain too), not only the flagged ones.
    hit = [n for n in alloc.nodes if n in hit or fleet.nodes[n].health != HEALTHY]
    plan = recover(fleet, alloc.job_id, hit, policy=policy, preempt=False)
    if plan.action not in ("swap", "move"):
        return f"no idle node to take over: {plan.steps[-1] if plan.steps else plan.reason}"
    new = apply_recovery(fleet, plan)
    assert new is not None  # a swap or a move
    return new, plan.reason
