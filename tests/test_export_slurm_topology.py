"""Slurm topology export: `manage.py export_slurm_topology` writes a topology.conf
for topology/block that follows the plugin's documented rules (checked by
``fleet.topology.slurm.check_block_rules``, which cites them) and parses back
through the importer to the same blocks."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from fleet.choices import RackKind
from fleet.models import Node
from fleet.services.nodes.inventory import create_rack
from fleet.services.nodes.moves import mark_node_failed
from fleet.topology.slurm import check_block_rules, parse_topology_conf, read_topology_conf, to_topology

DATA = Path(__file__).resolve().parent / "data"


def export(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("export_slurm_topology", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def blocks_of(text: str) -> dict[str, list[str]]:
    return {b.name: b.nodes for b in parse_topology_conf(text, "exported").blocks}


def imported(*args: str) -> None:
    call_command("import_topology", *args, stdout=StringIO())


def test_export_writes_one_block_per_rack_with_its_healthy_nodes_only(db):
    imported(
        "--from", "slurm", str(DATA / "slurm_topology.conf"), "--nodes", str(DATA / "scontrol_nodes.json")
    )

    text, err = export()

    blocks = blocks_of(text)
    assert sorted(blocks) == ["nvl72-r1", "nvl72-r2", "nvl72-r3", "nvl72-r4"]
    # r1-n05 and r3-n12 are drained, r2-n07 and r4-n03 are down: Slurm gets none of them.
    assert blocks["nvl72-r1"] == [f"gb200-r1-n{i:02d}" for i in range(1, 19) if i != 5]
    assert "gb200-r2-n07" not in blocks["nvl72-r2"] and len(blocks["nvl72-r2"]) == 17
    assert "gb200-r3-n12" not in blocks["nvl72-r3"]
    assert "gb200-r4-n03" not in blocks["nvl72-r4"]
    # Hostlists are compact, as an operator would write them.
    assert "BlockName=nvl72-r1 Nodes=gb200-r1-n[01-04,06-18]" in text.splitlines()
    # The base block is the slice size (18 nodes - 2 spares), then doublings up to all 4 blocks.
    assert "BlockSizes=16,32,64" in text.splitlines()
    # The HGX node (its own NVLink domain) stays out of the blocks, and we say so.
    assert "1 single-node NVLink domains (HGX): hgx-h100-01" in err
    assert "# left out: 1 single-node NVLink domains (HGX): hgx-h100-01" in text


def test_the_exported_file_follows_the_block_plugin_rules(db):
    imported("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))

    text, _ = export()

    conf = read_topology_conf(text, "exported")
    assert check_block_rules(conf) == []
    # The same rules, spelled out on this file:
    names = [b.name for b in conf.blocks]
    assert len(names) == len(set(names)) == 4  # BlockName given and unique
    base = conf.block_sizes[0]
    assert all(len(b.nodes) >= base for b in conf.blocks)  # every block holds a base block
    assert all(size % base == 0 and (size // base) & (size // base - 1) == 0 for size in conf.block_sizes)
    assert conf.block_sizes == sorted(set(conf.block_sizes))  # successive sizes grow
    hosts = [h for b in conf.blocks for h in b.nodes]
    assert len(hosts) == len(set(hosts))  # a host in one block only


def test_a_slurm_topology_round_trips_through_export_and_import(db, tmp_path):
    source = (DATA / "slurm_topology.conf").read_text()
    imported("--from", "slurm", str(DATA / "slurm_topology.conf"))

    text, _ = export()

    # Every node is healthy (no scontrol states): the blocks come back as they were.
    original = {b.name: b.nodes for b in parse_topology_conf(source).blocks}
    assert blocks_of(text) == original
    topology = to_topology(parse_topology_conf(text, "exported"))
    assert {d.name: [n.hostname for n in d.nodes] for d in topology.domains} == original
    # And importing the exported file finds nothing to change.
    path = tmp_path / "topology.conf"
    path.write_text(text)
    out = StringIO()
    call_command("import_topology", "--from", "slurm", str(path), "--dry-run", stdout=out)
    assert out.getvalue().strip().endswith("no changes")


def test_a_kubernetes_fleet_exports_blocks_that_parse_back_to_its_healthy_racks(db):
    imported("--from", "kubernetes", str(DATA / "k8s_gb200_nodes.json"))

    text, _ = export()

    healthy: dict[str, list[str]] = {}
    for node in Node.objects.filter(state="healthy").select_related("rack").order_by("hostname"):
        healthy.setdefault(node.rack.name, []).append(node.hostname)
    assert blocks_of(text) == healthy


def test_a_rack_with_fewer_healthy_nodes_than_a_slice_is_left_out_and_said_so(db):
    imported("--from", "slurm", str(DATA / "slurm_topology.conf"))
    for host in ("gb200-r2-n01", "gb200-r2-n02", "gb200-r2-n03"):
        mark_node_failed(None, Node.objects.get(hostname=host).pk, "test")

    text, err = export()

    assert "nvl72-r2" not in blocks_of(text)
    assert "nvl72-r2: 15 healthy nodes, fewer than the base block size 16" in err
    assert "BlockSizes=16,32,64" in text.splitlines()  # 3 blocks: doublings up to 4 base blocks
    assert check_block_rules(read_topology_conf(text)) == []


def test_a_small_odd_rack_does_not_shrink_the_base_block_of_the_nvl72_racks(db):
    imported("--from", "slurm", str(DATA / "slurm_topology.conf"))
    create_rack(None, name="lab", kind=RackKind.CUSTOM, nodes=4, gpus_per_node=4, spare_nodes=0)

    text, err = export()

    # A 4-node base would let Slurm split a 16-node job over several racks.
    assert "BlockSizes=16,32,64" in text.splitlines()
    assert "lab: 4 healthy nodes, fewer than the base block size 16" in err


def test_rack_names_slurm_cannot_take_become_safe_block_names(db):
    create_rack(None, name="row A/1", hostname_prefix="a1")
    create_rack(None, name="row A 1", hostname_prefix="b1")

    text, _ = export()

    assert sorted(blocks_of(text)) == ["row_A_1", "row_A_1-2"]
    assert check_block_rules(read_topology_conf(text)) == []


def test_the_base_block_size_can_be_chosen(db):
    imported("--from", "slurm", str(DATA / "slurm_topology.conf"))

    text, _ = export("--base-block", "18")

    assert "BlockSizes=18,36,72" in text.splitlines()
    assert check_block_rules(read_topology_conf(text)) == []


def test_the_export_goes_to_a_file_when_asked(db, tmp_path):
    imported("--from", "slurm", str(DATA / "slurm_topology.conf"))
    target = tmp_path / "topology.conf"

    out, err = export("-o", str(target))

    assert out == ""
    assert "wrote 4 blocks to" in err
    assert len(blocks_of(target.read_text())) == 4


def test_an_export_with_no_rack_to_write_fails_in_one_line(db):
    with pytest.raises(CommandError, match="nothing to write"):
        export()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("BlockName=b1 Nodes=n[1-4]\nBlockName=b1 Nodes=n[5-8]\n", "has already been defined"),
        (
            "BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[5-7]\n",
            "fewer than the planning base block size 4",
        ),
        ("BlockName=b1 Nodes=n[1-4]\nBlockSizes=4,12\n", "not the base 4 times a power of two"),
        ("BlockName=b1 Nodes=n[1-8]\nBlockSizes=8,4\n", "must grow"),
        ("BlockName=b1 Nodes=n[1-4]\nBlockSizes=0\n", "must be positive"),
        ("BlockName=b1 Nodes=n[1-4]\nBlockName=b2 Nodes=n[4-7]\n", "host n4 is in both b1 and b2"),
        ("# nothing but a comment\n", "no blocks configured"),
    ],
)
def test_the_rule_checker_catches_each_broken_rule(text, problem):
    problems = check_block_rules(read_topology_conf(text))

    assert any(problem in str(p) for p in problems), problems
