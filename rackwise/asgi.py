"""ASGI entry point (daphne): HTTP through Django, the console's websocket
through Channels with the Django session."""

import os

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackwise.settings")
django_asgi_app = get_asgi_application()

from django.urls import path  # noqa: E402  (after Django is set up)

from fleet.consumers import FleetConsumer  # noqa: E402
from fleet.origins import SameOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginValidator(
            AuthMiddlewareStack(URLRouter([path("ws/fleet/", FleetConsumer.as_asgi())]))
        ),
    }
)
