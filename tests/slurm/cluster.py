"""The real Slurm test cluster: a session fixture, ``slurm_cluster``, used by
tests/slurm/ and by the browser test of the Slurm swap (imported into
tests/conftest.py so that there is one cluster per session).

The session fixture ``slurm_cluster`` starts it once with ``scripts/slurm-cluster`` in a runtime
directory of its own (``var/slurm/test-run``) on a port base of its own (26900, or the next free
one of 27000..27700; ``RACKWISE_SLURM_TEST_PORT_BASE`` pins it), so a cluster a user started with
the defaults is left alone. It is stopped at the end of the session.

A test should call ``slurm_cluster.reset()`` first: the cluster is shared.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-cluster"
RACKS, NODES_PER_RACK, GPUS_PER_NODE = 2, 18, 4


@dataclass
class SlurmCluster:
    """Handle on the running test cluster. All client commands go through the wrappers in ``bin``."""

    bin: Path
    root: Path
    jobs_dir: Path
    jobs_dir_in_cluster: str
    env: dict[str, str]
    partition: str
    nodes: list[str]
    rest_url: str
    dir: Path
    port_base: int
    script_env: dict[str, str] = field(repr=False, default_factory=dict)

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client, e.g. ``run("scontrol", "show", "topology")``."""
        cmd, *rest = args
        return subprocess.run(
            [str(self.bin / cmd), *rest],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            env={**os.environ, **self.env},
        )

    def json(self, *args: str, timeout: float = 30) -> Any:
        """Run a client with ``--json`` and parse its answer."""
        return json.loads(self.run(*args, "--json", timeout=timeout).stdout)

    def token(self, lifespan: int = 1800) -> str:
        """A JWT for slurmrestd (header ``X-SLURM-USER-TOKEN``, with ``X-SLURM-USER-NAME: root``)."""
        out = self.run("scontrol", "token", "username=root", f"lifespan={lifespan}").stdout.strip()
        return out.split("=", 1)[1]

    def node_states(self) -> dict[str, str]:
        """{node: sinfo's compact state}, e.g. ``idle``, ``alloc``, ``drain``, ``down*``."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return dict(line.split(None, 1) for line in out.splitlines() if " " in line)

    def job(self, job_id: int | str) -> dict[str, Any]:
        """``scontrol show job <id> --json``'s job (its ``job_state`` is a list)."""
        return self.json("scontrol", "show", "job", str(job_id))["jobs"][0]

    def wait_for(self, predicate, timeout: float = 20, interval: float = 0.1, what: str = "condition"):
        """Poll ``predicate()`` until it returns something truthy; return that, or fail."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s waiting for {what}")
            time.sleep(interval)

    def wait_job_state(
        self, job_id: int | str, *states: str, timeout: float = 20, exact: bool = False
    ) -> dict[str, Any]:
        """Wait until the job's state list includes one of ``states`` (e.g. "RUNNING"); return the job.

        With ``exact``, the list must be just that one state: after ``requeuehold`` the job is first
        ``['PENDING', 'COMPLETING']``, and an update made before COMPLETING is gone is overwritten
        by the requeue (the job then waits ~121 s in BeginTime).
        """

        def reached():
            job = self.job(job_id)
            if exact:
                return job if job["job_state"] in ([s] for s in states) else None
            return job if set(job["job_state"]) & set(states) else None

        return self.wait_for(reached, timeout=timeout, what=f"job {job_id} in {states}")

    def reset(self, timeout: float = 30) -> None:
        """Cancel all jobs, resume every node that is not idle, and wait until all nodes are idle."""
        ids = self.run("squeue", "-h", "-o", "%i").stdout.split()
        if ids:
            self.run("scancel", *ids, check=False)
        self.start_slurmctld()  # in case a test stopped it

        def all_idle():
            states = self.node_states()
            stuck = [n for n, s in states.items() if any(w in s for w in ("drain", "down", "fail", "drng"))]
            if stuck:
                self.run("scontrol", "update", f"NodeName={','.join(stuck)}", "State=RESUME", check=False)
            return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())

        self.wait_for(all_idle, timeout=timeout, interval=0.2, what="all nodes idle")
        # Job output files are appended to (sbatch --open-mode=append), and a
        # cluster started afresh numbers its jobs from 1 again, as the test
        # database numbers Rackwise's: an earlier run's file must not be read
        # as this run's job's.
        for old in self.jobs_dir.glob("rackwise-*.out"):
            old.unlink(missing_ok=True)

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``scripts/slurm-cluster`` against this cluster (its dir and port base)."""
        return subprocess.run(
            [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=self.script_env
        )

    def stop_slurmctld(self) -> None:
        """Stop only slurmctld (fault tests). The slurmds and the saved state stay."""
        self.script("stop-slurmctld").check_returncode()

    def start_slurmctld(self) -> None:
        """Start slurmctld again (no-op when it runs), recovering its saved jobs and nodes."""
        r = self.script("start-slurmctld")
        if r.returncode:
            pytest.fail(f"start-slurmctld failed: {r.stderr.strip()}")


def _free_base(n_nodes: int) -> int:
    """The first port base whose ports are all free (26900, 27000, ... 27700).

    These bases stay clear of a default user cluster (26800: 26817-26820 and 27800 onwards).
    """
    if os.environ.get("RACKWISE_SLURM_TEST_PORT_BASE"):
        return int(os.environ["RACKWISE_SLURM_TEST_PORT_BASE"])
    for base in range(26900, 27800, 100):
        ports = [base + 17, base + 18, base + 20, *range(base + 1000, base + 1000 + n_nodes)]
        if not any(_busy(p) for p in ports):
            return base
    pytest.fail("no free port base for the test Slurm cluster in 26900..27700")


def _busy(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    run_dir = Path(os.environ.get("RACKWISE_SLURM_TEST_DIR") or REPO / "var/slurm/test-run")
    env = {**os.environ, "RACKWISE_SLURM_DIR": str(run_dir)}
    env.pop("RACKWISE_SLURM_PARTITION", None)
    # A leftover of a crashed session would hold ports: start from nothing.
    subprocess.run([str(SCRIPT), "stop"], capture_output=True, text=True, env=env, timeout=60)
    env["RACKWISE_SLURM_PORT_BASE"] = str(_free_base(RACKS * NODES_PER_RACK))
    t0 = time.monotonic()
    r = subprocess.run(
        [
            str(SCRIPT),
            "start",
            "--racks",
            str(RACKS),
            "--nodes-per-rack",
            str(NODES_PER_RACK),
            "--gpus-per-node",
            str(GPUS_PER_NODE),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if r.returncode:
        pytest.fail(f"scripts/slurm-cluster start failed:\n{r.stderr}", pytrace=False)
    print(f"\nslurm test cluster up in {time.monotonic() - t0:.1f} s ({run_dir})")
    exported = dict(w.split("=", 1) for w in r.stdout.strip().splitlines()[-1].split()[1:])
    cluster = SlurmCluster(
        bin=Path(exported["RACKWISE_SLURM_BIN"]),
        root=Path(exported["RACKWISE_SLURM_ROOT"]),
        jobs_dir=Path(exported["RACKWISE_SLURM_JOBS_DIR"]),
        jobs_dir_in_cluster=exported["RACKWISE_SLURM_JOBS_DIR_IN_CLUSTER"],
        env=exported,
        partition=exported["RACKWISE_SLURM_PARTITION"],
        nodes=[f"r{r:02d}n{n:02d}" for r in range(1, RACKS + 1) for n in range(1, NODES_PER_RACK + 1)],
        rest_url=exported["RACKWISE_SLURM_REST_URL"],
        dir=run_dir,
        port_base=int(env["RACKWISE_SLURM_PORT_BASE"]),
        script_env=env,
    )
    try:
        yield cluster
    finally:
        if os.environ.get("RACKWISE_SLURM_TEST_KEEP") != "1":  # 1: leave it up to look at afterwards
            subprocess.run([str(SCRIPT), "stop"], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def slurm_env(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with its exported variables also set in ``os.environ`` for this test."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    return slurm_cluster
