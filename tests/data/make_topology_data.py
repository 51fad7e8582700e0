"""Write the topology import fixtures in this folder (run once; the files are
committed): realistic `kubectl get nodes -o json` and `scontrol show nodes --json`
output for GB200 NVL72 racks, a mixed fleet with HGX nodes, a Slurm block
topology.conf, and malformed variants.

    python tests/data/make_topology_data.py
"""

from __future__ import annotations

import copy
import json
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
CREATED = "2026-09-14T08:12:31Z"
HEARTBEAT = "2026-11-30T09:40:02Z"

# ClusterUUIDs of four NVL72 racks (as GPU Feature Discovery reports them).
GB200_CLUSTERS = [
    "5b3e2c1a-8f4d-4e6b-9a7c-1d2e3f405a61",
    "7c9d1e2f-0a3b-4c5d-8e6f-2a3b4c5d6e72",
    "9e1f2a3b-4c5d-4e6f-a071-3b4c5d6e7f83",
    "b1c2d3e4-f5a6-4b7c-8d9e-4c5d6e7f8094",
]
CLIQUE_ID = "32766"


def _conditions(
    ready: str = "True", reason: str = "KubeletReady", message: str = "kubelet is posting ready status"
) -> list:
    def cond(kind: str, status: str, why: str, msg: str) -> dict:
        return {
            "type": kind,
            "status": status,
            "lastHeartbeatTime": HEARTBEAT,
            "lastTransitionTime": CREATED,
            "reason": why,
            "message": msg,
        }

    unknown = ready == "Unknown"
    pressure = "Unknown" if unknown else "False"
    stale = "NodeStatusUnknown" if unknown else None
    return [
        cond(
            "MemoryPressure",
            pressure,
            stale or "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        cond("DiskPressure", pressure, stale or "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        cond(
            "PIDPressure",
            pressure,
            stale or "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        cond("Ready", ready, reason, message),
    ]


def k8s_node(
    name: str,
    ip: str,
    *,
    gpus: int,
    arch: str = "arm64",
    product: str = "NVIDIA-GB200",
    instance: str = "gb200-4g.nvl72",
    labels: dict | None = None,
    taints: list | None = None,
    unschedulable: bool = False,
    conditions: list | None = None,
) -> dict:
    cpu, memory = ("144", "905463812Ki") if arch == "arm64" else ("224", "2113402300Ki")
    all_labels = {
        "beta.kubernetes.io/arch": arch,
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": instance,
        "topology.kubernetes.io/region": "us-east-04",
        "topology.kubernetes.io/zone": "us-east-04a",
    }
    if gpus:
        all_labels |= {
            "feature.node.kubernetes.io/pci-10de.present": "true",
            "nvidia.com/cuda.driver-version.full": "570.148.08",
            "nvidia.com/cuda.driver.major": "570",
            "nvidia.com/cuda.runtime-version.full": "12.8",
            "nvidia.com/gfd.timestamp": "1764495602",
            "nvidia.com/gpu-driver-upgrade-state": "upgrade-done",
            "nvidia.com/gpu.compute.major": "10",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.deploy.container-toolkit": "true",
            "nvidia.com/gpu.deploy.dcgm-exporter": "true",
            "nvidia.com/gpu.deploy.device-plugin": "true",
            "nvidia.com/gpu.deploy.driver": "true",
            "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
            "nvidia.com/gpu.family": "blackwell",
            "nvidia.com/gpu.machine": "GB200-NVL" if arch == "arm64" else "DGX-B200",
            "nvidia.com/gpu.memory": "189471" if arch == "arm64" else "183359",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/mig.capable": "true",
        }
    all_labels |= labels or {}
    capacity = {
        "cpu": cpu,
        "ephemeral-storage": "3750619472Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "hugepages-32Mi": "0",
        "hugepages-64Ki": "0",
        "memory": memory,
        "pods": "110",
    }
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    allocatable = dict(capacity, cpu=str(int(cpu) - 2), memory=str(int(memory[:-2]) - 8388608) + "Ki")
    spec: dict = {"podCIDR": f"10.244.{int(ip.split('.')[-1])}.0/24", "providerID": f"rackwise://{name}"}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "nvidia.com/gpu-driver-upgrade-enabled": "true",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "creationTimestamp": CREATED,
            "labels": all_labels,
            "name": name,
            "resourceVersion": str(48_000_000 + int(ip.split(".")[-1]) * 17),
            "uid": f"6f1d{zlib.crc32(name.encode()) % 10**8:08d}-3c2b-4a1e-9f0d-"
            f"{int(ip.split('.')[-1]):012d}",
        },
        "spec": spec,
        "status": {
            "addresses": [{"address": ip, "type": "InternalIP"}, {"address": name, "type": "Hostname"}],
            "allocatable": allocatable,
            "capacity": capacity,
            "conditions": conditions or _conditions(),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": arch,
                "bootID": f"c0ffee{int(ip.split('.')[-1]):02d}-0000-4000-8000-000000000000",
                "containerRuntimeVersion": "containerd://1.7.27",
                "kernelVersion": "6.8.0-1028-nvidia-64k" if arch == "arm64" else "6.8.0-1028-nvidia",
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.32.6",
                "machineID": f"{zlib.crc32((name + 'm').encode()):032d}",
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04.2 LTS",
                "systemUUID": f"{zlib.crc32((name + 's').encode()):032d}",
            },
        },
    }


GPU_TAINT = {"effect": "NoSchedule", "key": "nvidia.com/gpu", "value": "present"}


def control_plane(i: int) -> dict:
    return k8s_node(
        f"cp-{i}",
        f"10.40.0.{10 + i}",
        gpus=0,
        arch="amd64",
        instance="cpu-16c",
        labels={"node-role.kubernetes.io/control-plane": ""},
        taints=[{"effect": "NoSchedule", "key": "node-role.kubernetes.io/control-plane"}],
    )


def gb200_rack(
    rack: int, *, label: str = "nvidia.com/gpu.clique", value: str | None = None, prefix: str = "gb200"
) -> list:
    nodes = []
    for n in range(1, 19):
        name = f"{prefix}-r{rack}-n{n:02d}"
        domain = value or f"{GB200_CLUSTERS[rack - 1]}.{CLIQUE_ID}"
        labels = {label: domain}
        if label != "nvidia.com/gpu.clique":
            labels["nvidia.com/gpu.clique"] = f"{GB200_CLUSTERS[rack - 1]}.{CLIQUE_ID}"
        nodes.append(k8s_node(name, f"10.41.{rack}.{n}", gpus=4, labels=labels, taints=[GPU_TAINT]))
    return nodes


def node_list(items: list) -> dict:
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


def by_name(items: list, name: str) -> dict:
    return next(i for i in items if i["metadata"]["name"] == name)


def gb200_cluster() -> dict:
    """4 NVL72 racks; r2-n07 and r4-n03 unreachable, r3-n12 NotReady, r1-n05 and
    r3-n01 cordoned, r4-n16 tainted by a GPU health check; 3 control-plane nodes."""
    items = [control_plane(i) for i in (1, 2, 3)]
    for rack in range(1, 5):
        items += gb200_rack(rack)
    unreachable = [
        {"effect": "NoSchedule", "key": "node.kubernetes.io/unreachable", "timeAdded": HEARTBEAT},
        {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "timeAdded": HEARTBEAT},
    ]
    for name in ("gb200-r2-n07", "gb200-r4-n03"):
        node = by_name(items, name)
        node["status"]["conditions"] = _conditions(
            "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status."
        )
        node["spec"]["taints"] = [GPU_TAINT, *unreachable]
    node = by_name(items, "gb200-r3-n12")
    node["status"]["conditions"] = _conditions(
        "False",
        "KubeletNotReady",
        "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady",
    )
    node["spec"]["taints"] = [
        GPU_TAINT,
        {"effect": "NoSchedule", "key": "node.kubernetes.io/not-ready", "timeAdded": HEARTBEAT},
    ]
    for name in ("gb200-r1-n05", "gb200-r3-n01"):
        node = by_name(items, name)
        node["spec"]["unschedulable"] = True
        node["spec"]["taints"] = [
            GPU_TAINT,
            {"effect": "NoSchedule", "key": "node.kubernetes.io/unschedulable", "timeAdded": HEARTBEAT},
        ]
    node = by_name(items, "gb200-r4-n16")
    node["spec"]["taints"] = [
        GPU_TAINT,
        {"effect": "NoExecute", "key": "nvidia.com/gpu-health", "value": "xid-79"},
    ]
    return node_list(items)


def mixed_fleet() -> dict:
    """2 NVL72 racks (with a provider rack label too), 6 HGX B200 nodes (8 GPUs,
    no clique label), one CPU node."""
    items = []
    for rack, domain in ((1, "us-east-04a-nvl-001"), (2, "us-east-04a-nvl-002")):
        items += gb200_rack(rack, label="ds.coreweave.com/nvlink.domain", value=domain, prefix="gb200-a")
    for i in range(1, 7):
        items.append(
            k8s_node(
                f"hgx-b200-{i:02d}",
                f"10.42.0.{i}",
                gpus=8,
                arch="amd64",
                product="NVIDIA-B200",
                instance="b200-8g",
                taints=[GPU_TAINT],
            )
        )
    items.append(k8s_node("cpu-pool-01", "10.43.0.1", gpus=0, arch="amd64", instance="cpu-64c"))
    # One HGX node is cordoned for maintenance.
    node = by_name(items, "hgx-b200-04")
    node["spec"]["unschedulable"] = True
    return node_list(items)


def scontrol_node(
    name: str, *, gpus: int, state: list, reason: str = "", arch: str = "aarch64", gpu_type: str = "gb200"
) -> dict:
    cpus = 144 if arch == "aarch64" else 224
    gres = f"gpu:{gpu_type}:{gpus}(S:0-1)" if gpus else ""
    return {
        "architecture": arch,
        "burstbuffer_network_address": "",
        "boards": 1,
        "boot_time": {"set": True, "infinite": False, "number": 1764201600},
        "cluster_name": "gb200-prod",
        "cores": 72,
        "specialized_cores": 0,
        "cpu_binding": 0,
        "cpu_load": 12,
        "free_mem": {"set": True, "infinite": False, "number": 812345},
        "cpus": cpus,
        "effective_cpus": cpus,
        "specialized_cpus": "",
        "energy": {
            "average_watts": 0,
            "base_consumed_energy": 0,
            "consumed_energy": 0,
            "current_watts": {"set": False, "infinite": False, "number": 0},
        },
        "features": ["gb200", "nvl72"] if gpus == 4 else [],
        "active_features": ["gb200", "nvl72"] if gpus == 4 else [],
        "gpu_spec": "",
        "gres": gres,
        "gres_drained": "N/A",
        "gres_used": f"gpu:{gpu_type}:0(IDX:N/A)" if gpus else "",
        "instance_id": "",
        "instance_type": "",
        "last_busy": {"set": True, "infinite": False, "number": 1764495000},
        "mcs_label": "",
        "specialized_memory": 0,
        "name": name,
        "next_state_after_reboot": ["INVALID"],
        "address": name,
        "hostname": name,
        "state": state,
        "operating_system": "Linux 6.8.0-1028-nvidia-64k #31-Ubuntu SMP PREEMPT_DYNAMIC",
        "owner": "",
        "partitions": ["gb200"] if gpus == 4 else (["hgx"] if gpus else ["login"]),
        "port": 6818,
        "real_memory": 880000,
        "comment": "",
        "reason": reason,
        "reason_changed_at": {"set": True, "infinite": False, "number": 1764490000 if reason else 0},
        "reason_set_by_user": "root" if reason else "",
        "resume_after": {"set": True, "infinite": False, "number": 0},
        "reservation": "",
        "alloc_memory": 0,
        "alloc_cpus": 0,
        "alloc_idle_cpus": cpus,
        "tres_used": "",
        "tres_weighted": 0.0,
        "slurmd_start_time": {"set": True, "infinite": False, "number": 1764201700},
        "sockets": 2,
        "threads": 1,
        "temporary_disk": 0,
        "weight": 1,
        "tres": f"cpu={cpus},mem=880000M,billing={cpus}" + (f",gres/gpu={gpus}" if gpus else ""),
        "version": "25.05.2",
    }


def scontrol_nodes() -> dict:
    nodes = []
    for rack in range(1, 5):
        for n in range(1, 19):
            nodes.append(
                scontrol_node(
                    f"gb200-r{rack}-n{n:02d}", gpus=4, state=["IDLE"] if (rack + n) % 3 else ["ALLOCATED"]
                )
            )
    special = {
        "gb200-r1-n05": (["ALLOCATED", "DRAIN"], "firmware update"),
        "gb200-r2-n07": (["DOWN", "NOT_RESPONDING"], "Not responding"),
        "gb200-r3-n12": (["IDLE", "DRAIN"], "XID 79 GPU fell off the bus"),
        "gb200-r4-n03": (["DOWN"], "NHC: IB link down"),
    }
    for node in nodes:
        if node["name"] in special:
            node["state"], node["reason"] = special[node["name"]]
            node["reason_set_by_user"] = "root"
    nodes.append(scontrol_node("hgx-h100-01", gpus=8, state=["MIXED"], arch="x86_64", gpu_type="h100"))
    nodes.append(scontrol_node("login-01", gpus=0, state=["IDLE"], arch="x86_64"))
    return {
        "nodes": nodes,
        "last_update": {"set": True, "infinite": False, "number": 1764495602},
        "meta": {
            "plugin": {
                "type": "",
                "name": "",
                "data_parser": "data_parser/v0.0.43",
                "accounting_storage": "accounting_storage/slurmdbd",
            },
            "client": {"source": "/dev/pts/0", "user": "root", "group": "root"},
            "command": ["show", "nodes"],
            "slurm": {
                "version": {"major": "25", "micro": "2", "minor": "05"},
                "release": "25.05.2",
                "cluster": "gb200-prod",
            },
        },
        "errors": [],
        "warnings": [],
    }


SLURM_TOPOLOGY = """\
##################################################################
# Slurm topology for the gb200-prod cluster (TopologyPlugin=topology/block)
# One block per GB200 NVL72 rack (one NVLink domain, 18 compute trays).
##################################################################
BlockName=nvl72-r1 Nodes=gb200-r1-n[01-18]
BlockName=nvl72-r2 Nodes=gb200-r2-n[01-09],gb200-r2-n[10-18]   # split over two PDUs
blockname=nvl72-r3 nodes=gb200-r3-n[01-18]
BlockName=nvl72-r4 \\
    Nodes=gb200-r4-n[01-06,07-18]
BlockSizes=18,36,72
"""


def main() -> None:
    def dump(name: str, doc: dict) -> None:
        (HERE / name).write_text(json.dumps(doc, indent=2) + "\n")

    cluster = gb200_cluster()
    dump("k8s_gb200_nodes.json", cluster)
    dump("k8s_mixed_nodes.json", mixed_fleet())
    dump("scontrol_nodes.json", scontrol_nodes())
    (HERE / "slurm_topology.conf").write_text(SLURM_TOPOLOGY)

    # Malformed variants, each broken in one place (control plane and two racks).
    small = node_list(cluster["items"][:39])
    bad = copy.deepcopy(small)
    bad["items"][7]["status"]["capacity"]["nvidia.com/gpu"] = "four"
    dump("k8s_bad_gpu_capacity.json", bad)
    bad = copy.deepcopy(small)
    bad["items"][20]["metadata"]["labels"]["nvidia.com/gpu.clique"] = "9e1f2a3b-no-clique-id"
    dump("k8s_bad_clique_label.json", bad)
    bad = copy.deepcopy(small)
    by_name(bad["items"], "gb200-r2-n11")["status"]["capacity"]["nvidia.com/gpu"] = "8"
    dump("k8s_mixed_gpus_in_rack.json", bad)
    text = json.dumps(small, indent=2)
    (HERE / "k8s_truncated.json").write_text(text[: len(text) // 2])
    (HERE / "slurm_bad_hostlist.conf").write_text(
        "BlockName=nvl72-r1 Nodes=gb200-r1-n[01-18]\n"
        "BlockName=nvl72-r2 Nodes=gb200-r2-n[01-18\n"
        "BlockSizes=18\n"
    )
    (HERE / "slurm_bad_blocksizes.conf").write_text(
        "BlockName=nvl72-r1 Nodes=gb200-r1-n[01-18]\n"
        "BlockName=nvl72-r2 Nodes=gb200-r2-n[01-18]\n"
        "BlockSizes=18,30\n"
    )
    (HERE / "slurm_small_block.conf").write_text(
        "BlockName=nvl72-r1 Nodes=gb200-r1-n[01-18]\n"
        "# half a rack\n"
        "BlockName=nvl72-r2 Nodes=gb200-r2-n[01-09]\n"
        "BlockSizes=16,32\n"
    )
    (HERE / "slurm_tree.conf").write_text(
        "SwitchName=s0 Nodes=gb200-r1-n[01-18]\nSwitchName=s1 Switches=s0\n"
    )
    (HERE / "slurm_host_in_two_blocks.conf").write_text(
        "BlockName=nvl72-r1 Nodes=gb200-r1-n[01-18]\n"
        "BlockName=nvl72-r2 Nodes=gb200-r2-n[01-17],gb200-r1-n18\n"
        "BlockSizes=16\n"
    )
    bad_nodes = scontrol_nodes()
    bad_nodes["nodes"][30]["gres"] = "gpu:gb200:lots"
    dump("scontrol_bad_gres.json", bad_nodes)

    # Malformed in ways that once ended in a traceback (issue 10): wrong JSON
    # types, names longer than their columns, a 5,000-digit hostname, GPU counts
    # no node has, bytes that are not UTF-8, nesting 100k deep.
    def broken(name: str, change) -> None:
        doc = copy.deepcopy(small)
        change(doc["items"])
        dump(name, doc)

    broken("k8s_metadata_not_object.json", lambda items: items[5].update(metadata="gb200-r1-n03"))
    broken("k8s_labels_not_object.json", lambda items: items[6]["metadata"].update(labels=["gpu"]))
    broken("k8s_status_not_object.json", lambda items: items[8].update(status=4))
    broken("k8s_spec_not_object.json", lambda items: items[9].update(spec="unschedulable"))
    broken("k8s_taints_not_list.json", lambda items: items[10]["spec"].update(taints={"key": "x"}))
    broken(
        "k8s_taint_key_not_string.json",
        lambda items: items[11]["spec"].update(
            taints=[{"key": {"nvidia.com": "gpu"}, "effect": "NoSchedule"}]
        ),
    )
    broken(
        "k8s_taint_effect_not_string.json",
        lambda items: items[11]["spec"].update(taints=[{"key": "maintenance", "effect": ["NoSchedule"]}]),
    )
    broken("k8s_long_name.json", lambda items: items[12]["metadata"].update(name="gb200-" + "x" * 300))
    broken("k8s_digit_hostname.json", lambda items: items[13]["metadata"].update(name="9" * 5000))
    broken("k8s_name_with_newline.json", lambda items: items[14]["metadata"].update(name="gb200-r1\nn12"))
    broken(
        "k8s_long_clique_label.json",
        lambda items: items[15]["metadata"]["labels"].update({"nvidia.com/gpu.clique": "u" * 300 + ".1"}),
    )
    broken(
        "k8s_gpus_not_string.json",
        lambda items: items[16]["status"]["capacity"].update({"nvidia.com/gpu": [4]}),
    )
    broken(
        "k8s_5000_gpus.json", lambda items: items[17]["status"]["capacity"].update({"nvidia.com/gpu": "5000"})
    )
    text = json.dumps(small, indent=2)
    (HERE / "k8s_huge_number.json").write_text(
        text.replace('"nvidia.com/gpu": "4"', '"nvidia.com/gpu": ' + "4" * 5000, 1)
    )
    (HERE / "k8s_not_utf8.json").write_bytes(
        text.replace("gb200-r1-n07", "gb200-r1-n\u00e7", 1).encode("latin-1")
    )
    (HERE / "k8s_deep.json").write_text('{"items": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    # A single node reporting 5,000 GPUs, alone in its list (issue 10: it was
    # accepted, and every other node removed).
    lone = copy.deepcopy(cluster["items"][3])
    lone["status"]["capacity"]["nvidia.com/gpu"] = "5000"
    dump("k8s_lone_node_5000_gpus.json", node_list([lone]))
    # One rack of four: a valid file that would retire three quarters of the fleet.
    dump("k8s_one_rack.json", node_list(cluster["items"][:21]))
    bad_nodes = scontrol_nodes()
    bad_nodes["nodes"][30]["gres"] = "gpu:gb200:" + "9" * 5000
    dump("scontrol_huge_gres.json", bad_nodes)
    bad_nodes = scontrol_nodes()
    bad_nodes["nodes"][31]["gres"] = "gpu:gb200:5000(S:0-1)"
    dump("scontrol_5000_gpus.json", bad_nodes)
    bad_nodes = scontrol_nodes()
    bad_nodes["nodes"][32]["tres"] = {"gres/gpu": 4}
    bad_nodes["nodes"][32]["gres"] = ""
    dump("scontrol_tres_not_string.json", bad_nodes)
    bad_nodes = scontrol_nodes()
    bad_nodes["nodes"][33]["reason"] = ["maintenance"]
    bad_nodes["nodes"][33]["state"] = ["IDLE", "DRAIN"]
    dump("scontrol_reason_not_string.json", bad_nodes)
    (HERE / "slurm_long_block_name.conf").write_text(
        "BlockName=nvl72-r1 Nodes=gb200-r1-n[01-18]\nBlockName=" + "b" * 300 + " Nodes=gb200-r2-n[01-18]\n"
    )
    (HERE / "slurm_digit_hostname.conf").write_text(
        "BlockName=nvl72-r1 Nodes=gb200-r1-n[01-18]\nBlockName=nvl72-r2 Nodes="
        + "7" * 5000
        + "\nBlockSizes=1\n"
    )
    (HERE / "slurm_not_utf8.conf").write_bytes(
        "# topology for the caf\u00e9 cluster\nBlockName=nvl72-r1 Nodes=gb200-r1-n[01-18]\n".encode("latin-1")
    )
    (HERE / "slurm_huge_blocksizes.conf").write_text(
        "BlockName=nvl72-r1 Nodes=gb200-r1-n[01-18]\nBlockSizes=" + "1" * 5000 + "\n"
    )


if __name__ == "__main__":
    main()
