"""Liveness of the background side: every Celery queue Rackwise sends work to has
a worker that answers. Exits 1 with one line naming the queues nobody serves
(for a probe, a systemd timer or a person). ``scripts/manage check_workers``."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from fleet.prometheus import celery_queues
from rackwise.celery import app


class Command(BaseCommand):
    help = "Check that every Celery queue has a worker that answers; exit 1 naming the queues none serves."

    def add_arguments(self, parser):
        parser.add_argument(
            "--timeout", type=float, default=3.0, help="seconds to wait for workers' answers (default 3)"
        )

    def handle(self, *args, timeout: float, **options):
        try:
            answers = app.control.inspect(timeout=timeout).active_queues() or {}
        except Exception as exc:  # the broker itself is down
            raise CommandError(
                f"the broker does not answer ({exc}); check REDIS_URL / CELERY_BROKER_URL"
            ) from exc
        served: dict[str, list[str]] = {}
        for worker, queues in answers.items():
            for queue in queues:
                served.setdefault(queue["name"], []).append(worker)
        for queue in celery_queues():
            self.stdout.write(f"{queue}: {', '.join(sorted(served.get(queue, []))) or 'NO WORKER'}")
        missing = [q for q in celery_queues() if q not in served]
        if missing:
            raise CommandError(
                f"no worker answers for queue(s) {', '.join(missing)}; start one with: "
                f"celery -A rackwise worker -Q {','.join(missing)}"
            )
