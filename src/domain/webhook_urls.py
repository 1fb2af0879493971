"""Which webhook URLs and addresses the service may connect to (PROTOCOL.md section 12.8).

A URL is `https://`, or, where the deployment allows loopback (`WEBHOOK_LOOPBACK`, for
development), `https://` or `http://` to a loopback host. Whatever a name resolves
to, the address actually connected to must be public: private (RFC 1918, unique-local),
link-local (metadata endpoints such as 169.254.169.254 among them), multicast, unspecified,
reserved, shared (CGNAT) and loopback addresses are refused, loopback only allowed when the URL
names a loopback host. Hosts an operator lists (`WEBHOOK_ALLOWED_HOSTS`) skip the address
rules: they are trusted by name."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

import msgspec

from domain.subscriptions import WebhookUrlRejected

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
# A host name's characters: labels of letters, digits, `-` (and `_`, which some names carry).
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\Z")
METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)


class WebhookTarget(msgspec.Struct, frozen=True):
    scheme: str
    host: str  # lower-case, without brackets
    port: int
    loopback: bool  # a loopback name: only loopback addresses will do
    allowed_by_name: bool


def _literal(host: str) -> IPAddress | None:
    """The address a host names literally: in its usual forms, or in the shorthand forms that
    resolvers and browsers take as IPv4 too (`127.1`, `0x7f000001`, `2130706433`, `0`)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return _ipv4_shorthand(host)


def _ipv4_number(part: str) -> int | None:
    """One part of a shorthand IPv4 address: decimal, `0x` hexadecimal or `0` octal."""
    base = 10
    if part[:2] in ("0x", "0X"):
        part, base = part[2:], 16
    elif len(part) > 1 and part.startswith("0"):
        part, base = part[1:], 8
    if not part:
        return 0 if base == 16 else None
    try:
        return int(part, base) if part.isalnum() and part.isascii() else None
    except ValueError:
        return None


def _ipv4_shorthand(host: str) -> ipaddress.IPv4Address | None:
    """`a`, `a.b`, `a.b.c` or `a.b.c.d` of numbers, the last filling the bytes left (the WHATWG
    URL standard's IPv4 parser, as `inet_aton` reads them); None for a name."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    values = [n for n in numbers if n is not None]
    *leading, last = values
    if any(n > 255 for n in leading) or last >= 256 ** (5 - len(values)):
        return None
    address = last
    for i, n in enumerate(leading):
        address += n << (8 * (3 - i))
    return ipaddress.IPv4Address(address)


def is_loopback_host(host: str) -> bool:
    address = _literal(host)
    if address is not None:
        return address.is_loopback
    return host in LOOPBACK_NAMES or host.endswith(".localhost")


def check_url(
    url: str, allowed_hosts: frozenset[str] = frozenset(), *, loopback: bool = False
) -> WebhookTarget:
    """The URL's target, or WebhookUrlRejected. Done before storing and again at every
    delivery (with the addresses then, see `check_address`). A loopback host only with
    `loopback` (or in `allowed_hosts`)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise WebhookUrlRejected(f"webhook URL is not a URL: {error}") from None
    if port == 0:  # nothing can be reached there: no delivery would ever be made
        raise WebhookUrlRejected("webhook URL names port 0, which nothing can listen on")
    host = (parts.hostname or "").lower().rstrip(".")
    if parts.scheme not in ("https", "http") or not host:
        raise WebhookUrlRejected(
            "webhook URL must be https:// (or http:// to loopback) with a host"
        )
    if parts.username is not None or parts.password is not None:
        raise WebhookUrlRejected("webhook URL must not carry credentials")
    if any(ch.isspace() or ord(ch) < 0x21 for ch in url):
        raise WebhookUrlRejected("webhook URL must not contain spaces or control characters")
    if not url.isascii():
        # An HTTP request line is ASCII: such a URL could never be delivered to.
        raise WebhookUrlRejected(
            "webhook URL must be ASCII: an internationalized host in its IDNA form (xn--…), "
            "other characters percent-encoded"
        )
    if ":" in host:  # an IPv6 literal, in brackets (urlsplit checks them)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise WebhookUrlRejected(f"webhook URL's host is not an IPv6 address: {host}") from None
    elif not _NAME.match(host):
        # `https://example.com\SECRET` is no URL an HTTP request can be sent to, and its
        # address, shown to readers as the URL's origin, would show what follows the host.
        raise WebhookUrlRejected(
            "webhook URL's host must be a name (letters, digits, '-', '.') or an IP address"
        )
    allowed = host in allowed_hosts
    names_loopback = is_loopback_host(host)
    if names_loopback and not loopback and not allowed:
        raise WebhookUrlRejected(
            "webhook URL names a loopback host: this deployment delivers to none "
            "(DUCTOR_STREAMS_WEBHOOK_LOOPBACK)"
        )
    if parts.scheme == "http" and not names_loopback and not allowed:
        raise WebhookUrlRejected("plain http:// is allowed only to loopback; use https://")
    address = _literal(host)
    if address is not None and not allowed:
        check_address(address, loopback_allowed=names_loopback)
    return WebhookTarget(
        scheme=parts.scheme,
        host=host,
        port=port or (443 if parts.scheme == "https" else 80),
        loopback=names_loopback,
        allowed_by_name=allowed,
    )


def check_address(address: IPAddress, *, loopback_allowed: bool) -> None:
    """Refuse an address no webhook may reach (WebhookUrlRejected)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif address.sixtofour is not None or address.teredo is not None:
            # 6to4 and Teredo carry an IPv4 address a relay may forward to (2002:a9fe:a9fe::
            # is 169.254.169.254): it is held to the same rules.
            embedded = address.sixtofour or address.teredo[1]  # type: ignore[index]
            check_address(embedded, loopback_allowed=False)
        elif address.is_site_local:  # fec0::/10, deprecated but still private in practice
            raise WebhookUrlRejected(f"webhook address {address} is site-local")
    if address.is_loopback:
        if loopback_allowed:
            return
        raise WebhookUrlRejected(f"webhook address {address} is loopback")
    if address in METADATA:
        raise WebhookUrlRejected(f"webhook address {address} is a metadata endpoint")
    if address.is_unspecified:
        raise WebhookUrlRejected(f"webhook address {address} is unspecified")
    if address.is_multicast:
        raise WebhookUrlRejected(f"webhook address {address} is multicast")
    if address.is_link_local:
        raise WebhookUrlRejected(f"webhook address {address} is link-local")
    if address.is_private or address.is_reserved or not address.is_global:
        raise WebhookUrlRejected(f"webhook address {address} is private or reserved")


def check_target_address(target: WebhookTarget, address: IPAddress) -> None:
    """The address a delivery resolved or connected to, against the URL's rules: a loopback
    name must be at a loopback address, any other name at a public one."""
    if target.allowed_by_name:
        return
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if target.loopback and not address.is_loopback:
        raise WebhookUrlRejected(f"{target.host} names loopback but is at {address}")
    check_address(address, loopback_allowed=target.loopback)
