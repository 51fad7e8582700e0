from django.apps import AppConfig
from django.db.models.signals import post_migrate


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Signals and hooks connect once the app registry is ready (Django's rule for ready()).
        from fleet import access_signals
        from fleet.schedules import ensure_periodic_tasks

        post_migrate.connect(ensure_periodic_tasks, sender=self)
        access_signals.connect()
