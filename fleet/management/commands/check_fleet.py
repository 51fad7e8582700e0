"""Check the fleet's invariants and which waiting jobs it has room for.

scripts/manage check_fleet          # a line per problem; exit 1 if any
scripts/manage check_fleet --json   # everything, for scripts (the soak test)
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from fleet.services.read import invariants


class Command(BaseCommand):
    help = "Check the fleet's invariants (no GPU held twice, gangs whole) and which waiting jobs fit now."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the whole report as JSON")

    def handle(self, *args, **options):
        report = invariants.report()
        if options["json"]:
            self.stdout.write(json.dumps(report))
            return
        problems = list(report["violations"])
        if report["gpus_ever_held_twice"]:
            problems.append(f"{report['gpus_ever_held_twice']} pair(s) of allocations held one GPU at once")
        for w in report["waiting"]:
            if w["placed_by_pass"]:
                self.stdout.write(
                    f"job #{w['job']} {w['name']} waits, and the next scheduling pass places it"
                )
            elif w["room_by_counts"] and not w["placed_alone"]:
                problems.append(
                    f"job #{w['job']} {w['name']} waits though racks have idle room for it: {w['reason']}"
                )
        if problems:
            raise CommandError("; ".join(problems))
        self.stdout.write(f"ok: no invariant broken; {len(report['waiting'])} job(s) waiting")
