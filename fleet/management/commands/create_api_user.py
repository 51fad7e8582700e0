from django.core.management.base import BaseCommand, CommandError

from fleet.choices import Role
from fleet.services.errors import ServiceError
from fleet.services.users import ensure_user


class Command(BaseCommand):
    help = "Create (or update) a user with a Rackwise role and print their API token."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument(
            "--tenant", action="append", default=[], help="Tenant to join (repeatable)."
        )

    def handle(self, *args, username: str, role: str, tenant: list[str], **options):
        try:
            _, token = ensure_user(None, username, role=role, tenants=tenant)
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(token.key)
