"""What the commands print for people (``--json`` prints the API's JSON instead):
tables of jobs and actions, a job's placement in words, and the racks as grids."""

from __future__ import annotations

import string
from typing import Any

from rich.columns import Columns
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

# The console's palette slots (fleet.palette) as terminal colours: neighbours
# in a rack get different slots, so different colours here too.
SLOT_COLORS = ("cyan", "magenta", "yellow", "blue", "green", "bright_red", "bright_cyan", "bright_magenta")
NODE_STYLES = {"healthy": "", "suspect": "yellow", "draining": "yellow", "drained": "dim yellow"}
MARKS = string.ascii_uppercase + string.ascii_lowercase + string.digits


def shape(job: dict) -> str:
    if job.get("num_nodes") and job.get("gpus_per_node") and job["num_nodes"] > 1:
        text = f"{job['num_nodes']}x{job['gpus_per_node']} GPUs"
    else:
        text = f"{job.get('num_gpus')} GPU" + ("s" if job.get("num_gpus") != 1 else "")
    if job.get("segment_nodes") and job.get("num_nodes") and job["segment_nodes"] < job["num_nodes"]:
        text += f", segments of {job['segment_nodes']}"
    return text


def racks_of(job: dict) -> list[str]:
    held = sorted({n["rack"] for n in job.get("allocated") or []})
    return held or list((job.get("placement") or {}).get("racks") or [])


def table(columns: tuple[str, ...], rows: list[tuple[str, ...]], keep: tuple[str, ...]) -> Table:
    """A table that crops nothing at any terminal width (80 columns when piped):
    the ``keep`` columns (ids, states) are never narrower than their longest
    cell, the others fold onto more lines, and the last (a reason or title)
    keeps at least 12 characters. A cropped id would name another job."""
    out = Table(box=None, header_style="bold", pad_edge=False)
    for i, col in enumerate(columns):
        longest = max((len(row[i]) for row in rows), default=0)
        if col in keep:
            out.add_column(col, no_wrap=True, min_width=max(len(col), longest))
        else:
            out.add_column(col, overflow="fold", min_width=12 if i == len(columns) - 1 else None)
    for row in rows:
        out.add_row(*row)
    return out


def jobs_table(jobs: list[dict]) -> Table:
    rows = []
    for job in jobs:
        racks = racks_of(job) if job["state"] in ("placed", "running", "recovering") else []
        where = ", ".join(racks) if racks else (job.get("state_reason") or "")
        rows.append(
            (str(job["id"]), job["name"], job["tenant"], job["owner"], job["state"], shape(job), where)
        )
    columns = ("ID", "NAME", "TENANT", "OWNER", "STATE", "SHAPE", "WHERE / WHY")
    return table(columns, rows, keep=("ID", "STATE"))


def tenants_table(tenants: list[dict]) -> Table:
    """A row per tenant and node shape, in GPUs; BORROW/LEND is the most it may
    borrow (``any``: no limit) and lend (``all``: its whole idle quota). The
    cohort and weight are in --json."""
    rows = []
    for t in tenants:
        for q in t.get("quotas") or [{}]:
            figures = [
                str(q.get(k, "-"))
                for k in (
                    "nominal_gpus",
                    "in_use_gpus",
                    "borrowed_gpus",
                    "lent_gpus",
                    "pending_gpus",
                    "fair_share_gpus",
                )
            ]
            borrow, lend = q.get("borrowing_limit_gpus"), q.get("lending_limit_gpus")
            limits = f"{'any' if borrow is None else borrow}/{'all' if lend is None else lend}"
            shape = f"{q['gpus_per_node']}/node" if q else "-"
            rows.append((t["name"], shape, *figures, limits if q else "-"))
    columns = ("TENANT", "SHAPE", "NOMINAL", "USED", "BORROWED", "LENT", "PENDING", "FAIR", "BORROW/LEND")
    # The figures and limits are never folded; the name and the shape may be.
    return table(columns, rows, keep=columns[2:])


def gpu_ranges(gpus: list[int]) -> str:
    gpus = sorted(gpus)
    if gpus and gpus == list(range(gpus[0], gpus[-1] + 1)) and len(gpus) > 1:
        return f"GPUs {gpus[0]}-{gpus[-1]}"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))


def nodes_by_rack(nodes: list[dict]) -> list[Text]:
    """``r1: 4 nodes, GPUs 0-3 each: r1-n00, r1-n01, ...``, a line per rack."""
    by_rack: dict[str, list[dict]] = {}
    for node in nodes:
        by_rack.setdefault(node["rack"], []).append(node)
    lines = []
    for rack, held in sorted(by_rack.items()):
        count = f"{len(held)} node{'s' if len(held) != 1 else ''}"
        if len({tuple(n["gpus"]) for n in held}) == 1:
            hosts = ", ".join(n["hostname"] for n in held)
            lines.append(Text(f"  {rack}: {count}, {gpu_ranges(held[0]['gpus'])} each: {hosts}"))
        else:
            hosts = ", ".join(f"{n['hostname']} ({gpu_ranges(n['gpus'])})" for n in held)
            lines.append(Text(f"  {rack}: {count}: {hosts}"))
    return lines


def job_detail(job: dict) -> Group:
    """A job in words: what, where it runs (racks, nodes, GPUs), or why it waits."""
    lines = [
        Text.assemble((f"job {job['id']} ", "bold"), (job["name"], "bold cyan"), f"  {job['state']}"),
        Text(
            f"tenant {job['tenant']}, owner {job['owner']}, {shape(job)}, locality {job['locality']}, "
            f"priority {job['priority']}, {'preemptible' if job['preemptible'] else 'not preemptible'}"
        ),
    ]
    allocated = job.get("allocated") or []
    if allocated:
        lines.append(Text("runs on:", style="bold"))
        lines += nodes_by_rack(allocated)
    if job.get("state_reason"):
        label = "why it waits" if job["state"] == "pending" else "why"
        lines.append(Text.assemble((f"{label}: ", "bold"), job["state_reason"]))
    reason = (job.get("placement") or {}).get("reason")
    if reason and allocated:
        lines.append(Text.assemble(("placement: ", "bold"), str(reason)))
    for key in ("submitted_at", "placed_at", "started_at", "finished_at"):
        if job.get(key):
            lines.append(Text(f"{key.removesuffix('_at')}: {job[key]}", style="dim"))
    return Group(*lines)


def what_if(answer: dict) -> Group:
    lines = [Text(answer["summary"], style="bold green" if answer["starts_now"] else "bold yellow")]
    if answer.get("reason"):
        lines.append(Text(f"reason: {answer['reason']}"))
    lines += nodes_by_rack(answer.get("placement") or [])
    lines.append(
        Text(
            f"largest free slice: {answer['largest_free_slice']} {answer['largest_free_unit']}; "
            f"jobs ahead: {answer['jobs_ahead']}",
            style="dim",
        )
    )
    quota = answer.get("quota")
    if quota:
        lines.append(Text(f"quota: {quota['reason']}", style="dim"))
    return Group(*lines)


def actions_table(actions: list[dict]) -> Table:
    rows = []
    for a in actions:
        cost = a.get("cost_gpu_hours")
        rows.append(
            (
                str(a["id"]),
                a["kind"],
                a["state"],
                ",".join(map(str, a.get("jobs") or [])),
                "" if cost is None else f"{cost:g}",
                a.get("title") or "",
            )
        )
    columns = ("ID", "KIND", "STATE", "JOBS", "COST GPU-h", "TITLE")
    return table(columns, rows, keep=("ID", "KIND", "STATE"))


def action_detail(a: dict) -> Group:
    lines = [Text.assemble((f"action {a['id']} ", "bold"), (a["kind"], "bold cyan"), f"  {a['state']}")]
    if a.get("title"):
        lines.append(Text(a["title"]))
    for step in a.get("steps") or []:
        lines.append(Text(f"  {'✓' if step.get('done') else '·'} {step['text']}"))
    if a.get("cost_gpu_hours") is not None:
        lines.append(Text(f"cost: {a['cost_gpu_hours']:g} GPU-hours", style="dim"))
    if a.get("decision_note"):
        lines.append(Text(f"note: {a['decision_note']}", style="dim"))
    return Group(*lines)


def rack_grid(rack: dict) -> Panel:
    """One rack as the console draws it: a row per node, a cell per GPU; a
    letter per job (the legend under it names them), ``·`` free, ``x`` failed."""
    jobs = rack.get("jobs") or {}
    marks = {job_id: MARKS[i % len(MARKS)] for i, job_id in enumerate(sorted(jobs, key=int))}
    held = rack.get("held") or {}
    rows = []
    free = used = 0
    for node_id, slot, hostname, state, gpus in rack["nodes"]:
        line = Text(f"{slot:>2} {hostname[-12:]:<12} ", style=NODE_STYLES.get(state, "red"))
        for health, job_id in gpus:
            if health == "failed":
                line.append("x", style="bold red")
            elif job_id is None:
                line.append("·", style="yellow" if health == "degraded" else "dim")
                free += state == "healthy"
            else:
                job = jobs.get(str(job_id), {})
                color = SLOT_COLORS[int(job.get("color") or 0) % len(SLOT_COLORS)]
                line.append(marks.get(str(job_id), "?"), style=f"bold {color}")
                used += 1
        if state != "healthy":
            line.append(f" {state}", style=NODE_STYLES.get(state, "red"))
        if str(node_id) in held:
            line.append(f" held by action {held[str(node_id)]}", style="dim")
        rows.append(line)
    legend = [
        Text(
            f"{marks[k]} job {k} {(jobs[k].get('name') or '(another tenant)')} {jobs[k].get('state', '')}",
            style=SLOT_COLORS[int(jobs[k].get("color") or 0) % len(SLOT_COLORS)],
        )
        for k in sorted(jobs, key=int)
    ]
    title = f"{rack['name']}  {used} used, {free} free  v{rack['version']}"
    return Panel(Group(*rows, *legend), title=title, title_align="left", expand=False)


def racks_view(racks: list[dict], summary: dict | None = None) -> Group:
    header: list[Any] = []
    if summary:
        by_state = summary.get("jobs_by_state") or {}
        header.append(
            Text(
                f"{summary['racks']} racks, {summary['gpus_used']}/{summary['gpus_total']} GPUs used "
                f"({summary['utilization']:.0%}), {summary['gpus_failed']} failed; jobs "
                + (", ".join(f"{k} {v}" for k, v in sorted(by_state.items()) if v) or "none"),
                style="bold",
            )
        )
    return Group(*header, Columns([rack_grid(r) for r in racks]))
