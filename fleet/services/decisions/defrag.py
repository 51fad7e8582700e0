"""Fragmentation figures and defragmentation plans for the live fleet."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from fleet import engine
from fleet.choices import ActionKind, ActionState, JobState, Locality
from fleet.models import Action, Job, Rack
from fleet.services import audit
from fleet.services.actions import lifecycle
from fleet.services.actions import propose as action_services
from fleet.services.errors import InvalidInput
from fleet.steps import Step
from placement.defrag import FreeRacks, RoomFor, Target, defragment
from placement.fragmentation import FragmentationReport, fragmentation


def _typical_shapes(pending: list) -> list:
    """The jobs the typical multi-node job is taken from (placement.fragmentation:
    their median by GPU demand): every pending job and the latest 2,000 others
    submitted in the last day. One list, not the queue else the history, so the
    figure does not jump when the queue empties or a gang arrives."""
    recent = (
        Job.objects.select_related("tenant")
        .filter(submitted_at__gte=timezone.now() - timedelta(days=1))
        .exclude(state=JobState.PENDING)
        .order_by("-submitted_at")
    )
    return pending + [engine.job_request(j) for j in recent[:2000]]


def fragmentation_report() -> FragmentationReport:
    """The fleet's fragmentation figure, per rack and fleet-wide, for the typical
    multi-node job of the pending and recent jobs (the definition and its steps:
    placement.fragmentation, docs/fragmentation.md). Every figure the console,
    the API and /metrics show is this report, through fleet.services.read.read_models."""
    pending = [
        engine.job_request(j) for j in Job.objects.select_related("tenant").filter(state=JobState.PENDING)
    ]
    shapes = _typical_shapes(pending)
    with engine.live_snapshot() as snap:
        report = fragmentation(snap.fleet, shapes)
        for rack in report.racks:
            rack.name = snap.rack_names.get(rack.rack, rack.rack)
    return report


@dataclass(frozen=True)
class DefragGoal:
    """What a defrag plan is asked for (all optional; none: room for the
    pending gangs): whole free racks, or room for a number of nodes (of a
    node size), within a GPU-hour budget and a number of moves. The API's
    request, the task's arguments and a plan's stored ``request`` are this."""

    free_racks: int | None = None
    room_for_nodes: int | None = None
    gpus_per_node: int | None = None
    budget_gpu_hours: float | None = None
    max_moves: int | None = None

    @classmethod
    def from_dict(cls, data: dict) -> DefragGoal:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})

    def as_dict(self) -> dict:
        return asdict(self)

    def check(self) -> None:
        """Refuse (InvalidInput, saying what fits) a goal the fleet cannot
        mean: more whole racks than exist, room for more nodes than racks of
        that node size hold, a node size no rack has, a budget that is not a
        sane number.

        Checked before anything is written (an open plan is not expired for a
        bad request) and before the planner runs: its goals are sized by these
        numbers, and ``free_racks`` of 2^56 once grew the web process to 22 GB."""
        if self.free_racks is not None and self.room_for_nodes is not None:
            raise InvalidInput("give either free_racks or room_for_nodes, not both")
        errors: dict[str, list[str]] = {}
        for name in ("free_racks", "room_for_nodes", "max_moves"):
            value = getattr(self, name)
            if value is not None and value < 1:
                errors[name] = [f"must be at least 1, got {value}"]
        if self.max_moves is not None and self.max_moves > settings.RACKWISE_DEFRAG_MAX_MOVES_LIMIT:
            errors["max_moves"] = [
                f"at most {settings.RACKWISE_DEFRAG_MAX_MOVES_LIMIT} moves per plan, got {self.max_moves}"
            ]
        if self.budget_gpu_hours is not None and not (
            0 < self.budget_gpu_hours <= settings.RACKWISE_DEFRAG_MAX_BUDGET_GPU_HOURS
        ):
            errors["budget_gpu_hours"] = [
                f"must be above 0 and at most {settings.RACKWISE_DEFRAG_MAX_BUDGET_GPU_HOURS:g}, "
                f"got {self.budget_gpu_hours}"
            ]
        if self.gpus_per_node is not None and self.room_for_nodes is None:
            errors["gpus_per_node"] = ["goes with room_for_nodes (the node size of the room to make)"]
        if errors:
            raise InvalidInput(errors)
        if self.free_racks is not None:
            racks = Rack.objects.count()
            if self.free_racks > racks:
                raise InvalidInput(
                    {"free_racks": [f"the fleet has {racks} rack(s); ask for at most {racks}"]}
                )
        if self.room_for_nodes is not None:
            nodes_by_size = dict(
                Rack.objects.values("gpus_per_node")
                .annotate(n=Count("nodes"))
                .filter(n__gt=0)
                .values_list("gpus_per_node", "n")
            )
            if self.gpus_per_node is not None and self.gpus_per_node not in nodes_by_size:
                sizes = ", ".join(str(g) for g in sorted(nodes_by_size)) or "none"
                raise InvalidInput(
                    {
                        "gpus_per_node": [
                            f"no rack has {self.gpus_per_node}-GPU nodes; the fleet's node sizes: {sizes}"
                        ]
                    }
                )
            size = self.gpus_per_node if self.gpus_per_node is not None else max(nodes_by_size, default=0)
            fits = nodes_by_size.get(size, 0)
            if self.room_for_nodes > fits:
                raise InvalidInput(
                    {
                        "room_for_nodes": [
                            f"the fleet has {fits} node(s) of {size} GPUs; ask for at most {fits}"
                        ]
                    }
                )


@dataclass
class DefragOutcome:
    action: Action | None
    reason: str
    plan: dict


def plan_defrag(actor=None, goal: DefragGoal | None = None) -> DefragOutcome:
    """Plan the cheapest moves of preemptible jobs that make the target (or the
    pending gangs) placeable, and propose them as one action.

    An open plan that still holds is kept (one defrag plan at a time); one the
    fleet has moved away from is made again with its own request
    (:func:`replan`). An operator's explicit request replaces a proposed or
    approved plan."""
    goal = goal or DefragGoal()
    goal.check()

    with transaction.atomic():
        for open_plan in Action.objects.select_for_update().filter(
            kind=ActionKind.DEFRAG,
            state__in=(ActionState.PROPOSED, ActionState.APPROVED, ActionState.EXECUTING),
        ):
            if open_plan.state == ActionState.EXECUTING:
                return DefragOutcome(open_plan, f"defrag #{open_plan.pk} is executing", open_plan.plan)
            problems = action_services.check_plan(open_plan)
            if actor is None:
                if not problems:
                    return DefragOutcome(
                        open_plan, f"defrag #{open_plan.pk} still holds and awaits a decision", open_plan.plan
                    )
                successor = replan(None, open_plan, problems)
                if successor is not None:
                    return DefragOutcome(
                        successor, f"defrag #{open_plan.pk} re-planned as #{successor.pk}", successor.plan
                    )
                continue  # expired, saying why: plan afresh below
            # Expired like any other end (event, webhook, jobs settled); no new
            # plan is asked for, since this call makes it.
            action_services.expire(
                actor,
                open_plan.pk,
                problems or [f"superseded by a new plan requested by {audit.actor_name(actor)}"],
                replan=False,
            )

    proposal, reason, plan_dict = _make_plan(goal)
    if proposal is None:
        return DefragOutcome(None, reason, plan_dict)
    action = action_services.propose_many([proposal], actor=actor)[0]
    return DefragOutcome(action, reason, plan_dict)


def _make_plan(
    goal: DefragGoal, *, mine: int | None = None
) -> tuple[action_services.Proposal | None, str, dict]:
    """Plan for ``goal`` on the fleet as
    it is now, the nodes held for action ``mine`` seen as free (it is being
    re-planned: they are its to give up). Returns the proposal (None: nothing to
    move), the planner's reason and its plan as a dict."""
    pending = [
        engine.job_request(j) for j in Job.objects.select_related("tenant").filter(state=JobState.PENDING)
    ]
    shapes = _typical_shapes(pending)
    # The in-memory fleet brought up to date (a full load is 0.7 s at 1,000 racks);
    # the planner tries its moves in a trial, which leaves it as it was.
    with engine.live_snapshot() as snap, snap.fleet.trial():
        if mine is not None:
            snap.unhold(mine)
        target: Target | None = None
        if goal.free_racks is not None:
            target = FreeRacks(goal.free_racks)
        elif goal.room_for_nodes is not None:
            target = RoomFor(goal.room_for_nodes, goal.gpus_per_node or max(snap.fleet.shapes(), default=4))
        plan = defragment(
            snap.fleet,
            pending,
            target,
            budget_gpu_hours=(
                goal.budget_gpu_hours
                if goal.budget_gpu_hours is not None
                else settings.RACKWISE_DEFRAG_BUDGET_GPU_HOURS
            ),
            max_moves=goal.max_moves or settings.RACKWISE_DEFRAG_MAX_MOVES,
            shapes=shapes,
        )
        steps: list[Step] = [step for move in plan.moves for step in snap.move_steps(move)]
        touched_racks = sorted(
            {
                snap.rack_names[snap.fleet.nodes[n].rack]
                for m in plan.moves
                for n in [*m.from_nodes, *m.to_nodes]
            }
        )
    plan_dict = plan.to_dict()
    if not plan.moves:
        return None, plan.reason or "nothing to move", plan_dict
    benefit = {
        "target": plan.target,
        "feasible": plan.feasible,
        "jobs_made_placeable": [int(j) for j in plan.jobs_made_placeable],
        "fragmentation_before": plan.fragmentation_before,
        "fragmentation_after": plan.fragmentation_after,
        "free_racks_before": plan.free_racks_before,
        "free_racks_after": plan.free_racks_after,
        "racks": touched_racks,
        "reason": plan.reason,
    }
    title = (
        f"defragment: {len(plan.moves)} move(s) for {plan.target}, "
        f"{plan.cost_gpu_hours:.1f} GPU-h, "
        f"whole free racks {plan.free_racks_before} -> {plan.free_racks_after}"
    )
    proposal = action_services.Proposal(
        kind=ActionKind.DEFRAG,
        title=title,
        steps=steps,
        jobs=[int(m.job_id) for m in plan.moves],
        engine_plan=plan_dict,
        cost_gpu_hours=plan.cost_gpu_hours,
        benefit=benefit,
        request=goal.as_dict(),
    )
    return proposal, plan.reason, plan_dict


def replan(actor, action: Action, problems: list[str], *, keep_approval: bool = False) -> Action | None:
    """Make a new plan in place of ``action``, a defrag plan the fleet has moved
    away from (``problems``: why), with the same request (target, budget, move
    limit). The caller holds the decision lock.

    1. Plan again on the fleet as it is now, the nodes held for ``action`` seen
       as free (they are its to give up).
    2. In one transaction: the new plan is proposed, replacing ``action``
       (``Action.replaces``); ``action`` expires, saying why and by which plan
       (its holds released; no new decision asked for: this is it).
    3. With ``keep_approval`` (an approved plan re-checked before its first
       step), the new plan is approved in the same operator's name when it costs
       no more than the approved one and meets the target if that one did (it
       then holds its nodes and runs at once); else it waits for the operator to
       confirm its cost, as after a stale approval.
    Returns the new plan, or None: nothing to move any more, and ``action``
    expired saying why."""
    why = "; ".join(problems) or "superseded"
    goal = DefragGoal.from_dict(action.plan.get("request") or {})
    proposal, reason, _ = _make_plan(goal, mine=action.pk)
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(pk=action.pk)
        if locked.state not in (ActionState.PROPOSED, ActionState.APPROVED, ActionState.EXECUTING) or (
            locked.state == ActionState.EXECUTING and locked.step_index > 0
        ):
            return None  # decided or started meanwhile: not ours to replace
        if proposal is None:
            action_services.expire(actor, locked.pk, [f"{why}; no new plan: {reason}"], replan=False)
            return None
        proposal.replaces = locked.pk
        successor = action_services.propose_many([proposal], actor=actor)[0]
        action_services.expire(
            actor,
            locked.pk,
            [
                f"{why}; re-planned as #{successor.pk} "
                f"({locked.cost_gpu_hours:.1f} -> {successor.cost_gpu_hours:.1f} GPU-h)"
            ],
            replan=False,
        )
        meets = successor.benefit.get("feasible") or not locked.benefit.get("feasible")
        if (
            keep_approval
            and locked.decided_at is not None
            and meets
            and (successor.cost_gpu_hours <= locked.cost_gpu_hours + 1e-9)
        ):
            approved = lifecycle.transition(
                actor,
                successor.pk,
                ActionState.APPROVED,
                message=f"approval of #{locked.pk} carried over: the new plan costs no more",
                fields={
                    "decided_by": locked.decided_by,
                    "decided_by_name": f"{locked.decided_by_name} (approved #{locked.pk})"[:150],
                    "decided_at": timezone.now(),
                    "decision_note": locked.decision_note,
                },
                expect=(ActionState.PROPOSED,),
            )
            assert approved is not None  # not quiet: a refused move raises
            successor = approved
    return successor


# Approvals and the re-check before the first step re-plan a stale defrag plan
# through this (fleet.services.actions never imports its planners).
action_services.REPLANNERS[ActionKind.DEFRAG] = replan


def defrag_due() -> str | None:
    """Why a defrag plan should be made now, or None: fragmentation above the
    threshold while gangs wait, or a required job waiting too long."""
    cutoff = timezone.now() - timedelta(seconds=settings.RACKWISE_DEFRAG_WAIT_THRESHOLD_S)
    waiting = Job.objects.filter(state=JobState.PENDING, locality=Locality.REQUIRED, submitted_at__lte=cutoff)
    if waiting.exists():
        return (
            f"{waiting.count()} required job(s) waited longer than "
            f"{settings.RACKWISE_DEFRAG_WAIT_THRESHOLD_S} s"
        )
    if Job.objects.filter(state=JobState.PENDING, num_nodes__isnull=False).exists():
        fraction = fragmentation_report().fraction
        if fraction > settings.RACKWISE_DEFRAG_FRAGMENTATION_THRESHOLD:
            return (
                f"fragmentation {fraction:.2f} is above "
                f"{settings.RACKWISE_DEFRAG_FRAGMENTATION_THRESHOLD:.2f}"
            )
    return None
