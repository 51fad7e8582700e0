"""A job's log, for ``GET /api/jobs/<id>/logs/`` and the job page: read from
the cluster adapter (``ClusterAdapter.read_log``: Slurm's output file, the
simulated cluster's own lines), bounded, cut into whole lines and redacted
(``fleet.redact.log_line``). Who may read it is the job's business: the caller
passes a job the user may see (``fleet.permissions.visible_jobs``).

The polling contract, for ``rackwise logs -f`` and the page:

1. Offsets are bytes of the log as the cluster writes it (before redaction).
   ``offset=N`` reads from byte N, at most ``RACKWISE_JOB_LOG_MAX_BYTES``;
   ``tail=N`` reads the last N lines (within that many bytes; ``truncated``:
   earlier lines were left out). The answer's ``offset`` is where its first
   line starts, ``next_offset`` where the next read starts, ``size`` how long
   the log is now.
2. Only whole lines are given while the job runs: a line still being written
   is left for the next read (unless one line alone is over the byte limit,
   then it comes in pieces). Once the job has finished, its last line comes
   without its newline too.
3. ``finished``: the job has ended and its log will not grow. ``eof``: also
   ``next_offset`` has reached the end, so a follower stops. Otherwise it asks
   again with ``offset=next_offset``: at once when ``more`` (bytes past
   ``next_offset`` are already written), else after ``poll_after_s``.
4. An offset past the end of the log (a log that started again, or a wrong
   offset) reads from 0, with ``restarted``.
5. No log to read (the job never ran, a cluster that keeps none, the cluster
   not answering) is not an error: ``available`` is false and ``reason`` says
   why; ``eof`` only if the job has finished, since a job that has not started
   yet will have a log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

from fleet import redact
from fleet.choices import FINISHED_JOB_STATES
from fleet.cluster.base import ClusterAdapter, ClusterUnavailable, LogChunk, StepFailed
from fleet.cluster.registry import get_adapter
from fleet.models import Job

MAX_TAIL_LINES = 10_000
# The largest offset the API takes (1 TiB): bounds the number, not any read.
MAX_OFFSET = 2**40


@dataclass
class JobLog:
    job: int
    state: str
    source: str
    available: bool
    reason: str = ""
    offset: int = 0
    next_offset: int = 0
    size: int = 0
    lines: list[str] = field(default_factory=list)
    truncated: bool = False
    more: bool = False
    restarted: bool = False
    finished: bool = False
    eof: bool = False
    redacted_lines: int = 0
    poll_after_s: float = 0.0


def read_job_log(
    job: Job,
    *,
    offset: int | None = None,
    tail: int | None = None,
    adapter: ClusterAdapter | None = None,
    max_bytes: int | None = None,
) -> JobLog:
    """The job's log from ``offset`` (default 0), or its last ``tail`` lines;
    the module docstring gives the contract."""
    adapter = adapter or get_adapter()
    limit = max_bytes or settings.RACKWISE_JOB_LOG_MAX_BYTES
    finished = job.state in FINISHED_JOB_STATES
    start = offset or 0
    answer = JobLog(
        job=job.pk,
        state=job.state,
        source=adapter.name,
        available=False,
        offset=start,
        next_offset=start,
        finished=finished,
        poll_after_s=0.0 if finished else settings.RACKWISE_JOB_LOG_POLL_S,
    )
    try:
        chunk = adapter.read_log(job, start, limit, from_end=tail is not None)
        if chunk.available and tail is None and start > chunk.size:
            answer.restarted = True
            chunk = adapter.read_log(job, 0, limit)
    except (ClusterUnavailable, StepFailed) as exc:
        # The cluster not answering now: the follower asks again later.
        answer.reason = f"the cluster did not answer: {exc}"[:500]
        answer.finished = answer.eof = False
        answer.poll_after_s = settings.RACKWISE_JOB_LOG_POLL_S
        return answer
    if not chunk.available:
        answer.reason = chunk.reason
        answer.eof = finished
        answer.next_offset = answer.offset = 0 if tail is not None else answer.offset
        return answer
    raw, first, consumed = _lines(chunk, limit, whole=not finished, tail=tail)
    secrets = redact.job_secrets(job)
    lines = [redact.log_line(line.decode("utf-8", errors="replace"), secrets) for line in raw]
    answer.available = True
    answer.lines = lines
    answer.offset = first
    answer.next_offset = first + consumed
    answer.size = chunk.size
    answer.truncated = tail is not None and first > 0
    # The read stopped at the byte limit, not at the end (a line still being
    # written is not "more": it is waited for).
    answer.more = chunk.offset + len(chunk.data) < chunk.size
    answer.redacted_lines = sum(redact.REDACTED in line for line in lines)
    answer.eof = finished and answer.next_offset >= chunk.size
    if answer.more or answer.eof:
        answer.poll_after_s = 0.0
    return answer


def _lines(chunk: LogChunk, limit: int, *, whole: bool, tail: int | None) -> tuple[list[bytes], int, int]:
    """The chunk's lines (without newlines), the byte offset of the first and
    the bytes they take (newlines included), as the contract's steps 1 and 2 say."""
    data, first = chunk.data, chunk.offset
    if tail is not None and first > 0:
        # The chunk starts inside a line: begin at the next whole one.
        cut = data.find(b"\n")
        if cut >= 0:
            data, first = data[cut + 1 :], first + cut + 1
    end = len(data)
    if whole or first + len(data) < chunk.size:
        last = data.rfind(b"\n")
        if last >= 0:
            end = last + 1
        elif len(data) < limit:
            end = 0  # one line being written: wait for the rest
        # else a line longer than the limit: give what was read
    kept = data[:end]
    lines = kept.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if tail is not None and len(lines) > tail:
        dropped = lines[: len(lines) - tail]
        first += sum(len(line) + 1 for line in dropped)
        kept = kept[sum(len(line) + 1 for line in dropped) :]
        lines = lines[len(lines) - tail :]
    return lines, first, len(kept)
