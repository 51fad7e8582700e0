"""``manage.py export_slurm_topology``: Rackwise's racks as a Slurm topology.conf."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.services.errors import ServiceError
from fleet.services.intake.topology import export_slurm_topology


class Command(BaseCommand):
    help = (
        "Write a topology.conf for TopologyPlugin=topology/block: one block per rack with its healthy "
        "nodes, BlockSizes from the slice size (nodes minus spares), so Slurm keeps the spares."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("-o", "--output", help="write here instead of stdout")
        parser.add_argument(
            "--base-block", type=int, help="planning base block size (default: the slice size)"
        )

    def handle(self, *args, output: str | None, base_block: int | None, **options) -> None:
        if base_block is not None and base_block < 1:
            raise CommandError("--base-block must be at least 1")
        try:
            export = export_slurm_topology(base_block=base_block)
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        for line in export.left_out:
            self.stderr.write(f"left out: {line}")
        if output:
            try:
                Path(output).write_text(export.text)
            except OSError as exc:
                raise CommandError(f"{output}: cannot write: {exc.strerror}") from exc
            self.stderr.write(f"wrote {len(export.blocks)} blocks to {output}")
        else:
            self.stdout.write(export.text, ending="")
