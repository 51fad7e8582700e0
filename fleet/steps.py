"""The typed steps of an action, one dataclass per kind.

An action's steps are stored as dicts (``Action.steps``); ``to_dict`` gives
exactly that stored shape and ``from_dict`` reads it back, so steps written
before these types existed still load. Services build steps only through these
classes. The rules that check a step against the fleet and apply it to the
database live in :mod:`fleet.services.actions.rules`; the cluster side is the adapter's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar


class StepError(ValueError):
    """A stored step that does not parse (unknown op, missing field)."""


@dataclass(frozen=True)
class Step:
    op: ClassVar[str]
    # For people and the console (GET /api/step-kinds/): a short label, and what
    # the step does to the racks' picture (the console's before/after grids):
    # allocate | swap | release | drain | undrain | none.
    label: ClassVar[str] = ""
    effect: ClassVar[str] = "none"
    # The fields a stored step must carry (the others have defaults).
    required: ClassVar[tuple[str, ...]] = ("job",)
    # Every step names either a job or a node.
    job: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"op": self.op}
        data.update({k: v for k, v in asdict(self).items() if v is not None})
        return data

    def describe(self) -> str:
        return f"{self.op} job #{self.job}"

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Step:
        try:
            cls = KINDS[data["op"]]
        except (KeyError, TypeError) as exc:
            raise StepError(
                f"unknown step op {data.get('op') if isinstance(data, dict) else data!r}"
            ) from exc
        return cls._from(data)

    @classmethod
    def _from(cls, data: dict[str, Any]) -> Step:
        """Read each field of ``cls`` by its type (:data:`_READERS`); StepError
        if a required one is missing or any is not of its type."""
        try:
            values = {}
            for f in fields(cls):
                if data.get(f.name) is not None:
                    values[f.name] = _READERS[str(f.type)](data[f.name])
                elif f.name in cls.required:
                    raise KeyError(f.name)
            return cls(**values)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StepError(
                f"a {cls.op} step needs {' and '.join(cls.required)}, and every field of its type: {data!r}"
            ) from exc


# How a field is read from its stored (JSON) form, by its annotation.
_READERS: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "int | None": int,
    "str": str,
    "dict[int, list[int]]": lambda v: {int(k): [int(i) for i in g] for k, g in v.items()},
    "dict[int, int]": lambda v: {int(k): int(n) for k, n in v.items()},
    "dict[str, str]": lambda v: {str(k): str(n) for k, n in v.items()},
    "list[str]": lambda v: [str(x) for x in v],
    "list[str] | None": lambda v: [str(x) for x in v],
    "list[list[str]] | None": lambda v: [list(segment) for segment in v],
    "Sequence[str] | None": list,
}


@dataclass(frozen=True)
class Allocate(Step):
    """Bind a job to GPUs: ``nodes`` maps node id -> GPU indices on it."""

    op: ClassVar[str] = "allocate"
    label: ClassVar[str] = "Allocate"
    effect: ClassVar[str] = "allocate"
    required: ClassVar[tuple[str, ...]] = ("job", "nodes")
    nodes: dict[int, list[int]] = field(default_factory=dict)
    # Node ids as the engine names them (strings), per segment.
    segments: list[list[str]] | None = None
    hostnames: list[str] = field(default_factory=list)
    reason: str = ""
    # The engine's reasons, one per choice. Sequence, not list[str]: its reader
    # keeps the stored items as they are (list[str]'s would str() each).
    choices: Sequence[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["nodes"] = {int(k): list(v) for k, v in self.nodes.items()}
        return data

    def describe(self) -> str:
        return f"allocate job #{self.job} on {', '.join(self.hostnames) or 'its nodes'}"


@dataclass(frozen=True)
class _OnHosts(Step):
    """A step on a job where it is. ``hostnames`` (and ``segments``, node ids
    per segment) are not stored with the plan: the executor fills them from
    the job's allocation rows when it hands the step to the cluster adapter
    (:func:`fleet.services.execution.execute.as_handed`), so an adapter takes
    them from the step and never reads them from rows."""

    hostnames: list[str] | None = None
    segments: list[list[str]] | None = None


@dataclass(frozen=True)
class Start(_OnHosts):
    """The job's processes start on its allocation (placed -> running)."""

    op: ClassVar[str] = "start"
    label: ClassVar[str] = "Start"


@dataclass(frozen=True)
class Restart(_OnHosts):
    """Start again after a swap, from the last checkpoint (recovering -> running)."""

    op: ClassVar[str] = "restart"
    label: ClassVar[str] = "Restart"


@dataclass(frozen=True)
class Checkpoint(Step):
    """Ask the job to save its state before it is moved."""

    op: ClassVar[str] = "checkpoint"
    label: ClassVar[str] = "Checkpoint"


@dataclass(frozen=True)
class Stop(Step):
    """Stop the job's processes and release its GPUs; the action holds it."""

    op: ClassVar[str] = "stop"
    label: ClassVar[str] = "Stop"
    effect: ClassVar[str] = "release"


@dataclass(frozen=True)
class Preempt(Step):
    """Stop a lower-priority job to make room; it goes back to the queue."""

    op: ClassVar[str] = "preempt"
    label: ClassVar[str] = "Preempt"
    effect: ClassVar[str] = "release"


@dataclass(frozen=True)
class Requeue(Step):
    """Stop the job and put it back in the queue."""

    op: ClassVar[str] = "requeue"
    label: ClassVar[str] = "Requeue"
    effect: ClassVar[str] = "release"
    reason: str = ""


@dataclass(frozen=True)
class Swap(Step):
    """Replace a job's failed nodes by spares in the same rack, keeping the rest.
    ``swaps`` maps node id -> node id, ``hostname_swaps`` the same by hostname;
    ``hostnames``, the job's hosts as the step begins, is filled in when the
    step is handed to the cluster adapter (see :class:`_OnHosts`)."""

    op: ClassVar[str] = "swap"
    label: ClassVar[str] = "Swap nodes"
    effect: ClassVar[str] = "swap"
    required: ClassVar[tuple[str, ...]] = ("job", "swaps")
    swaps: dict[int, int] = field(default_factory=dict)
    hostname_swaps: dict[str, str] = field(default_factory=dict)
    hostnames: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["swaps"] = {int(k): int(v) for k, v in self.swaps.items()}
        return data

    def describe(self) -> str:
        pairs = self.hostname_swaps or self.swaps
        return f"swap job #{self.job}: " + ", ".join(f"{a} -> {b}" for a, b in pairs.items())


@dataclass(frozen=True)
class _NodeStep(Step):
    required: ClassVar[tuple[str, ...]] = ("node",)
    node: int = 0
    hostname: str = ""
    reason: str = ""

    def describe(self) -> str:
        return f"{self.op} node {self.hostname or self.node}"


@dataclass(frozen=True)
class Drain(_NodeStep):
    """Stop new work landing on a node; the jobs on it finish where they are."""

    op: ClassVar[str] = "drain"
    label: ClassVar[str] = "Drain node"
    effect: ClassVar[str] = "drain"


@dataclass(frozen=True)
class Undrain(_NodeStep):
    """A drained (or draining) node takes new work again."""

    op: ClassVar[str] = "undrain"
    label: ClassVar[str] = "Undrain node"
    effect: ClassVar[str] = "undrain"


KINDS: dict[str, type[Step]] = {
    cls.op: cls
    for cls in (Allocate, Start, Restart, Checkpoint, Stop, Preempt, Requeue, Swap, Drain, Undrain)
}


def kinds() -> list[dict[str, Any]]:
    """Every step kind, for the API and the console: op, label, description
    (the class docstring), effect on the racks' picture, and its fields."""
    out = []
    for op, cls in KINDS.items():
        out.append(
            {
                "op": op,
                "label": cls.label or op,
                "description": " ".join((cls.__doc__ or "").split()),
                "effect": cls.effect,
                "fields": [
                    f.name for f in fields(cls) if not (f.name == "job" and issubclass(cls, _NodeStep))
                ],
            }
        )
    return out
