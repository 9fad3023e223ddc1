"""Outbound URLs a client chooses (the batch tier's callbacks; any webhook's): checked after DNS
resolution, and connected to as checked.

A client-chosen URL must not reach what only the platform can reach: loopback, private networks,
link-local (cloud metadata at 169.254.169.254), multicast, reserved and shared ranges, and the IPv6
forms that embed one of them. The name is resolved once, every address it resolves to is checked,
and the request then dials the checked address itself, with the name as Host and as TLS server
name, so a second lookup can never answer with another address (DNS rebinding).
"""

import asyncio
import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

RESOLVE_TIMEOUT_S = 5.0
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the well-known prefix: IPv4 in the last 32 bits
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")
# a numeric last label makes a host an IPv4 address to resolvers, whatever its spelling (hex,
# octal, one integer, fewer than four parts): only the canonical dotted quad is taken
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")


class RefusedDestination(ValueError):
    """A URL the platform will not call; the message says why, without the URL's contents."""


def secure_url(url: str) -> bool:
    """Whether an operator's URL may carry a secret: HTTPS, or plain HTTP to this machine's loopback
    (a service run beside the gateway)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return bool(parts.hostname)
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


def allow_list(spec: str) -> tuple[Network, ...]:
    """The operator's comma-separated networks callbacks may reach though not public (a bare
    address is a network of one); a bad entry raises ValueError at startup."""
    return tuple(
        ipaddress.ip_network(part.strip(), strict=False) for part in spec.split(",") if part.strip()
    )


# for a receiver the operator set: it may point anywhere, internal networks included
ANYWHERE = allow_list("0.0.0.0/0,::/0")


def loggable(url: str) -> str:
    """scheme://host:port of a URL, for logs: never its credentials, path or query."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "<invalid URL>"
    return f"{parsed.scheme}://{parsed.netloc.decode('ascii')}"


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, 6to4, Teredo, NAT64): reaching it may
    reach them."""
    found = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [a for a in found if a is not None]


def is_public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and (
        address.is_site_local or not all(map(is_public, _embedded_ipv4(address)))
    ):
        return False
    # is_global alone lets multicast through, and its ranges vary between Python releases
    return address.is_global and not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


def _check_spelling(host: str) -> None:
    if ":" in host:  # an IPv6 literal: the URL parser took it only in brackets
        return
    if _NUMERIC_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1]):
        try:
            canonical = str(ipaddress.IPv4Address(host)) == host
        except ValueError:
            canonical = False
        if not canonical:
            raise RefusedDestination("an IPv4 address must be four decimal numbers, as 192.0.2.1")
    elif not _HOST_NAME.fullmatch(host):
        raise RefusedDestination("the host is not a valid name")


@dataclass(frozen=True)
class Destination:
    url: httpx.URL  # as the client gave it
    address: str  # the checked address to dial

    @property
    def host(self) -> str:
        return self.url.raw_host.decode("ascii")  # IDNA-encoded, as DNS and TLS see it

    async def post(
        self, client: httpx.AsyncClient, content: bytes, headers: dict[str, str]
    ) -> httpx.Response:
        """POST to the checked address: Host and (https) the TLS server name stay the URL's,
        so the certificate is checked against the name. Never follows a redirect (one would
        reach a host nobody checked)."""
        https = self.url.scheme == "https"
        return await client.post(
            self.url.copy_with(host=self.address),
            content=content,
            headers={**headers, "host": self.url.netloc.decode("ascii")},
            extensions={"sni_hostname": self.host} if https else {},
            follow_redirects=False,
        )


def spelled(url: str) -> httpx.URL:
    """The URL, parsed as its request will be, once its form is one a webhook may have (http or
    https, no credentials, a host spelled plainly); raises RefusedDestination. No lookup: what
    its name resolves to is checked at each delivery (`check`)."""
    try:
        parsed = httpx.URL(url)  # the parser the request is sent with: no second opinion
    except httpx.InvalidURL:
        raise RefusedDestination("it is not a valid URL") from None
    if parsed.scheme not in ("http", "https"):
        raise RefusedDestination("it must be an http or https URL")
    if parsed.userinfo:
        raise RefusedDestination("it must not hold credentials")
    host = parsed.raw_host.decode("ascii")
    if not host:
        raise RefusedDestination("it has no host")
    _check_spelling(host)
    return parsed


async def check(url: str, allow: Sequence[Network] = ()) -> Destination:
    """The URL's destination once every address its host resolves to is public or in `allow`.
    Raises RefusedDestination, or OSError when the host does not resolve (maybe for now)."""
    parsed = spelled(url)
    host = parsed.raw_host.decode("ascii")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    async with asyncio.timeout(RESOLVE_TIMEOUT_S):
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [ipaddress.ip_address(info[4][0]) for info in found]
    if not addresses or not all(
        is_public(a) or any(a in network for network in allow) for a in addresses
    ):
        raise RefusedDestination("its host must resolve to public addresses only")
    return Destination(parsed, str(addresses[0]))
