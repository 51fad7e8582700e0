"""In-place swap on a real Slurm 24.11: time from an operator's approval to the
job RUNNING again on its new nodes, median over 10 swaps.

Each round: an 8-node job runs in rack01; one of its nodes is set DOWN in Slurm
(Slurm kills and requeues the job itself); the Slurm sync fails the node in
Rackwise (the job goes recovering) and recovery proposes a swap for a spare in
the rack (recovery is set to need approval here). Timed: the approval, then the
action's steps as a worker runs them (``execute_next_step`` in this process,
so Celery's hand-off of a few milliseconds is left out): the swap
(``requeuehold``/``hold``, ``update NodeList=.. StartTime=now``) and the restart
(``release``, wait for RUNNING). The node is then resumed in Slurm and synced
back for the next round.

    .venv/bin/python benchmarks/bench_slurm_swap.py [--rounds 10]

Uses the cluster named by RACKWISE_SLURM_BIN (and the other variables
``scripts/slurm-cluster start`` prints) if set, else starts one of its own in
var/slurm/bench-run (port base 27900) and stops it afterwards. Needs root and
PostgreSQL on 127.0.0.1:5432 (a throwaway test database is created and dropped).
Figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cluster_env() -> tuple[dict[str, str], dict[str, str] | None]:
    """The cluster's exported variables, and the env to stop it with (None: not ours)."""
    if os.environ.get("RACKWISE_SLURM_BIN"):
        return {k: v for k, v in os.environ.items() if k.startswith(("RACKWISE_SLURM_", "SLURM_"))}, None
    env = os.environ | {
        "RACKWISE_SLURM_DIR": str(ROOT / "var/slurm/bench-run"),
        "RACKWISE_SLURM_PORT_BASE": os.environ.get("RACKWISE_SLURM_PORT_BASE", "27900"),
    }
    out = subprocess.run(
        [str(ROOT / "scripts/slurm-cluster"), "start"], env=env, check=True, capture_output=True, text=True
    ).stdout
    exported = dict(w.split("=", 1) for w in out.strip().splitlines()[-1].split()[1:])
    return exported, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    exported, own = _cluster_env()
    os.environ.update(exported)
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rackwise_bench_slurm")
    os.environ.setdefault("SECRET_KEY", "bench")
    os.environ.setdefault("DEBUG", "0")
    os.environ["RACKWISE_SLURM_CHECKPOINT_GRACE_S"] = "0"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackwise.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        from fleet import steps as st
        from fleet.choices import ActionKind, ActionState, ApprovalMode
        from fleet.cluster.slurm import SlurmAdapter
        from fleet.models import Allocation, Job, Node, Tenant
        from fleet.services.actions import propose as action_services
        from fleet.services.decisions import recovery
        from fleet.services.execution import execute as execution
        from fleet.services.execution import slurm_sync
        from fleet.services.jobs import allocations as job_allocations
        from fleet.services.jobs import submit as job_services
        from fleet.services.users import ensure_user

        adapter = SlurmAdapter.from_settings()
        cli = adapter.cli
        for item in adapter._jobs():
            if not item.ended:
                cli.run("scancel", item.job_id)
        call_command("import_topology", "--from", "slurm-live", stdout=io.StringIO())
        Tenant.objects.get_or_create(name="bench")
        user, _ = ensure_user(None, "bench", role="operator", issue_token=False)
        nodes = {n.hostname: n for n in Node.objects.all()}
        hosts = [f"r01n{i:02d}" for i in range(1, 9)]

        job = job_services.submit_job(
            user, job_services.JobSpec(name="bench", tenant="bench", num_nodes=8, gpus_per_node=4)
        )
        Job.objects.filter(pk=job.pk).update(
            cluster_spec={
                "slurm": {
                    "script": "#!/bin/bash\ntrap 'echo ckpt' USR1\nwhile true; do sleep 5 & wait $!; done\n"
                }
            }
        )
        job_allocations.apply_placement(
            user, job.pk, {nodes[h].pk: [0, 1, 2, 3] for h in hosts}, reason="bench"
        )
        out = adapter.perform(
            None,
            0,
            st.Allocate(job=job.pk, nodes={nodes[h].pk: [0, 1, 2, 3] for h in hosts}, hostnames=hosts),
        )
        Job.objects.filter(pk=job.pk).update(external_id=out.external_id)
        adapter.perform(None, 1, st.Start(job=job.pk))
        job_allocations.start_job(None, job.pk)
        sid = out.external_id

        action_services.set_policy(user, ActionKind.RECOVERY, ApprovalMode.MANUAL)
        times: list[float] = []
        for n in range(args.rounds):
            failed = hosts[n % len(hosts)]
            cli.run(
                "scontrol", "update", f"NodeName={failed}", "State=DOWN", "Reason=bench: fell off the bus"
            )
            slurm_sync.sync_nodes(adapter)
            assert Job.objects.get(pk=job.pk).state == "recovering"
            action = recovery.plan_recovery(job.pk)
            assert action is not None and action.kind == ActionKind.RECOVERY, action
            t0 = time.monotonic()
            action_services.approve(user, action.pk)
            while execution.execute_next_step(action.pk, adapter=adapter).more:
                pass
            took = time.monotonic() - t0
            action.refresh_from_db()
            running = cli.job(sid)
            new_hosts = sorted(
                set(
                    Allocation.objects.filter(job=job, released_at__isnull=True).values_list(
                        "gpu__node__hostname", flat=True
                    )
                )
            )
            (spare,) = set(new_hosts) - set(hosts)
            ok = (
                action.state == ActionState.SUCCEEDED
                and running["job_state"] == ["RUNNING"]
                and sorted(cli.run("scontrol", "show", "hostnames", running["nodes"]).split()) == new_hosts
            )
            hosts = new_hosts
            times.append(took)
            verdict = (
                "RUNNING on the new nodes"
                if ok
                else f"NOT as planned: {action.state}, {running['job_state']}, {running['nodes']}"
            )
            print(f"swap {n + 1:2d}: {failed} -> {spare}  {took:5.2f} s  {verdict}")
            cli.run("scontrol", "update", f"NodeName={failed}", "State=RESUME")
            deadline = time.monotonic() + 10
            while not slurm_sync.sync_nodes(adapter)["return"] and time.monotonic() < deadline:
                time.sleep(0.2)
        cli.run("scancel", sid)
        print(
            f"\n{len(times)} swaps on an 8-node job: median {statistics.median(times):.2f} s, "
            f"min {min(times):.2f} s, max {max(times):.2f} s (approval -> RUNNING on the new nodes)"
        )
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        if own is not None:
            subprocess.run([str(ROOT / "scripts/slurm-cluster"), "stop"], env=own, capture_output=True)


if __name__ == "__main__":
    main()
