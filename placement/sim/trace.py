"""Job traces: the CSV format read by the simulator and written by tracegen."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from placement.model import LOCALITIES, PREFERRED, JobRequest

REQUIRED_COLUMNS = ("job_id", "submit_time", "duration", "num_gpus")
OPTIONAL_COLUMNS = (
    "num_nodes",
    "gpus_per_node",
    "segment_nodes",
    "locality",
    "priority",
    "preemptible",
    "tenant",
)
COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS


class TraceError(ValueError):
    """A bad trace: ``line`` is the 1-based line in the file (the header is line 1)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True)
class TraceJob:
    job: JobRequest
    submit: float
    duration: float
    line: int
    # False when the row had no locality (the job then carries PREFERRED; the
    # simulator's ``SimConfig.locality`` / ``--locality`` may set it instead).
    locality_given: bool = True


def _num(
    row: dict[str, str], col: str, line: int, *, integer: bool, minimum: float, default: float | None = None
) -> float:
    raw = (row.get(col) or "").strip()
    if raw == "":
        if default is None:
            raise TraceError(line, f"{col} is empty")
        return default
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(line, f"{col} is not a number: {raw!r}") from None
    if not math.isfinite(value):
        raise TraceError(line, f"{col} is not finite: {raw!r}")
    if integer and value != int(value):
        raise TraceError(line, f"{col} must be a whole number: {raw!r}")
    if value < minimum:
        raise TraceError(line, f"{col} must be at least {minimum:g}: {raw!r}")
    return value


def parse_row(
    row: dict[str, str], line: int, *, gpus_per_node: int, checkpoint_minutes: float = 60.0
) -> TraceJob:
    """One CSV row to a TraceJob; raises TraceError naming the line and the problem."""
    jid = (row.get("job_id") or "").strip()
    if not jid:
        raise TraceError(line, "job_id is empty")
    submit = _num(row, "submit_time", line, integer=False, minimum=0)
    duration = _num(row, "duration", line, integer=False, minimum=0)
    if duration <= 0:
        raise TraceError(line, f"duration must be positive: {row.get('duration')!r}")
    num_gpus = int(_num(row, "num_gpus", line, integer=True, minimum=1))
    num_nodes_f = _num(row, "num_nodes", line, integer=True, minimum=1, default=0)
    gpn = int(_num(row, "gpus_per_node", line, integer=True, minimum=1, default=gpus_per_node))
    seg = int(_num(row, "segment_nodes", line, integer=True, minimum=1, default=0))
    given = (row.get("locality") or "").strip().lower()
    locality = given or PREFERRED
    if locality not in LOCALITIES:
        raise TraceError(line, f"locality must be one of {', '.join(LOCALITIES)}: {row.get('locality')!r}")
    priority = int(_num(row, "priority", line, integer=True, minimum=-(10**9), default=0))
    pre_raw = (row.get("preemptible") or "").strip()
    if pre_raw not in ("", "0", "1"):
        raise TraceError(line, f"preemptible must be 0 or 1: {pre_raw!r}")
    num_nodes = int(num_nodes_f) or None
    if num_nodes is not None and num_nodes * gpn != num_gpus:
        raise TraceError(line, f"num_gpus {num_gpus} != num_nodes {num_nodes} x gpus_per_node {gpn}")
    job = JobRequest(
        id=jid,
        num_gpus=num_gpus,
        num_nodes=num_nodes,
        gpus_per_node=gpn if num_nodes else None,
        segment_nodes=seg or None,
        locality=locality,
        priority=priority,
        preemptible=pre_raw != "0",
        checkpoint_minutes=checkpoint_minutes,
        submit_time=submit,
        expected_duration=duration,
        tenant=(row.get("tenant") or "").strip(),
    )
    return TraceJob(job, submit, duration, line, locality_given=bool(given))


def read_trace(
    path: str | Path, *, gpus_per_node: int = 4, checkpoint_minutes: float = 60.0
) -> list[TraceJob]:
    """Read and check a whole trace; rows come back sorted by submit time."""
    out: list[TraceJob] = []
    seen: dict[str, int] = {}
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise TraceError(1, "the file is empty (a header row is needed)")
        header = [h.strip() for h in reader.fieldnames]
        reader.fieldnames = header
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise TraceError(1, f"missing column(s): {', '.join(missing)}")
        for row in reader:
            line = reader.line_num
            if None in row:
                raise TraceError(line, "more cells than header columns")
            tj = parse_row(row, line, gpus_per_node=gpus_per_node, checkpoint_minutes=checkpoint_minutes)
            if tj.job.id in seen:
                raise TraceError(line, f"job_id {tj.job.id!r} repeats line {seen[tj.job.id]}")
            seen[tj.job.id] = line
            out.append(tj)
    out.sort(key=lambda t: (t.submit, t.line))
    return out


def write_trace(path: str | Path, rows: Iterable[dict[str, object]]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
