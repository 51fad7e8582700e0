"""Create the demo fleet and demo users. Safe to run again: what exists is kept."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from fleet.choices import RackKind, Role
from fleet.models import Rack
from fleet.services.nodes.inventory import create_rack
from fleet.services.users import ensure_user

DEMO_PASSWORD = "rackwise-demo"
DEMO_USERS = [
    ("operator", Role.OPERATOR, ["llm", "vision"]),
    ("viewer", Role.VIEWER, []),
    ("submitter", Role.SUBMITTER, ["llm"]),
    ("vision-submitter", Role.SUBMITTER, ["vision"]),
]
DEMO_RACKS = 8


class Command(BaseCommand):
    help = "Create a demo fleet (8 NVL72 racks) and a demo user for each role."

    def add_arguments(self, parser):
        parser.add_argument(
            "--users-only",
            action="store_true",
            help="only the demo users (the racks come from a real cluster)",
        )
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000/", help="where the console is served (printed)"
        )

    def handle(self, *args, **options):
        created = 0
        for i in range(0 if options["users_only"] else DEMO_RACKS):
            name = f"rack-{i + 1:02d}"
            if Rack.objects.filter(name=name).exists():
                continue
            create_rack(
                None,
                name=name,
                kind=RackKind.NVL72,
                external_id=f"demo-cluster.{i + 1}",
                site="demo-dc",
                row="A" if i < DEMO_RACKS // 2 else "B",
                position=i % (DEMO_RACKS // 2) + 1,
            )
            created += 1
        User = get_user_model()
        for username, role, tenants in DEMO_USERS:
            if not User.objects.filter(username=username).exists():
                ensure_user(
                    None, username, role=role, tenants=tenants, password=DEMO_PASSWORD, issue_token=False
                )
        self.stdout.write(f"Fleet: {Rack.objects.count()} racks ({created} new).")
        self.stdout.write(f"Log in at {options['url']} with one of these users,")
        self.stdout.write(f"password {DEMO_PASSWORD!r}:")
        for username, role, tenants in DEMO_USERS:
            extra = f" (tenants: {', '.join(tenants)})" if tenants else ""
            self.stdout.write(f"  {username:<17} {role}{extra}")
