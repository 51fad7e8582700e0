"""``rackwise``: submit and follow jobs, read the racks, and decide as an operator,
from a shell. README, "For ML engineers: the rackwise command".

Every command takes ``--json`` (the API's JSON on stdout, for scripts) and exits
with a code a shell can test (``rackwise_cli.api.EXIT``); an error is one line
on stderr, the API's message as it came."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.live import Live

from rackwise_cli import __version__, config, render
from rackwise_cli.api import (
    EXIT,
    JOB_FAILED,
    REFUSED,
    UNAUTHENTICATED,
    USAGE,
    WAIT_TIMEOUT,
    Api,
    CliError,
)

out = Console(highlight=False, soft_wrap=True)
LOG_POLL_S = 2.0

# The fields of POST /api/jobs/ (fleet.api.serializers.JobSubmitSerializer), which
# a job file holds under the same names.
JOB_FIELDS = (
    "name",
    "tenant",
    "num_gpus",
    "num_nodes",
    "gpus_per_node",
    "segment_nodes",
    "locality",
    "priority",
    "preemptible",
    "expected_duration_s",
    "checkpoint_interval_s",
    "slurm",
    "idempotency_key",
)
SLURM_FIELDS = ("script", "command", "partition", "account", "time_limit_min", "env")
RUNNING, FINISHED_OK, FINISHED_BAD = {"running"}, {"completed"}, {"failed", "cancelled"}

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(value: Any, name: str) -> int:
    """``3600``, ``90s``, ``30m``, ``2h`` or ``1d`` in seconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = DURATION.match(str(value))
    if not match:
        raise click.BadParameter(
            f"{value!r} is not a duration (e.g. 3600, 90s, 30m, 2h, 1d)", param_hint=name
        )
    return round(float(match[1]) * UNITS[match[2]])


class Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value, param, ctx):
        return seconds(value, param.opts[0] if param else "duration")


# --- --json and errors -------------------------------------------------------------


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(dict)
        ctx.find_root().ensure_object(dict)["json"] = True


def json_option(f):
    """``--json`` on a command (as well as before it: ``rackwise --json jobs``)."""
    return click.option(
        "--json",
        is_flag=True,
        expose_value=False,
        callback=_set_json,
        help="Print the API's JSON (for scripts).",
        is_eager=True,
    )(f)


def as_json() -> bool:
    ctx = click.get_current_context()
    return bool((ctx.find_root().obj or {}).get("json"))


def emit(data: Any, human: Any = None) -> None:
    """The API's JSON with --json, else ``human`` (a rich renderable or text)."""
    if as_json():
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
    elif human is not None:
        out.print(human)


def note(text: str) -> None:
    """Progress for people, on stderr (stdout stays the answer)."""
    if not as_json():
        click.echo(text, err=True)


class Cli(click.Group):
    """Turns a ``CliError`` into one line on stderr and its exit code; with --json
    the API's error body goes to stdout too, so a script can read its fields."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as exc:
            if (ctx.obj or {}).get("json") and exc.body is not None:
                click.echo(json.dumps(exc.body, ensure_ascii=False))
            click.echo(f"rackwise: {exc.message}", err=True)
            ctx.exit(exc.code)
        except KeyboardInterrupt:
            ctx.exit(130)


EPILOG = "Exit codes: " + "; ".join(f"{code} {text}" for code, text in EXIT.items()) + "."


@click.group(cls=Cli, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--json", is_flag=True, expose_value=False, callback=_set_json, help="Print the API's JSON (for scripts)."
)
@click.version_option(__version__, prog_name="rackwise")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Rackwise from the command line: submit jobs and follow them, see the racks,
    approve and reject the operators' decisions.

    The server and token come from RACKWISE_SERVER and RACKWISE_TOKEN, else from
    the file `rackwise login` writes."""
    ctx.ensure_object(dict)


def api() -> Api:
    cfg = config.load()
    if not cfg.token:
        raise CliError("not logged in: run `rackwise login` or set RACKWISE_TOKEN", code=UNAUTHENTICATED)
    return Api(cfg.server, cfg.token)


# --- login ------------------------------------------------------------------------


@cli.command()
@click.option("--server", help="The server's URL, e.g. https://rackwise.example.com.")
@click.option("--token", help="An API token (`manage.py create_api_user`); asked for if not given.")
@json_option
def login(server: str | None, token: str | None) -> None:
    """Check a token against the server and keep both in the config file (0600)."""
    cfg = config.load()
    server = (server or cfg.server).rstrip("/")
    if not token:
        token = click.prompt("API token", hide_input=True, err=True).strip()
    me = Api(server, token).get("me/")
    path = config.save(server, token)
    emit(
        {"server": server, "config": str(path), **me},
        f"Logged in to {server} as {me['username']} ({me.get('role') or 'no role'}); "
        f"token kept in {path} (mode 0600)",
    )


@cli.command()
@json_option
def whoami() -> None:
    """Who the token belongs to, its role and tenants."""
    me = api().get("me/")
    emit(me, f"{me['username']} ({me.get('role') or 'no role'}), tenants: {', '.join(me['tenants']) or '-'}")


@cli.command()
@click.argument("name", required=False)
@json_option
def tenants(name: str | None) -> None:
    """Each team's quota and share, per node shape: nominal GPUs, in use, borrowed,
    lent, asked for by pending jobs, and its fair share now."""
    found = [api().get(f"tenants/{name}/")] if name else api().get("tenants/")
    emit(found, render.tenants_table(found) if found else "No tenants.")


# --- submit -----------------------------------------------------------------------


def read_job_file(path: str) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"cannot read job file {path}: {exc}", code=USAGE) from exc
    if not isinstance(data, dict):
        raise CliError(f"job file {path}: expected a mapping of job fields", code=USAGE)
    unknown = sorted(set(data) - set(JOB_FIELDS))
    slurm_unknown = sorted(set(data.get("slurm") or {}) - set(SLURM_FIELDS))
    if unknown or slurm_unknown:
        bad = unknown + [f"slurm.{k}" for k in slurm_unknown]
        raise CliError(
            f"job file {path}: unknown field(s) {', '.join(bad)}; known: {', '.join(JOB_FIELDS)}", code=USAGE
        )
    for key in ("expected_duration_s", "checkpoint_interval_s"):
        if isinstance(data.get(key), str):
            data[key] = seconds(data[key], key)
    return data


@cli.command()
@click.option(
    "-f", "--file", "job_file", type=click.Path(dir_okay=False), help="A YAML job file (API field names)."
)
@click.option("--name", help="The job's name.")
@click.option("--tenant", help="Its tenant (default: your only one).")
@click.option("--gpus", "num_gpus", type=int, help="GPUs (num_gpus); or --nodes with --gpus-per-node.")
@click.option("--nodes", "num_nodes", type=int, help="Nodes (num_nodes).")
@click.option("--gpus-per-node", type=int, help="GPUs on each node.")
@click.option("--segment-nodes", type=int, help="Nodes that must share one NVLink domain (rack).")
@click.option("--locality", type=click.Choice(["required", "preferred", "none"]))
@click.option("--priority", type=int)
@click.option("--preemptible/--not-preemptible", default=None)
@click.option("--duration", "expected_duration_s", type=Duration(), help="Expected run time: 3600, 30m, 2h.")
@click.option("--checkpoint-interval", "checkpoint_interval_s", type=Duration(), help="e.g. 1h.")
@click.option("--script", type=click.Path(exists=True, dir_okay=False), help="A Slurm batch script (#!...).")
@click.option("--command", help="A command Slurm runs with srun on every node.")
@click.option("--partition", help="Slurm partition.")
@click.option("--account", help="Slurm account.")
@click.option("--time-limit", "time_limit_min", type=int, help="Slurm --time, minutes.")
@click.option(
    "--env", "env", multiple=True, metavar="NAME=VALUE", help="Environment for the job (repeatable)."
)
@click.option("--idempotency-key", help="Resubmitting with the same key returns the same job.")
@click.option(
    "--what-if", is_flag=True, help="Say where it would start now, or why it would wait; submit nothing."
)
@click.option(
    "--wait", is_flag=True, help="Wait until it runs (exit 0) or ends (0 completed, 5 failed/cancelled)."
)
@click.option(
    "--timeout", type=Duration(), default=None, help="With --wait: give up after this long (exit 6)."
)
@click.option("--parsable", is_flag=True, help="Print only the job's id (for JOB=$(rackwise submit ...)).")
@json_option
def submit(job_file, what_if, wait, timeout, parsable, **flags):
    """Submit a job from flags, a YAML job file (-f), or both (flags win)."""
    if what_if and wait:
        raise click.UsageError("--what-if submits nothing: it cannot --wait")
    script, env = flags.pop("script"), flags.pop("env")
    extra = {k: flags.pop(k) for k in ("command", "partition", "account", "time_limit_min")}
    body: dict[str, Any] = read_job_file(job_file) if job_file else {}
    body.update({k: v for k, v in flags.items() if v is not None})
    slurm = dict(body.get("slurm") or {})
    if script:
        slurm["script"] = Path(script).read_text()
    slurm.update({k: v for k, v in extra.items() if v is not None})
    if env:
        pairs = dict(slurm.get("env") or {})
        for item in env:
            name, sep, value = item.partition("=")
            if not sep:
                raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--env")
            pairs[name] = value
        slurm["env"] = pairs
    if slurm:
        body["slurm"] = slurm
    client = api()
    if what_if:
        answer = client.post("jobs/what-if/", body)
        emit(answer, render.what_if(answer))
        return
    job = client.post("jobs/", body)
    if not wait:
        emit(
            job, str(job["id"]) if parsable else f"Submitted job {job['id']} ({job['name']}): {job['state']}"
        )
        return
    note(f"Submitted job {job['id']} ({job['name']}); waiting for it to run")
    wait_for_job(client, job["id"], timeout, parsable)


def wait_for_job(
    client: Api, job_id: int, timeout: float | None, parsable: bool, poll_s: float = 1.0
) -> None:
    """Poll the job until it runs or ends; the exit code says which."""
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = None
    while True:
        job = client.get(f"jobs/{job_id}/")
        state = (job["state"], job.get("state_reason"))
        if state != seen:
            why = f": {job['state_reason']}" if job.get("state_reason") else ""
            note(f"job {job_id}: {job['state']}{why}")
            seen = state
        if job["state"] in RUNNING | FINISHED_OK | FINISHED_BAD:
            emit(job, str(job_id) if parsable else render.job_detail(job))
            if job["state"] in FINISHED_BAD:
                raise click.exceptions.Exit(JOB_FAILED)
            return
        if deadline is not None and time.monotonic() > deadline:
            raise CliError(
                f"job {job_id} is still {job['state']} after {timeout:g} s", code=WAIT_TIMEOUT, body=job
            )
        time.sleep(poll_s)


# --- jobs -------------------------------------------------------------------------


@cli.command()
@click.option(
    "--state", multiple=True, help="pending, placed, running, recovering, completed, failed, cancelled."
)
@click.option("--tenant")
@click.option("--owner")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@json_option
def jobs(state, tenant, owner, limit):
    """The jobs you may see: where each runs, or why it waits."""
    params = {k: v for k, v in {"state": list(state), "tenant": tenant, "owner": owner}.items() if v}
    found = api().pages("jobs/", params, limit=limit)
    emit(found, render.jobs_table(found) if found else "No jobs.")


@cli.command()
@click.argument("job_id", type=int)
@json_option
def job(job_id):
    """One job: where it runs (racks, nodes, GPUs), or why it waits, in words."""
    found = api().get(f"jobs/{job_id}/")
    emit(found, render.job_detail(found))


@cli.command()
@click.argument("job_id", type=int)
@json_option
def cancel(job_id):
    """Cancel a job (its GPUs are freed; a finished job is a conflict, exit 1)."""
    found = api().post(f"jobs/{job_id}/cancel/")
    emit(found, f"Job {job_id} ({found['name']}): {found['state']}")


def log_lines(answer: dict) -> list[str]:
    """The lines of a logs answer (``lines``; ``text`` split, should a server send that)."""
    if isinstance(answer.get("lines"), list):
        return [str(x) for x in answer["lines"]]
    text = answer.get("text")
    return text.splitlines() if isinstance(text, str) else []


@cli.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep reading until the job ends (polls every 2 s).")
@click.option("--tail", type=click.IntRange(1, 10_000), help="Start with the last N lines.")
@json_option
def logs(job_id, follow, tail):
    """A job's log (Slurm: its output file), redacted as the API serves it.
    With --json, one JSON answer per line (JSON Lines)."""
    client = api()
    params: dict[str, Any] = {"tail": tail} if tail else {"offset": 0}
    said_why = False
    while True:
        answer = client.get(f"jobs/{job_id}/logs/", params)
        if as_json():
            click.echo(json.dumps(answer, ensure_ascii=False))
        else:
            for line in log_lines(answer):
                click.echo(line)
            if answer.get("available") is False and answer.get("reason") and not said_why:
                click.echo(f"rackwise: no log yet: {answer['reason']}", err=True)
                said_why = True
        if not follow or answer.get("eof") or "next_offset" not in answer:
            return
        params = {"offset": answer["next_offset"]}
        if not answer.get("more"):
            time.sleep(LOG_POLL_S)


# --- racks ------------------------------------------------------------------------


def _named(racks: list[dict], names: tuple[str, ...]) -> list[dict]:
    if not names:
        return racks
    missing = sorted(set(names) - {r["name"] for r in racks})
    if missing:
        raise CliError(f"no rack named {', '.join(missing)}", code=REFUSED)
    return [r for r in racks if r["name"] in names]


@cli.command()
@click.argument("names", nargs=-1)
@json_option
def racks(names):
    """The racks as grids: a row per node, a letter per job on its GPUs."""
    client = api()
    snapshot = client.get("console/racks/")
    summary = client.get("fleet/summary/")
    shown = _named(snapshot["racks"], names)
    emit({**snapshot, "racks": shown}, render.racks_view(shown, summary))


@cli.command()
@click.argument("names", nargs=-1)
@click.option("--interval", type=click.FloatRange(0.2, 3600), default=2.0, show_default=True, help="Seconds.")
@click.option("-n", "--iterations", type=click.IntRange(1), help="Stop after N refreshes.")
@json_option
def top(names, interval, iterations):
    """The racks, live: refreshed every --interval from the API's change feed
    (``/api/console/racks/?since=``, only the racks that changed)."""
    client = api()
    snapshot = client.get("console/racks/")
    racks_by_id = {r["rack"]: r for r in snapshot["racks"]}
    cursor = snapshot["cursor"]
    if as_json():
        click.echo(json.dumps(snapshot, ensure_ascii=False))

    def frame():
        summary = client.get("fleet/summary/")
        return render.racks_view(
            _named(sorted(racks_by_id.values(), key=lambda r: r["rack"]), names), summary
        )

    # On a terminal, one picture redrawn in place; piped, a frame per refresh
    # (like top -b); with --json, the first snapshot and then each change as a
    # JSON line.
    live = Live(frame(), console=out, auto_refresh=False) if out.is_terminal and not as_json() else None
    count = 1
    try:
        if live:
            live.start(refresh=True)
        elif not as_json():
            out.print(frame())
        while iterations is None or count < iterations:
            time.sleep(interval)
            delta = client.get("console/racks/", {"since": cursor})
            cursor = delta["cursor"]
            for rack in delta["racks"]:
                # A rack may come again at the version we have; keep the newer.
                if rack["version"] >= racks_by_id.get(rack["rack"], {"version": -1})["version"]:
                    racks_by_id[rack["rack"]] = rack
            for gone in set(racks_by_id) - set(delta["rack_ids"]):
                del racks_by_id[gone]
            if as_json():
                click.echo(json.dumps(delta, ensure_ascii=False))
            elif live:
                live.update(frame(), refresh=True)
            else:
                out.rule()
                out.print(frame())
            count += 1
    except KeyboardInterrupt:
        pass  # Ctrl-C is how one leaves top: exit 0
    finally:
        if live:
            live.stop()


# --- operators --------------------------------------------------------------------

OPEN_ACTIONS = ("proposed", "approved", "executing")


@cli.command()
@click.option("--state", multiple=True, help=f"Default: the open ones ({', '.join(OPEN_ACTIONS)}).")
@click.option("--kind", multiple=True, help="placement, recovery, defrag, drain, ...")
@click.option("--job", "job_id", type=int, help="Actions about this job.")
@click.option("--all", "every", is_flag=True, help="Every state.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@json_option
def actions(state, kind, job_id, every, limit):
    """The decisions queue: what waits for approval, what runs."""
    params: dict[str, Any] = {"kind": list(kind)}
    if not every:
        params["state"] = list(state or OPEN_ACTIONS)
    if job_id:
        params["job"] = job_id
    found = api().pages("actions/", params, limit=limit)
    emit(found, render.actions_table(found) if found else "No actions.")


@cli.command()
@click.argument("action_id", type=int)
@json_option
def action(action_id):
    """One action: its steps, cost and state."""
    found = api().get(f"actions/{action_id}/")
    emit(found, render.action_detail(found))


@cli.command()
@click.argument("action_id", type=int)
@click.option("--note", default="", help="Why (kept in the audit log).")
@json_option
def approve(action_id, note):
    """Approve a proposed action. A plan that went stale is made again: exit 1,
    naming the new plan and its cost (approve that one to confirm)."""
    try:
        found = api().post(f"actions/{action_id}/approve/", {"note": note})
    except CliError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        if body.get("replanned") and isinstance(body.get("action"), dict):
            exc.message = (
                f"{exc.message}; new plan: action {body['action']['id']} costs "
                f"{body.get('cost_gpu_hours')} GPU-hours (was {body.get('previous_cost_gpu_hours')}); "
                f"`rackwise approve {body['action']['id']}` to confirm"
            )
        raise
    emit(found, f"Action {action_id} ({found['kind']}): {found['state']}")


@cli.command()
@click.argument("action_id", type=int)
@click.option("--note", default="", help="Why (kept in the audit log).")
@json_option
def reject(action_id, note):
    """Reject a proposed action."""
    found = api().post(f"actions/{action_id}/reject/", {"note": note})
    emit(found, f"Action {action_id} ({found['kind']}): {found['state']}")


def node_id_of(client: Api, node: str) -> int:
    """A node by hostname (exact) or id."""
    if node.isdecimal():
        return int(node)
    matches = [n for n in client.pages("nodes/", {"hostname": node}, limit=1000) if n["hostname"] == node]
    if not matches:
        raise CliError(f"no node named {node!r}", code=REFUSED)
    return int(matches[0]["id"])


@cli.command()
@click.argument("node")
@click.option("--reason", required=True, help="Why (shown on the node and in the audit log).")
@click.option("--confirm", is_flag=True, help="Drain even though jobs run on it (they finish in place).")
@json_option
def drain(node, reason, confirm):
    """Stop new work landing on NODE (a hostname or id); its jobs finish in place."""
    client = api()
    try:
        found = client.post(
            f"nodes/{node_id_of(client, node)}/drain/", {"reason": reason, "confirm": confirm}
        )
    except CliError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        if body.get("confirm_required"):
            jobs_ = (body.get("impact") or {}).get("jobs") or []
            names = ", ".join(f"{j.get('id')} {j.get('name')}" for j in jobs_)
            exc.message = f"{exc.message}; jobs on it: {names or '?'}; send again with --confirm"
        raise
    why = f" ({found['state_reason']})" if found.get("state_reason") else ""
    emit(found, f"Node {found['hostname']}: {found['state']}{why}")


@cli.command()
@click.option("--free-racks", type=int, help="Target: this many whole free racks.")
@click.option("--room-for-nodes", type=int, help="Target: room for a rack-local job of this many nodes.")
@click.option("--gpus-per-node", type=int, help="With --room-for-nodes: the node size.")
@click.option("--budget-gpu-hours", type=float, help="Most GPU-hours of work the plan may cost.")
@click.option("--max-moves", type=int, help="Most jobs the plan may move.")
@click.option("--parsable", is_flag=True, help="Print only the plan's action id (nothing when none).")
@json_option
def defrag(parsable, **goal):
    """Plan a defragmentation now; the plan waits in `rackwise actions` for approval."""
    body = {k: v for k, v in goal.items() if v is not None}
    answer = api().post("actions/defrag/", body)
    if "id" in answer:
        emit(answer, str(answer["id"]) if parsable else render.action_detail(answer))
    elif parsable:
        emit(answer)
        note(f"nothing to do: {answer.get('reason')}")
    else:
        emit(answer, f"No plan: {answer.get('reason')}")


def main() -> None:
    cli(prog_name="rackwise")


if __name__ == "__main__":
    main()
