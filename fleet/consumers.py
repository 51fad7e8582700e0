"""The console's live feed: ``/ws/fleet/``.

Authenticated users with a Rackwise role only. Every event of the ``fleet``
group is forwarded, filtered for the user: a submitter sees other tenants' jobs
only as ids, as in the REST API. A socket follows its session and its user
(fleet.access_signals): logging out closes the session's sockets (4401), and a
change of role, tenants or active flag re-checks the user's, which close (4403)
or carry on with the new visibility."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model

from fleet.events import GROUP, session_group, user_group, visible_to
from fleet.permissions import role_of, sees_all_tenants

# Close codes the page understands: log in again / you have no role.
UNAUTHENTICATED = 4401
FORBIDDEN = 4403


class FleetConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: tuple[str, ...] = ()

    async def connect(self) -> None:
        user = self.scope.get("user")
        access = await self._access(user)
        if access is None:
            await self.close(code=UNAUTHENTICATED)
            return
        username, role, self.all_tenants, self.tenant_ids = access
        if role is None:
            await self.close(code=FORBIDDEN)
            return
        self.user_id = user.pk
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        self.groups_joined = (GROUP, user_group(user.pk), *((session_group(key),) if key else ()))
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "hello", "user": username, "role": role})

    @database_sync_to_async
    def _access(self, user) -> tuple[str, str | None, bool, set[int]] | None:
        """None for anonymous or inactive; else the username, role and tenant
        visibility (the session's user is loaded lazily, so this runs in a thread)."""
        if user is None or not user.is_authenticated or not user.is_active:
            return None
        role = role_of(user)
        tenants = set(user.tenants.values_list("id", flat=True))
        return user.get_username(), (role.value if role else None), sees_all_tenants(user), tenants

    @database_sync_to_async
    def _fresh_user(self):
        return get_user_model().objects.filter(pk=self.user_id).first()

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def session_ended(self, message: dict) -> None:
        """The session logged out (or was flushed): log in again."""
        await self.close(code=UNAUTHENTICATED)

    async def access_changed(self, message: dict) -> None:
        """The user's role, tenants or active flag changed: carry on with what
        they may see now, or close."""
        access = await self._access(await self._fresh_user())
        if access is None or access[1] is None:
            await self.close(code=FORBIDDEN if access else UNAUTHENTICATED)
            return
        username, role, self.all_tenants, self.tenant_ids = access
        await self.send_json({"type": "hello", "user": username, "role": role})

    async def receive_json(self, content, **kwargs) -> None:
        # The feed is one-way; a ping (every 25 s from the console) keeps proxies
        # from closing an idle socket, and renews the socket's group memberships:
        # the channel layer drops a member not renewed within its group_expiry
        # (settings.CHANNEL_LAYERS), so a socket gone without a disconnect stops
        # being sent to within minutes, not a day.
        if isinstance(content, dict) and content.get("type") == "ping":
            for group in self.groups_joined:
                await self.channel_layer.group_add(group, self.channel_name)
            await self.send_json({"type": "pong"})

    async def fleet_event(self, message: dict) -> None:
        await self.send_json(self._visible(message["event"]))

    def _visible(self, event: dict) -> dict:
        return visible_to(event, None if self.all_tenants else self.tenant_ids)
