from django.core.management.base import BaseCommand, CommandError

from fleet.models import Node
from fleet.services.intake.health import issue_agent_token


class Command(BaseCommand):
    help = (
        "Create (or rotate) the agent token of a node and print it, for "
        "`python -m fleet.agent --token ...` on that host. The old token stops working."
    )

    def add_arguments(self, parser):
        parser.add_argument("hostname")

    def handle(self, *args, hostname: str, **options):
        node = Node.objects.filter(hostname=hostname).first()
        if node is None:
            raise CommandError(
                f"unknown host {hostname!r}; see GET /api/nodes/?hostname=... for the fleet's hosts"
            )
        self.stdout.write(issue_agent_token(None, node.pk))
