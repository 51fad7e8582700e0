"""The rules of each step kind, in one table: how a step is checked against the
fleet as it is now (before an approved plan runs, and while a proposal waits),
and what it does to the database once the cluster has done its part.

=========== ===================================================== ==========================
op          check (on a fresh snapshot, replaying earlier steps)  apply (after the cluster)
=========== ===================================================== ==========================
allocate    the job is pending (or stopped by an earlier step)    bind the job to the GPUs
            and the GPUs are free (not held for another plan)
start       the job holds GPUs                                    placed|recovering -> running
restart     the job holds GPUs                                    same, after a swap
checkpoint  --                                                    nothing (the cluster saves)
stop        the job holds GPUs                                    release them; the action holds the job
preempt     the job holds GPUs                                    release them; back to the queue
requeue     the job holds GPUs                                    release them; back to the queue
swap        the job holds GPUs and the spares are free (not held) move it off failed nodes
drain       the node is healthy or suspect                        drain the node
undrain     the node is draining or drained                       undrain the node
=========== ===================================================== ==========================

The cluster side of each step is the adapter's (:mod:`fleet.cluster`); the
node services are told not to mirror a node step's change to the cluster again
(``mirror=False``): the adapter just did it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fleet import engine
from fleet import steps as st
from fleet.choices import HOLDING_JOB_STATES, JobState, NodeState
from fleet.models import Action, Job, Node, NodeHold
from fleet.services.errors import Conflict
from fleet.services.jobs import allocations as job_allocations
from fleet.services.nodes import moves as node_services
from placement import model as pm


@dataclass
class PlanCheck:
    """The state a plan's steps are replayed on: a snapshot of the fleet, the
    jobs they name, and what has been found so far."""

    snap: engine.Snapshot
    jobs: dict[str, Job]
    # The action whose plan this is: the nodes held for it are its own to use.
    action_id: int | None = None
    problems: list[str] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)
    stopped: set[str] = field(default_factory=set)
    # Jobs with a problem already: their later steps are not checked (one
    # reason per job, not the cascade that follows from it).
    failed: set[str] = field(default_factory=set)

    @property
    def fleet(self) -> pm.Fleet:
        return self.snap.fleet

    def held_elsewhere(self, node_ids) -> str | None:
        """Why one of these nodes cannot be used: held for another action."""
        for nid in node_ids:
            owner = self.snap.holder(nid)
            if owner is not None and owner != self.action_id:
                return f"node {self.snap.hostnames.get(str(nid), nid)} is held for action #{owner}"
        return None


# Each rule takes the step kind its op names (an Allocate for "allocate"...), a
# pairing Callable cannot spell: the step is Any here, typed in each rule.
Check = Callable[[PlanCheck, Any], None]
Apply = Callable[[object, Action, Any], None]


def _why(action: Action) -> str:
    return f"action #{action.pk} ({action.kind})"


# --- checks ---------------------------------------------------------------------------


def _check_allocate(ctx: PlanCheck, step: st.Allocate) -> None:
    jid = str(step.job)
    job = ctx.jobs[jid]
    if job.state != JobState.PENDING and jid not in ctx.stopped:
        ctx.problems.append(f"job #{jid} is {job.state}, no longer pending")
        return
    held = ctx.held_elsewhere(step.nodes)
    if held:
        ctx.problems.append(f"job #{jid}: {held}")
        return
    taken = _taken(ctx, step)
    if taken:
        ctx.problems.append(f"job #{jid}: {taken}")
        return
    try:
        ctx.fleet.allocate(
            pm.Allocation(
                engine.job_request(job),
                {str(k): tuple(v) for k, v in step.nodes.items()},
                step.segments or [],
            )
        )
    except pm.CapacityError as exc:
        ctx.problems.append(f"job #{jid}: {exc}")


def _taken(ctx: PlanCheck, step: st.Allocate) -> str | None:
    """Which of the step's GPUs another job holds now, in words."""
    for nid, gpus in step.nodes.items():
        node = ctx.fleet.nodes.get(str(nid))
        if node is None:
            continue
        mask = sum(1 << g for g in gpus if 0 <= g < node.gpus)
        others = sorted(j for j, m in node.jobs.items() if m & mask and j != str(step.job))
        if others:
            who = ", ".join(f"#{j}" for j in others)
            return f"node {ctx.snap.hostnames.get(str(nid), nid)} is taken (job {who} runs there now)"
    return None


def _check_release(ctx: PlanCheck, step: st.Step) -> None:
    jid = str(step.job)
    if jid not in ctx.fleet.allocations:
        ctx.problems.append(f"job #{jid} holds no GPUs any more")
        return
    ctx.fleet.release(jid)
    ctx.stopped.add(jid)


def _check_swap(ctx: PlanCheck, step: st.Swap) -> None:
    jid = str(step.job)
    fleet = ctx.fleet
    if jid not in fleet.allocations or ctx.jobs[jid].state not in HOLDING_JOB_STATES:
        ctx.problems.append(f"job #{jid} holds no GPUs any more")
        return
    old = fleet.release(jid)
    # Steps name nodes by database id; the placement model by id as a string.
    swaps = {str(a): str(b) for a, b in step.swaps.items()}
    nodes: dict[str, tuple[int, ...]] = {}
    for nid, gpus in old.nodes.items():
        new = swaps.get(nid, nid)
        if new != nid:
            target = fleet.nodes.get(new)
            held = ctx.held_elsewhere([new])
            if held:
                ctx.problems.append(f"job #{jid}: replacement {held}")
                return
            if target is None or target.free_gpus < len(gpus):
                ctx.problems.append(
                    f"job #{jid}: replacement node {ctx.snap.hostnames.get(new, new)} is no longer free"
                )
                return
            gpus = target.free_indices(len(gpus))
        nodes[new] = gpus
    segments = [[swaps.get(n, n) for n in seg] for seg in old.segments]
    fleet.allocate(pm.Allocation(old.job, nodes, segments), restore=True)


def _check_start(ctx: PlanCheck, step: st.Step) -> None:
    if str(step.job) not in ctx.fleet.allocations:
        ctx.problems.append(f"job #{step.job} would start without GPUs")


def _check_nothing(ctx: PlanCheck, step: st.Step) -> None:
    return None


def _node_state(node_id: int) -> str | None:
    return Node.objects.filter(pk=node_id).values_list("state", flat=True).first()


def _check_drain(ctx: PlanCheck, step: st.Drain) -> None:
    state = _node_state(step.node)
    if state not in (NodeState.HEALTHY, NodeState.SUSPECT):
        ctx.problems.append(f"node {step.hostname or step.node} is {state}, it can no longer be drained")


def _check_undrain(ctx: PlanCheck, step: st.Undrain) -> None:
    state = _node_state(step.node)
    if state not in (NodeState.DRAINING, NodeState.DRAINED):
        ctx.problems.append(f"node {step.hostname or step.node} is {state}, it can no longer be undrained")


# --- database side ----------------------------------------------------------------------


def refuse_held(action: Action | None, node_ids) -> None:
    """Conflict if one of these nodes is held for a plan other than ``action``:
    whatever planned the step, nothing lands on another plan's nodes."""
    held = NodeHold.objects.filter(node_id__in=[int(n) for n in node_ids]).select_related("node")
    if action is not None:
        held = held.exclude(action_id=action.pk)
    other = held.first()
    if other is not None:
        raise Conflict(f"node {other.node.hostname} is held for action #{other.action_id}")


def _apply_allocate(actor, action: Action, step: st.Allocate) -> None:
    refuse_held(action, step.nodes)
    if not step.reason:
        step = replace(step, reason=_why(action))
    _, refused = job_allocations.place_jobs(actor, [step])
    if refused:
        assert step.job is not None  # an allocate step requires its job (Step.from_dict)
        raise Conflict(refused[step.job])


def _apply_start(actor, action: Action, step: st.Step) -> None:
    # A placement's start is of a placed job. One whose node failed before it
    # started is recovering: its start is refused (the placement fails), and its
    # recovery swaps the node and restarts it; started here, it would run on the
    # failed node (the soak saw one do so for two minutes).
    expect = JobState.RECOVERING if step.op == st.Restart.op else JobState.PLACED
    assert step.job is not None  # a job step requires its job (Step.from_dict)
    job_allocations.start_job(actor, step.job, expect=expect)


def _apply_stop(actor, action: Action, step: st.Stop) -> None:
    assert step.job is not None  # a job step requires its job (Step.from_dict)
    job_allocations.requeue_job(actor, step.job, reason=f"moving: {_why(action)}", action="job.stop")


def _apply_preempt(actor, action: Action, step: st.Preempt) -> None:
    assert step.job is not None  # a job step requires its job (Step.from_dict)
    reason = f"preempted by {_why(action)}"
    # The job the room is for (a reclaim's allocate step), named so its owner knows who took it.
    target = next((s.get("job") for s in action.steps if s.get("op") == st.Allocate.op), None)
    found = Job.objects.filter(pk=target).values_list("name", "tenant__name").first() if target else None
    if found is not None:
        reason += f" to start job #{target} {found[0]} ({found[1]})"
    job_allocations.requeue_job(actor, step.job, reason=reason[:500], action="job.preempt")


def _apply_requeue(actor, action: Action, step: st.Requeue) -> None:
    assert step.job is not None  # a job step requires its job (Step.from_dict)
    job_allocations.requeue_job(actor, step.job, reason=step.reason or f"requeued by {_why(action)}")


def _apply_swap(actor, action: Action, step: st.Swap) -> None:
    refuse_held(action, step.swaps.values())
    assert step.job is not None  # a job step requires its job (Step.from_dict)
    job_allocations.swap_job_nodes(actor, step.job, dict(step.swaps), reason=f"recovering: {_why(action)}")


def _apply_nothing(actor, action: Action, step: st.Step) -> None:
    return None


def _apply_drain(actor, action: Action, step: st.Drain) -> None:
    node_services.drain_node(actor, step.node, step.reason or _why(action), mirror=False)


def _apply_undrain(actor, action: Action, step: st.Undrain) -> None:
    node_services.undrain_node(actor, step.node, step.reason or _why(action), mirror=False)


RULES: dict[str, tuple[Check, Apply]] = {
    st.Allocate.op: (_check_allocate, _apply_allocate),
    st.Start.op: (_check_start, _apply_start),
    st.Restart.op: (_check_start, _apply_start),
    st.Checkpoint.op: (_check_nothing, _apply_nothing),
    st.Stop.op: (_check_release, _apply_stop),
    st.Preempt.op: (_check_release, _apply_preempt),
    st.Requeue.op: (_check_release, _apply_requeue),
    st.Swap.op: (_check_swap, _apply_swap),
    st.Drain.op: (_check_drain, _apply_drain),
    st.Undrain.op: (_check_undrain, _apply_undrain),
}
assert set(RULES) == set(st.KINDS), "every step kind needs its rules"


def check(ctx: PlanCheck, step: st.Step) -> None:
    """Check one step against the replayed fleet (problems go to ``ctx``)."""
    if step.job is not None:
        jid = str(step.job)
        if jid in ctx.failed:
            return
        if jid not in ctx.jobs:
            ctx.problems.append(f"job #{jid} no longer exists")
            ctx.failed.add(jid)
            return
        ctx.touched.add(jid)
    before = len(ctx.problems)
    RULES[step.op][0](ctx, step)
    if step.job is not None and len(ctx.problems) > before:
        ctx.failed.add(str(step.job))


def apply(actor, action: Action, step: st.Step) -> None:
    """The database side of one step, inside the caller's transaction."""
    RULES[step.op][1](actor, action, step)
