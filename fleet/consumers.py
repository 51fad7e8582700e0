"""The console's live feed: ``/ws/fleet/``.

Authenticated users with a Rackwise role only. Every event of the ``fleet``
group is forwarded, filtered for the user: a submitter sees other tenants' jobs
only as ids, as in the REST API."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from fleet.events import GROUP, visible_to
from fleet.permissions import role_of, sees_all_tenants

# Close codes the page understands: log in again / you have no role.
UNAUTHENTICATED = 4401
FORBIDDEN = 4403


class FleetConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        access = await self._access(self.scope.get("user"))
        if access is None:
            await self.close(code=UNAUTHENTICATED)
            return
        username, role, self.all_tenants, self.tenant_ids = access
        if role is None:
            await self.close(code=FORBIDDEN)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        await self.send_json({"type": "hello", "user": username, "role": role})

    @database_sync_to_async
    def _access(self, user) -> tuple[str, str | None, bool, set[int]] | None:
        """None for anonymous; else the username, role and tenant visibility (the
        session's user is loaded lazily, so this runs in a thread)."""
        if user is None or not user.is_authenticated:
            return None
        role = role_of(user)
        tenants = set(user.tenants.values_list("id", flat=True))
        return user.get_username(), (role.value if role else None), sees_all_tenants(user), tenants

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        # The feed is one-way; a ping keeps proxies from closing an idle socket.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def fleet_event(self, message: dict) -> None:
        await self.send_json(self._visible(message["event"]))

    def _visible(self, event: dict) -> dict:
        return visible_to(event, None if self.all_tenants else self.tenant_ids)
