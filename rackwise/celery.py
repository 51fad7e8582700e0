"""The Celery application. Broker: Redis at REDIS_URL; schedules live in the
database (django-celery-beat) so operators can edit them in the admin."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackwise.settings")

app = Celery("rackwise")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
