"""Where event webhooks may be sent.

A webhook is a request the control plane makes on an operator's word, from
inside its own network. Left unchecked, an endpoint on ``127.0.0.1``, on a
private network or on ``169.254.169.254`` (the cloud metadata service) turns
the webhooks worker into a proxy into that network (SSRF). So:

1. An endpoint's URL carries no credentials (``user:pass@``): the signature
   (``X-Rackwise-Signature``) is how a receiver knows the sender, and a URL is
   shown in places a secret should not be.
2. Every address its host resolves to must be globally routable: loopback,
   link-local, private, shared (CGNAT), unspecified, multicast and reserved
   addresses are refused, unless they are inside a network of
   ``RACKWISE_WEBHOOK_ALLOW_NETS`` (CIDRs, empty by default) - for a receiver
   the operator knowingly runs inside the network.
3. This is checked when an endpoint is registered (a 400 naming the address)
   and again before every delivery, since DNS answers change (DNS rebinding).
   The request then goes to the very address that was checked
   (:func:`resolve` returns it; ``fleet.signing.post_signed`` connects to it
   while sending the host's name in ``Host`` and TLS SNI), so a second lookup
   cannot swap it.

A name that does not resolve at registration is accepted (its DNS may not exist
yet); each delivery resolves it again, and a failed lookup is retried like an
unreachable receiver.

The webhook *cluster adapter* (``RACKWISE_WEBHOOK_URL``) is not held to these rules: it
is operator configuration from the environment, not input over the API, and an
receiver inside the cluster network is the normal case.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from fleet.models.webhooks import safe_url

__all__ = ["Target", "TargetRefused", "check_registration", "refusal", "resolve", "safe_url"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]


class TargetRefused(Exception):
    """The URL may not be delivered to; the message says why."""


@dataclass(frozen=True)
class Target:
    """A URL and the address its request must connect to."""

    url: str
    host: str
    port: int
    address: str


def _system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _kind(address: Address) -> str | None:
    """Why an address is not one a webhook may reach, or None if it is global."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    for kind, flag in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
    ):
        if flag:
            return kind
    if not address.is_global:
        return "not globally routable"
    return None


def refusal(address: str) -> str | None:
    """Why a webhook may not go to ``address`` (one IP), or None if it may."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone
    if any(ip in ipaddress.ip_network(net) for net in settings.RACKWISE_WEBHOOK_ALLOW_NETS):
        return None
    kind = _kind(ip)
    if kind is None:
        return None
    return (
        f"{address} is a {kind} address; webhooks go to public addresses only "
        "(an operator can allow a network with RACKWISE_WEBHOOK_ALLOW_NETS)"
    )


def _host_and_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise TargetRefused(
            "credentials in the URL (user:pass@) are not accepted; receivers verify the "
            "X-Rackwise-Signature header instead"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise TargetRefused(f"bad port: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused("not an http:// or https:// URL with a host")
    return parts.hostname, port


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError:
        return None


def resolve(url: str, resolver: Resolver | None = None) -> Target:
    """The address to deliver ``url`` to, after checking every address its host
    has (one refused address refuses the URL: a name that answers both public
    and private addresses must not reach the private one by chance).

    Raises TargetRefused, or OSError when the name does not resolve (retried)."""
    host, port = _host_and_port(url)
    literal = _literal(host)
    addresses = [literal] if literal else (resolver or _system_resolver)(host, port)
    if not addresses:
        raise OSError(f"{host} has no address")
    for address in addresses:
        why = refusal(address)
        if why:
            raise TargetRefused(why if literal else f"{host} resolves to {why}")
    return Target(url=url, host=host, port=port, address=addresses[0])


def check_registration(url: str, resolver: Resolver | None = None) -> None:
    """Refuse (TargetRefused) a URL that could not be delivered to now. A name
    that does not resolve yet passes: delivery checks it again."""
    try:
        resolve(url, resolver)
    except OSError:
        pass
