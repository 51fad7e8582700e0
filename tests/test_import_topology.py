"""Topology import: `manage.py import_topology` from Kubernetes node lists (file
and live API) and Slurm block topology files, on realistic files in tests/data/
and on malformed ones."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from django.core.management import CommandError, call_command

from fleet.choices import JobState, NodeState, RackKind
from fleet.models import GPU, AuditEvent, Job, Node, Rack
from fleet.services.jobs.allocations import apply_placement, start_job
from fleet.services.jobs.submit import JobSpec, submit_job
from fleet.topology import kubernetes
from fleet.topology.model import TopologyError

DATA = Path(__file__).resolve().parent / "data"
ROOT = DATA.parent.parent
R1 = "5b3e2c1a-8f4d-4e6b-9a7c-1d2e3f405a61"  # ClusterUUIDs of the four GB200 racks
R2 = "7c9d1e2f-0a3b-4c5d-8e6f-2a3b4c5d6e72"
R4 = "b1c2d3e4-f5a6-4b7c-8d9e-4c5d6e7f8094"


def run(*args: str) -> str:
    out = StringIO()
    call_command("import_topology", *args, stdout=out)
    return out.getvalue()


def k8s(name: str = "k8s_gb200_nodes.json") -> dict:
    return json.loads((DATA / name).read_text())


def write(tmp_path: Path, doc: dict, name: str = "nodes.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def item(doc: dict, name: str) -> dict:
    return next(i for i in doc["items"] if i["metadata"]["name"] == name)


def state(hostname: str) -> str:
    return Node.objects.get(hostname=hostname).state


def run_job_on(submitter, hostnames: list[str]) -> Job:
    job = submit_job(
        submitter,
        JobSpec(
            name="train", num_nodes=len(hostnames), gpus_per_node=4, tenant="llm", expected_duration_s=10**6
        ),
    )
    nodes = Node.objects.filter(hostname__in=hostnames)
    apply_placement(None, job.pk, {n.pk: [0, 1, 2, 3] for n in nodes}, reason="test setup")
    return start_job(None, job.pk)


# --- Kubernetes: kubectl get nodes -o json ---------------------------------------------


def test_a_gb200_cluster_imports_as_one_nvl72_rack_per_nvlink_clique(db):
    output = run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))

    assert Rack.objects.count() == 4
    rack = Rack.objects.get(external_id=R1)
    assert (rack.kind, rack.nodes_per_domain, rack.gpus_per_node, rack.spare_nodes) == (
        RackKind.NVL72,
        18,
        4,
        2,
    )
    hosts = list(rack.nodes.order_by("slot").values_list("hostname", flat=True))
    assert hosts == [f"gb200-r1-n{i:02d}" for i in range(1, 19)]
    assert GPU.objects.count() == 4 * 18 * 4
    assert "racks added (4):" in output
    assert "nodes added (72):" in output
    # Control-plane nodes have no GPUs: skipped, and said so.
    assert not Node.objects.filter(hostname__startswith="cp-").exists()
    assert "cp-1: no nvidia.com/gpu capacity" in output


def test_notready_nodes_import_failed_and_cordoned_or_tainted_nodes_draining(db):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))

    for host in ("gb200-r2-n07", "gb200-r3-n12", "gb200-r4-n03"):
        assert state(host) == NodeState.FAILED, host
    assert "NodeStatusUnknown" in Node.objects.get(hostname="gb200-r2-n07").state_reason
    # Cordoned or tainted, without jobs: drained at once.
    for host in ("gb200-r1-n05", "gb200-r3-n01", "gb200-r4-n16"):
        assert state(host) == NodeState.DRAINED, host
    assert "gpu-health=xid-79:NoExecute" in Node.objects.get(hostname="gb200-r4-n16").state_reason
    # Every GPU node carries the GPU operator's nvidia.com/gpu taint; it drains nothing.
    assert Node.objects.filter(state=NodeState.HEALTHY).count() == 72 - 6
    # The changes went through the node services: audited like an operator's.
    assert AuditEvent.objects.filter(action="node.fail").count() == 3
    assert AuditEvent.objects.filter(action="node.drain").count() == 3


def test_reimporting_the_same_file_changes_nothing(db):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    versions = dict(Rack.objects.values_list("name", "version"))
    audits = AuditEvent.objects.count()

    output = run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))

    assert output.strip().endswith("no changes")
    assert dict(Rack.objects.values_list("name", "version")) == versions
    assert AuditEvent.objects.count() == audits


def test_a_dry_run_shows_the_changes_and_writes_nothing(db):
    output = run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"), "--dry-run")

    assert "racks added (4):" in output
    assert "gb200-r2-n07 in " in output and "(failed)" in output
    assert "dry run: nothing written" in output
    assert Rack.objects.count() == 0 and Node.objects.count() == 0 and AuditEvent.objects.count() == 0


def test_a_mixed_fleet_imports_hgx_nodes_as_single_node_domains(db):
    output = run("--from", "kubernetes", str(DATA / "k8s_mixed_nodes.json"))

    assert Rack.objects.filter(kind=RackKind.NVL72).count() == 2
    hgx = Rack.objects.get(name="hgx-b200-01")
    assert (hgx.kind, hgx.nodes_per_domain, hgx.gpus_per_node, hgx.spare_nodes) == (RackKind.HGX8, 1, 8, 0)
    assert Rack.objects.filter(kind=RackKind.HGX8).count() == 6
    assert state("hgx-b200-04") == NodeState.DRAINED
    assert "cpu-pool-01: no nvidia.com/gpu capacity" in output


def test_the_rack_label_option_keys_racks_by_a_provider_label(db):
    run(
        "--from",
        "kubernetes",
        str(DATA / "k8s_mixed_nodes.json"),
        "--rack-label",
        "ds.coreweave.com/nvlink.domain",
    )

    rack = Rack.objects.get(external_id="us-east-04a-nvl-001")
    assert rack.name == "us-east-04a-nvl-001"
    assert rack.nodes.count() == 18
    assert Rack.objects.count() == 2 + 6


def test_a_reimport_shows_racks_and_nodes_added_removed_and_state_changes(db, tmp_path):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    doc = k8s()
    item(doc, "gb200-r2-n07")["status"]["conditions"][-1].update(status="True", reason="KubeletReady")
    item(doc, "gb200-r2-n07")["spec"]["taints"] = []
    item(doc, "gb200-r1-n10")["status"]["conditions"][-1].update(status="False", reason="KubeletNotReady")
    doc["items"] = [i for i in doc["items"] if not i["metadata"]["name"].startswith("gb200-r4-")]
    rack5 = copy.deepcopy([i for i in k8s()["items"] if i["metadata"]["name"].startswith("gb200-r4-")])
    for node in rack5:
        node["metadata"]["name"] = node["metadata"]["name"].replace("r4", "r5")
        node["metadata"]["labels"]["nvidia.com/gpu.clique"] = "d00dfeed-0000-4000-8000-000000000005.1"
        node["status"]["conditions"][-1].update(status="True")
    doc["items"] += rack5

    output = run("--from", "kubernetes", write(tmp_path, doc))

    assert "racks added (1):" in output and "d00dfeed-0000-4000-8000-000000000005" in output
    assert "racks removed (1):\n  gb200-r4" in output
    assert "nodes removed (never ran a job) (18):" in output
    assert "gb200-r2-n07: failed -> healthy" in output
    assert "gb200-r1-n10: healthy -> failed (NotReady (KubeletNotReady)" in output
    assert state("gb200-r2-n07") == NodeState.HEALTHY
    assert state("gb200-r1-n10") == NodeState.FAILED
    assert not Rack.objects.filter(external_id=R4).exists()
    assert not Node.objects.filter(hostname__startswith="gb200-r4-").exists()
    assert Rack.objects.get(external_id="d00dfeed-0000-4000-8000-000000000005").nodes.count() == 18


def test_a_node_that_ran_jobs_and_vanished_is_retired_not_deleted(db, submitter, tmp_path):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    job = run_job_on(submitter, ["gb200-r1-n01", "gb200-r1-n02"])
    doc = k8s()
    doc["items"] = [i for i in doc["items"] if i["metadata"]["name"] not in ("gb200-r1-n02", "gb200-r1-n03")]

    output = run("--from", "kubernetes", write(tmp_path, doc))

    retired = Node.objects.get(hostname="gb200-r1-n02")
    assert retired.state == NodeState.FAILED
    assert retired.state_reason == "absent from kubernetes import"
    assert "gb200-r1-n02 in " in output and ": healthy -> failed" in output
    assert not Node.objects.filter(hostname="gb200-r1-n03").exists()  # never ran a job
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING  # the node service interrupted it
    rack = Rack.objects.get(external_id=R1)
    assert rack.nodes.count() == 17
    assert list(rack.nodes.order_by("slot").values_list("hostname", flat=True))[-1] == "gb200-r1-n02"
    # Importing the same source again: the retired node stays as it is.
    assert run("--from", "kubernetes", write(tmp_path, doc)).strip().endswith("no changes")


def test_a_busy_node_that_goes_notready_interrupts_its_job(db, submitter, tmp_path):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    job = run_job_on(submitter, ["gb200-r1-n01", "gb200-r1-n02"])
    doc = k8s()
    item(doc, "gb200-r1-n01")["status"]["conditions"][-1].update(status="Unknown", reason="NodeStatusUnknown")
    item(doc, "gb200-r1-n02")["spec"]["unschedulable"] = True

    run("--from", "kubernetes", write(tmp_path, doc))

    assert state("gb200-r1-n01") == NodeState.FAILED
    assert state("gb200-r1-n02") == NodeState.DRAINING  # its job is still there
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING


def test_a_clique_rack_is_named_after_its_hostnames_and_matched_by_its_uuid(db, tmp_path):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    Rack.objects.filter(external_id=R2).update(name="row-b-rack-7")  # an operator's rename

    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))

    assert Rack.objects.get(external_id=R1).name == "gb200-r1"
    assert Rack.objects.get(external_id=R2).name == "row-b-rack-7"
    assert Rack.objects.count() == 4


def test_a_derived_name_taken_by_another_domain_falls_back_to_the_uuid(db, tmp_path):
    Rack.objects.create(name="gb200-r1", external_id="block-r1", nodes_per_domain=18)

    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))

    assert Rack.objects.get(external_id=R1).name == R1
    assert Rack.objects.get(external_id=R4).name == "gb200-r4"


def test_a_node_that_changes_rack_moves_with_its_gpus(db, tmp_path):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    doc = k8s()
    item(doc, "gb200-r1-n18")["metadata"]["labels"]["nvidia.com/gpu.clique"] = f"{R2}.32766"

    output = run("--from", "kubernetes", write(tmp_path, doc))

    node = Node.objects.get(hostname="gb200-r1-n18")
    assert node.rack.external_id == R2
    assert node.slot == 0  # slots follow natural hostname order: r1-n18 before r2-n01
    assert "gb200-r1-n18: gb200-r1 -> gb200-r2" in output
    r1, r2 = Rack.objects.get(external_id=R1), Rack.objects.get(external_id=R2)
    assert (r1.nodes_per_domain, r1.kind) == (17, RackKind.CUSTOM)
    assert (r2.nodes_per_domain, r2.kind) == (19, RackKind.CUSTOM)
    assert sorted(r2.nodes.values_list("slot", flat=True)) == list(range(19))


def test_a_busy_node_that_changes_rack_fails_first_so_its_job_recovers(db, submitter, tmp_path):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    job = run_job_on(submitter, ["gb200-r1-n01", "gb200-r1-n02"])
    doc = k8s()
    item(doc, "gb200-r1-n01")["metadata"]["labels"]["nvidia.com/gpu.clique"] = f"{R2}.32766"

    output = run("--from", "kubernetes", write(tmp_path, doc))

    node = Node.objects.get(hostname="gb200-r1-n01")
    assert (node.rack.external_id, node.state) == (R2, NodeState.FAILED)
    assert "held jobs: marked failed" in output
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING
    # The next import finds it failed in a source that calls it Ready: back to service.
    assert "gb200-r1-n01: failed -> healthy" in run("--from", "kubernetes", write(tmp_path, doc))


def test_nothing_is_half_imported_when_a_late_step_is_refused(db, submitter, tmp_path):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    run_job_on(submitter, ["gb200-r1-n01"])
    doc = k8s()
    for node in doc["items"]:
        if node["metadata"]["name"].startswith("gb200-r1-"):
            node["status"]["capacity"]["nvidia.com/gpu"] = "2"  # GPUs 2-3 of n01 have held a job
    doc["items"] = [i for i in doc["items"] if not i["metadata"]["name"].startswith("gb200-r4-")]
    racks, nodes, gpus = Rack.objects.count(), Node.objects.count(), GPU.objects.count()

    with pytest.raises(CommandError, match="gb200-r1-n01 would lose GPUs 2-3"):
        run("--from", "kubernetes", write(tmp_path, doc))

    assert (Rack.objects.count(), Node.objects.count(), GPU.objects.count()) == (racks, nodes, gpus)
    assert Rack.objects.filter(external_id=R4).exists()


def test_the_json_report_lists_the_changes(db):
    report = json.loads(run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"), "--json"))

    assert report["changed"] is True
    assert len(report["racks_added"]) == 4
    assert len(report["nodes_added"]) == 72
    assert report["source"] == "kubernetes"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "k8s_bad_gpu_capacity.json",
            "items[7].status.capacity[\"nvidia.com/gpu\"]: GPU capacity 'four' is not a whole number",
        ),
        (
            "k8s_bad_clique_label.json",
            "items[20].metadata.labels[\"nvidia.com/gpu.clique\"]: '9e1f2a3b-no-clique-id' is not",
        ),
        ("k8s_mixed_gpus_in_rack.json", "items[31]: host gb200-r2-n11 has 8 GPUs but gb200-r2-n01"),
        ("k8s_truncated.json", "k8s_truncated.json:2778: not valid JSON"),
    ],
)
def test_a_malformed_node_list_is_refused_with_its_place_and_nothing_imported(db, name, message):
    with pytest.raises(CommandError) as error:
        run("--from", "kubernetes", str(DATA / name))

    assert message in str(error.value)
    assert "\n" not in str(error.value)
    assert Rack.objects.count() == 0


@pytest.mark.parametrize("hostname", ["gb200-r1-n[01-18]", "gb200-r1-n01,gb200-r1-n02", "-n01"])
def test_a_node_named_in_slurm_hostlist_syntax_is_refused_not_imported(db, tmp_path, hostname):
    """Such a name was imported, then broke export_slurm_topology and the job's
    Slurm export (#28 item 16)."""
    doc = k8s()
    doc["items"][0]["metadata"]["name"] = hostname

    with pytest.raises(CommandError) as error:
        run("--from", "kubernetes", write(tmp_path, doc))

    assert f"items[0].metadata.name: node name {hostname!r} is not a host name" in str(error.value)
    assert Rack.objects.count() == 0


def test_the_command_exits_non_zero_with_one_line_on_a_bad_file():
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "import_topology",
            "--from",
            "kubernetes",
            str(DATA / "k8s_bad_gpu_capacity.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "items[7].status.capacity" in lines[0], result.stderr


# --- Kubernetes: the live API ----------------------------------------------------------


class _NodesApi(BaseHTTPRequestHandler):
    """A Kubernetes API server that knows one thing: GET /api/v1/nodes, in pages."""

    pages: list[dict] = []
    status = 200
    seen: list[str] = []

    def do_GET(self) -> None:
        url = urlparse(self.path)
        type(self).seen.append(self.path)
        if url.path != "/api/v1/nodes":
            self.send_error(404)
            return
        if type(self).status != 200:
            body = {
                "kind": "Status",
                "status": "Failure",
                "reason": "Forbidden",
                "code": type(self).status,
                "message": 'nodes is forbidden: User "system:anonymous" cannot list resource "nodes"',
            }
        else:
            token = parse_qs(url.query).get("continue", ["0"])[0]
            body = type(self).pages[int(token)]
        data = json.dumps(body).encode()
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def api_server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving the GB200 node list in two pages,
    and a kubeconfig pointing at it."""
    items = k8s()["items"]
    half = len(items) // 2
    handler = type(
        "Handler",
        (_NodesApi,),
        {
            "pages": [
                {
                    "apiVersion": "v1",
                    "kind": "NodeList",
                    "metadata": {"continue": "1"},
                    "items": items[:half],
                },
                {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items[half:]},
            ],
            "seen": [],
        },
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: gb200
  cluster:
    server: http://127.0.0.1:{server.server_port}
contexts:
- name: gb200-admin
  context: {{cluster: gb200, user: admin}}
- name: other
  context: {{cluster: gb200, user: admin}}
current-context: other
users:
- name: admin
  user: {{token: test-token}}
"""
    )
    yield handler, str(kubeconfig)
    server.shutdown()
    server.server_close()


def test_the_kubernetes_api_import_reads_every_page_of_nodes(db, api_server):
    handler, kubeconfig = api_server

    output = run("--from", "kubernetes-api", "--kubeconfig", kubeconfig, "--context", "gb200-admin")

    assert Rack.objects.count() == 4 and Node.objects.count() == 72
    assert state("gb200-r2-n07") == NodeState.FAILED
    assert output.startswith("kubernetes-api import:")
    assert [p.split("?")[0] for p in handler.seen] == ["/api/v1/nodes", "/api/v1/nodes"]
    assert "continue=1" in handler.seen[1]


def test_the_kubernetes_api_import_fails_in_one_line_when_the_server_refuses(db, api_server):
    handler, kubeconfig = api_server
    handler.status = 403

    with pytest.raises(CommandError, match="answered 403"):
        run("--from", "kubernetes-api", "--kubeconfig", kubeconfig)

    assert Rack.objects.count() == 0


def test_the_kubernetes_api_import_names_a_missing_kubeconfig(db, tmp_path):
    with pytest.raises(CommandError, match="cannot load the kubeconfig"):
        run("--from", "kubernetes-api", "--kubeconfig", str(tmp_path / "nope"))


# --- Slurm: topology.conf (topology/block) and scontrol show nodes --json --------------


def test_a_slurm_block_topology_imports_one_rack_per_block(db):
    output = run("--from", "slurm", str(DATA / "slurm_topology.conf"))

    assert sorted(Rack.objects.values_list("name", flat=True)) == [
        "nvl72-r1",
        "nvl72-r2",
        "nvl72-r3",
        "nvl72-r4",
    ]
    rack = Rack.objects.get(name="nvl72-r4")  # its Nodes= continue on the next line
    assert (rack.external_id, rack.kind, rack.nodes_per_domain, rack.gpus_per_node) == (
        "nvl72-r4",
        RackKind.NVL72,
        18,
        4,
    )
    assert list(rack.nodes.order_by("slot").values_list("hostname", flat=True)) == [
        f"gb200-r4-n{i:02d}" for i in range(1, 19)
    ]
    assert Node.objects.exclude(state=NodeState.HEALTHY).count() == 0  # no scontrol output: no states
    assert "racks added (4):" in output


def test_scontrol_output_gives_a_slurm_import_gpu_counts_and_node_states(db):
    output = run(
        "--from", "slurm", str(DATA / "slurm_topology.conf"), "--nodes", str(DATA / "scontrol_nodes.json")
    )

    assert state("gb200-r2-n07") == NodeState.FAILED
    assert state("gb200-r4-n03") == NodeState.FAILED
    assert state("gb200-r3-n12") == NodeState.DRAINED
    assert Node.objects.get(hostname="gb200-r3-n12").state_reason.endswith(
        "Slurm IDLE+DRAIN: XID 79 GPU fell off the bus"
    )
    # A GPU node in no block is its own NVLink domain; the login node has no GPUs.
    hgx = Rack.objects.get(name="hgx-h100-01")
    assert (hgx.kind, hgx.gpus_per_node) == (RackKind.HGX8, 8)
    assert "login-01: no gpu gres in scontrol" in output
    assert not Node.objects.filter(hostname="login-01").exists()


def test_a_slurm_reimport_with_the_same_files_changes_nothing(db):
    args = (
        "--from",
        "slurm",
        str(DATA / "slurm_topology.conf"),
        "--nodes",
        str(DATA / "scontrol_nodes.json"),
    )
    run(*args)

    assert run(*args).strip().endswith("no changes")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("slurm_bad_hostlist.conf", "slurm_bad_hostlist.conf:2: bad hostlist 'gb200-r2-n[01-18'"),
        (
            "slurm_bad_blocksizes.conf",
            "slurm_bad_blocksizes.conf:3: BlockSizes value 30 is not the base 18 times a power of two",
        ),
        (
            "slurm_small_block.conf",
            "slurm_small_block.conf:3: block nvl72-r2 has 9 nodes, "
            "fewer than the planning base block size 16",
        ),
        ("slurm_tree.conf", "slurm_tree.conf:1: SwitchName is topology/tree"),
        (
            "slurm_host_in_two_blocks.conf",
            "slurm_host_in_two_blocks.conf:2: host gb200-r1-n18 is in both nvl72-r1 and nvl72-r2",
        ),
    ],
)
def test_a_malformed_topology_conf_is_refused_with_its_line_and_nothing_imported(db, name, message):
    with pytest.raises(CommandError) as error:
        run("--from", "slurm", str(DATA / name))

    assert message in str(error.value)
    assert Rack.objects.count() == 0


def test_malformed_scontrol_output_is_refused_with_its_json_path(db):
    with pytest.raises(
        CommandError, match=r"scontrol_bad_gres.json: nodes\[30\].gres: cannot read a GPU count"
    ):
        run(
            "--from",
            "slurm",
            str(DATA / "slurm_topology.conf"),
            "--nodes",
            str(DATA / "scontrol_bad_gres.json"),
        )

    assert Rack.objects.count() == 0


def test_a_block_host_that_scontrol_does_not_list_is_an_error(db, tmp_path):
    doc = json.loads((DATA / "scontrol_nodes.json").read_text())
    doc["nodes"] = [n for n in doc["nodes"] if n["name"] != "gb200-r3-n04"]

    with pytest.raises(
        CommandError,
        match=r"slurm_topology\.conf:7: block nvl72-r3 names gb200-r3-n04, which .* does not list",
    ):
        run("--from", "slurm", str(DATA / "slurm_topology.conf"), "--nodes", write(tmp_path, doc))


def test_a_source_with_no_gpu_nodes_is_refused_rather_than_retiring_the_fleet(db, tmp_path):
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    empty = write(tmp_path, {"apiVersion": "v1", "kind": "List", "items": []})

    with pytest.raises(CommandError, match="lists no GPU nodes"):
        run("--from", "kubernetes", empty, "--dry-run")
    with pytest.raises(CommandError, match="lists no GPU nodes"):
        run("--from", "kubernetes", empty)

    assert Node.objects.filter(state=NodeState.HEALTHY).count() > 60


# --- malformed files end in one line, never a traceback (issue 10) ----------------

MALFORMED_K8S = [
    ("k8s_metadata_not_object.json", "items[5].metadata: must be an object"),
    ("k8s_labels_not_object.json", "items[6].metadata.labels: must be an object"),
    ("k8s_status_not_object.json", "items[8].status: must be an object"),
    ("k8s_spec_not_object.json", "items[9].spec: must be an object"),
    ("k8s_taints_not_list.json", "items[10].spec.taints: taints must be a list"),
    ("k8s_taint_key_not_string.json", "items[11].spec.taints[0]: a taint needs a key"),
    (
        "k8s_taint_effect_not_string.json",
        "items[11].spec.taints[0].effect: a taint's effect must be a string",
    ),
    ("k8s_long_name.json", "items[12].metadata.name: node name 'gb200-xxx"),
    ("k8s_digit_hostname.json", "items[13].metadata.name: node name '999"),
    ("k8s_name_with_newline.json", "items[14].metadata.name: node name 'gb200-r1\\nn12' has whitespace"),
    ("k8s_long_clique_label.json", 'items[15].metadata.labels["nvidia.com/gpu.clique"]: the clique label'),
    ("k8s_gpus_not_string.json", 'items[16].status.capacity["nvidia.com/gpu"]: GPU capacity [4] is not'),
    ("k8s_5000_gpus.json", 'items[17].status.capacity["nvidia.com/gpu"]: 5000 GPUs on one node'),
    ("k8s_lone_node_5000_gpus.json", "items[0].status.capacity"),
    (
        "k8s_huge_number.json",
        "k8s_huge_number.json: not valid JSON here: a number with more than 4,300 digits",
    ),
    ("k8s_not_utf8.json", "k8s_not_utf8.json:1239: not UTF-8 text: byte 0xe7"),
    ("k8s_deep.json", "k8s_deep.json: JSON nested too deeply"),
]
MALFORMED_SLURM = [
    (("slurm_long_block_name.conf",), "slurm_long_block_name.conf:2: block name 'bbb"),
    (("slurm_digit_hostname.conf",), "slurm_digit_hostname.conf:2: host name '777"),
    (("slurm_not_utf8.conf",), "slurm_not_utf8.conf:1: not UTF-8 text: byte 0xe9"),
    (("slurm_huge_blocksizes.conf",), "slurm_huge_blocksizes.conf:2: BlockSizes='111"),
    (
        ("slurm_topology.conf", "scontrol_huge_gres.json"),
        "scontrol_huge_gres.json: nodes[30].gres: GPU count",
    ),
    (
        ("slurm_topology.conf", "scontrol_5000_gpus.json"),
        "scontrol_5000_gpus.json: nodes[31].gres: 5000 GPUs",
    ),
    (("slurm_topology.conf", "scontrol_tres_not_string.json"), "nodes[32].tres: tres must be a string"),
    (("slurm_topology.conf", "scontrol_reason_not_string.json"), "nodes[33].reason: reason must be a string"),
]


def _one_line_refusal(*args: str) -> str:
    """The CommandError of an import (manage.py prints it as one line and exits 1)."""
    with pytest.raises(CommandError) as error:
        run(*args)
    message = str(error.value)
    assert "\n" not in message and len(message) < 400, message
    return message


@pytest.fixture
def imported(db) -> dict[str, tuple]:
    """The GB200 cluster, imported: a malformed file must leave it as it is."""
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    return fleet_picture()


def fleet_picture() -> dict[str, tuple]:
    return {
        n.hostname: (n.rack.name, n.slot, n.state, n.gpus.count())
        for n in Node.objects.select_related("rack").prefetch_related("gpus")
    }


@pytest.mark.parametrize(("name", "place"), MALFORMED_K8S, ids=[n for n, _ in MALFORMED_K8S])
def test_a_malformed_node_list_ends_in_one_line_naming_file_and_place_and_writes_nothing(
    imported, name, place
):
    message = _one_line_refusal("--from", "kubernetes", str(DATA / name))

    assert str(DATA / name) in message and place in message
    assert fleet_picture() == imported


@pytest.mark.parametrize(("files", "place"), MALFORMED_SLURM, ids=[f[-1] for f, _ in MALFORMED_SLURM])
def test_a_malformed_slurm_file_ends_in_one_line_naming_file_and_place_and_writes_nothing(db, files, place):
    args = ["--from", "slurm", str(DATA / files[0])]
    if len(files) > 1:
        args += ["--nodes", str(DATA / files[1])]

    message = _one_line_refusal(*args)

    assert str(DATA / files[-1]) in message and place in message
    assert Rack.objects.count() == 0


def test_the_command_exits_non_zero_with_one_line_on_a_100k_deep_file():
    result = subprocess.run(
        [sys.executable, "manage.py", "import_topology", "--from", "kubernetes", str(DATA / "k8s_deep.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_deep_file_is_refused_after_its_first_small_read(monkeypatch):
    # ijson's C backend does work that grows with the square of the nesting inside
    # one read: with its 64 KiB reads this file took 43 s to refuse (0.03 s in 4 KiB).
    reads: list[int] = []

    class Counting:
        def __init__(self, path, mode):
            self.f = open(path, mode)

        def read(self, n=-1):
            data = self.f.read(n)
            reads.append(len(data))
            return data

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(kubernetes, "open", Counting, raising=False)

    with pytest.raises(TopologyError, match="nested too deeply"):
        list(kubernetes.stream_items(DATA / "k8s_deep.json"))

    assert reads and max(reads) <= 4096


def test_the_gpus_per_node_bound_is_a_setting(db, tmp_path, settings):
    settings.RACKWISE_TOPOLOGY_MAX_GPUS_PER_NODE = 16
    doc = k8s()
    for i in doc["items"]:
        if i["status"]["capacity"].get("nvidia.com/gpu"):
            i["status"]["capacity"]["nvidia.com/gpu"] = "16"

    run("--from", "kubernetes", write(tmp_path, doc))

    assert set(Rack.objects.values_list("gpus_per_node", flat=True)) == {16}
    assert "--gpus-per-node must be from 1 to 16" in _one_line_refusal(
        "--from", "slurm", str(DATA / "slurm_topology.conf"), "--gpus-per-node", "17"
    )


def test_the_name_limits_match_the_columns_they_are_written_to():
    from fleet.topology import model

    assert model.MAX_HOSTNAME == Node._meta.get_field("hostname").max_length
    assert model.MAX_RACK_NAME == Rack._meta.get_field("name").max_length
    assert model.MAX_EXTERNAL_ID == Rack._meta.get_field("external_id").max_length


# --- an import that would empty most of the fleet needs --allow-shrink ------------


def test_an_import_that_would_remove_most_of_the_fleet_is_refused_without_allow_shrink(imported):
    for extra in ([], ["--dry-run"]):
        message = _one_line_refusal("--from", "kubernetes", str(DATA / "k8s_one_rack.json"), *extra)
        assert "would remove or retire 54 of the fleet's 72 nodes (75%)" in message
        assert "--allow-shrink" in message
    assert fleet_picture() == imported


def test_allow_shrink_lets_a_real_decommission_through(imported):
    out = run("--from", "kubernetes", str(DATA / "k8s_one_rack.json"), "--allow-shrink")

    assert "nodes removed (never ran a job) (54)" in out
    assert Node.objects.count() == 18


def test_a_small_change_needs_no_flag(imported, tmp_path, settings):
    settings.RACKWISE_TOPOLOGY_MAX_SHRINK = 0.25
    doc = k8s()
    doc["items"] = doc["items"][:-18]  # one rack of four: 25%, at the limit

    assert "nodes removed (never ran a job) (18)" in run("--from", "kubernetes", write(tmp_path, doc))


def test_a_busy_node_gone_notready_with_a_long_message_imports_failed(db, submitter, tmp_path):
    """#28 item 15: a long NotReady message crashed the import (the job's
    derived reason overflowed its column), so a cron import stopped syncing."""
    run("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))
    job = run_job_on(submitter, ["gb200-r1-n01"])
    doc = k8s()
    item(doc, "gb200-r1-n01")["status"]["conditions"][-1].update(
        status="False", reason="KubeletNotReady", message="container runtime network not ready: " + "x" * 900
    )

    run("--from", "kubernetes", write(tmp_path, doc))

    assert state("gb200-r1-n01") == NodeState.FAILED
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING and len(job.state_reason) == 500


def test_a_node_list_file_is_read_one_node_at_a_time(tmp_path):
    """import_topology read the whole file into memory (#28 item 16): a 20 MB
    list peaked at 47 MB. It is streamed now, with the same result."""
    import tracemalloc

    k8s_doc = k8s()
    items = []
    for copy_no in range(30):
        for item in k8s_doc["items"][:18]:
            node = copy.deepcopy(item)
            node["metadata"]["name"] = f"copy{copy_no:02d}-{node['metadata']['name']}"
            labels = node["metadata"].setdefault("labels", {})
            if "nvidia.com/gpu.clique" in labels:
                labels["nvidia.com/gpu.clique"] = (
                    labels["nvidia.com/gpu.clique"].split(".")[0] + f".{copy_no}"
                )
            node["metadata"].setdefault("annotations", {})["padding"] = "y" * 15000
            items.append(node)
    doc = {"kind": "NodeList", "items": items}
    path = write(tmp_path, doc)
    size = Path(path).stat().st_size
    del doc, items

    tracemalloc.start()
    streamed = kubernetes.parse_items(kubernetes.stream_items(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    assert peak < size / 5, f"peak {peak:,} bytes for a {size:,}-byte file"
    assert streamed == kubernetes.parse_nodes(kubernetes.load_json(path))
