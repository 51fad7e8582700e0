from django.core.management.base import BaseCommand, CommandError

from fleet.choices import Role
from fleet.services.errors import ServiceError
from fleet.services.users import MAX_TOKEN_DAYS, ensure_user


class Command(BaseCommand):
    help = (
        "Create (or update) a user with a Rackwise role and print a new API token "
        "(shown once: only its hash is stored). A submitter needs --tenant."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument(
            "--tenant", action="append", default=[], help="Tenant to join (repeatable; created if missing)."
        )
        parser.add_argument(
            "--expires-days",
            type=int,
            default=None,
            help=f"The token stops working after this many days (1 to {MAX_TOKEN_DAYS}); default: never.",
        )

    def handle(self, *args, username: str, role: str, tenant: list[str], expires_days: int | None, **options):
        try:
            _, token = ensure_user(None, username, role=role, tenants=tenant, token_expires_days=expires_days)
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(token)
