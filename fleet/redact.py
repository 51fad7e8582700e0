"""What a reader may see: of an action (a submitter, other tenants' jobs), in
one place for the API, the pages and the live feed; and of a job's log
(secrets, :func:`log_line`).

The rule follows jobs and racks (see ``fleet.permissions`` and
``fleet.events.visible_to``):

1. Viewers and operators see every action in full.
2. An action that touches no job (a node drain) is fleet-level, like a rack:
   everyone with a role sees it in full.
3. An action whose jobs all belong to other tenants is hidden from a submitter,
   as those jobs are (``fleet.permissions.visible_actions``); its live events
   carry only id, kind, state and progress, as a foreign job's events do.
4. An action touching the submitter's jobs and other tenants' jobs (a defrag
   moving several, a preemption) is shown with every other tenant's job reduced
   to its id: its steps lose their hostnames, nodes and reasons, and the free
   text that may name them (title, engine plan, error, note, log messages of
   those steps) is withheld.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

WITHHELD = "withheld: this action also touches other tenants' jobs"
# Keys of a step that say where another tenant's job runs or why.
_STEP_KEYS_KEPT = ("op", "job")
# Benefit figures that are about the fleet, not about anyone's job.
_BENEFIT_KEYS_KEPT = (
    "target",
    "feasible",
    "jobs_made_placeable",
    "fragmentation_before",
    "fragmentation_after",
    "free_racks_before",
    "free_racks_after",
    "racks",
)


def withheld_title(kind: str, action_id: int | None, job_ids: Iterable[int]) -> str:
    """A title that names jobs by id only (the real one may carry a job's name)."""
    ids = ", ".join(f"#{j}" for j in sorted(job_ids))
    return f"{kind} #{action_id}: job(s) {ids} (details of other tenants' jobs withheld)"


def foreign_jobs(job_tenants: dict[int, int], tenant_ids: set[int] | None) -> set[int]:
    """Ids of the jobs (``{job_id: tenant_id}``) that belong to none of ``tenant_ids``."""
    if tenant_ids is None:
        return set()
    return {job for job, tenant in job_tenants.items() if tenant not in tenant_ids}


def redacted_step(step: dict, foreign: set[int]) -> dict:
    """The step as is, or only its op and job id when that job is another tenant's."""
    if step.get("job") is None or step["job"] not in foreign:
        return step
    out = {k: step[k] for k in _STEP_KEYS_KEPT if k in step}
    # The typed step needs these to parse (and then says "on its nodes").
    if step["op"] == "swap":
        out["swaps"] = {}
    elif step["op"] == "allocate":
        out["nodes"] = {}
    return out


def action_for(action: Any, tenant_ids: set[int] | None) -> Any:
    """The action as a user with ``tenant_ids`` (None: every tenant) may read it:
    the same instance when nothing is withheld, else an unsaved copy with other
    tenants' jobs reduced to ids (rule 4 above). Needs ``action.jobs`` (prefetch
    it for lists)."""
    if tenant_ids is None:
        return action
    job_tenants = {job.pk: job.tenant_id for job in action.jobs.all()}
    # A step naming a job the action does not list counts as another tenant's.
    for step in action.steps:
        if step.get("job") is not None and step["job"] not in job_tenants:
            job_tenants[step["job"]] = -1
    foreign = foreign_jobs(job_tenants, tenant_ids)
    if not foreign:
        return action
    shown = copy.copy(action)
    steps = [redacted_step(s, foreign) for s in action.steps]
    shown.plan = {"steps": steps}
    shown.title = withheld_title(action.kind, action.pk, job_tenants)
    shown.benefit = {k: v for k, v in (action.benefit or {}).items() if k in _BENEFIT_KEYS_KEPT}
    shown.error = WITHHELD if action.error else ""
    shown.decision_note = WITHHELD if action.decision_note else ""
    shown.log = [_redacted_log_entry(entry, steps, foreign) for entry in action.log]
    shown.redacted = True
    shown.foreign_jobs = foreign
    return shown


def _redacted_log_entry(entry: dict, steps: list[dict], foreign: set[int]) -> dict:
    index = entry.get("step")
    if not isinstance(index, int) or not 0 <= index < len(steps):
        return entry
    step = steps[index]
    if step.get("job") not in foreign:
        return entry
    return {**entry, "message": f"{step['op']} job #{step['job']}"}


# --- job logs --------------------------------------------------------------------

REDACTED = "[redacted]"
# A job's environment value shorter than this is not hunted in its log: "1" or
# "gpu" would blank half the lines.
MIN_SECRET_CHARS = 6
# Names that say their value is a secret (token, but not tokens/tokenizer: LLM
# logs are full of those).
_SECRET_NAME = (
    r"[A-Za-z0-9_.-]*?"
    r"(?:secret|token(?![si])|passw(?:or)?d|passwd|api[_-]?key|access[_-]?key|private[_-]?key|credentials?)"
    r"[A-Za-z0-9_.-]*"
)
_LOG_SECRETS = [
    # NAME=value, NAME: value, "name": "value" (env dumps, configs, JSON)
    re.compile(rf"""(?i)(\b{_SECRET_NAME}["']?\s*[=:]\s*["']?)([^\s"',;]+)"""),
    # --token value, --password=value
    re.compile(rf"(?i)(--?{_SECRET_NAME}(?:=|\s+))([^\s\-][^\s]*)"),
    # Authorization headers
    re.compile(r"(?i)(\b(?:bearer|token|basic)\s+)([A-Za-z0-9._~+/=-]{8,})"),
    # credentials in a URL
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s/:@]+:)([^\s/@]+)(?=@)"),
]
# Tokens recognisable by their shape alone.
_TOKEN_SHAPES = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|glpat-[A-Za-z0-9_-]{20,})\b"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)


def log_line(line: str, secrets: Iterable[str] = ()) -> str:
    """A log line with what looks like a secret replaced by ``[redacted]``: the
    given values (a job's environment, whose values the API never shows), the
    value of a secret-sounding name (``HF_TOKEN=..``, ``--password ..``), an
    ``Authorization`` header's credentials, a password in a URL and tokens of
    well-known shapes. Line by line: a secret split across lines is not found."""
    for value in secrets:
        if len(value) >= MIN_SECRET_CHARS and value in line:
            line = line.replace(value, REDACTED)
    for pattern in _LOG_SECRETS:
        line = pattern.sub(lambda m: m.group(1) + (m.group(2) if m.group(2) == REDACTED else REDACTED), line)
    return _TOKEN_SHAPES.sub(REDACTED, line)


def job_secrets(job: Any) -> list[str]:
    """The values a job's log must not show: its environment's (``slurm.env``),
    longest first so that one containing another is replaced whole."""
    env = ((job.cluster_spec or {}).get("slurm") or {}).get("env") or {}
    return sorted((str(v) for v in env.values()), key=len, reverse=True)
