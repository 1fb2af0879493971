"""Webhook URL rules (domain.webhook_urls): every refused form is refused before storing."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from domain.subscriptions import WebhookUrlRejected, webhook_address
from domain.webhook_urls import check_url

REFUSED_URLS = [
    "http://10.0.0.1/hook",  # private, and plain http off loopback
    "https://10.0.0.1/hook",
    "https://172.16.5.4/hook",
    "https://192.168.1.1/hook",
    "https://169.254.169.254/latest/meta-data",  # metadata
    "https://169.254.10.10/hook",  # link-local
    "https://[fe80::1]/hook",
    "https://[fd00::1]/hook",  # unique-local
    "https://[::ffff:10.0.0.1]/hook",  # IPv4-mapped private
    "https://[2002:a9fe:a9fe::]/hook",  # 6to4 of the metadata address
    "https://[2002:0a00:0001::1]/hook",  # 6to4 of a private address
    "https://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/hook",  # Teredo of 10.0.0.1
    "https://[fec0::1]/hook",  # site-local
    "https://224.0.0.1/hook",  # multicast
    "https://[ff02::1]/hook",
    "https://0.0.0.0/hook",  # unspecified
    "https://[::]/hook",
    "https://100.64.0.1/hook",  # shared address space (CGNAT)
    "http://example.com/hook",  # plain http to a public name
    "ftp://example.com/hook",
    "https://user:pw@example.com/hook",  # credentials
    "https:///nohost",
    "not a url",
    "https://bücher.example/hook",  # not ASCII: no request line could carry it
    "https://hooks.example.com/ü",
    "http://127.0.0.1:0/hook",  # port 0: nothing listens there
    "https://hooks.example.com:0/",
    # Shorthand IPv4 forms, which resolvers and browsers read as addresses: held to the same
    # rules as the dotted form before storing, not only at delivery.
    "https://10.1/hook",  # 10.0.0.1
    "https://0x0a000001/hook",
    "https://167772161/hook",
    "https://012.0.0.1/hook",  # octal 10
    "https://0/hook",  # 0.0.0.0
    "https://0x/hook",
    "https://169.254.43518/hook",  # 169.254.169.254
    "https://0xa9.0xfe.0xa9.0xfe/hook",
    "http://0x08080808/hook",  # 8.8.8.8: public, but plain http off loopback
    # A host of characters no name has: what follows it would be shown as its origin.
    "https://example.com\\SECRET",
    "https://example.com%2fSECRET/",
    "https://exa%6dple.com/hook",
    "https://example.com;x/hook",
]


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_a_refused_url_is_refused_before_it_is_stored(url: str) -> None:
    with pytest.raises(WebhookUrlRejected):
        check_url(url, loopback=True)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/x",
        "http://127.0.0.1:8080/hook",
        "http://127.0.0.5/hook",
        "http://localhost:9/hook",
        "http://[::1]:9/hook",
        "https://8.8.8.8/hook",
        "https://0x08080808/hook",  # 8.8.8.8
        "http://127.1/hook",  # 127.0.0.1: loopback, as its delivery finds it
        "http://2130706433/hook",
        "https://1e2.example/hook",  # a name, not a number
    ],
)
def test_https_and_http_to_loopback_are_accepted(url: str) -> None:
    check_url(url, loopback=True)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "https://127.0.0.1/hook",
        "http://127.1/hook",
        "http://2130706433/hook",
        "http://localhost:9/hook",
        "https://localhost./hook",
        "http://hooks.localhost/hook",
        "http://[::1]:9/hook",
        "https://[::ffff:127.0.0.1]/hook",
    ],
)
def test_a_loopback_host_is_refused_where_the_deployment_allows_none(url: str) -> None:
    """A tenant's admin token would have the service POST to the host's own ports."""
    with pytest.raises(WebhookUrlRejected, match="loopback"):
        check_url(url)
    named = (urlsplit(url).hostname or "").rstrip(".")
    check_url(url, frozenset({named}))  # an operator's own receiver, by name


def test_an_allowed_host_may_be_plain_http_and_private() -> None:
    check_url("http://hooks.internal/x", frozenset({"hooks.internal"}))
    with pytest.raises(WebhookUrlRejected):
        check_url("http://hooks.internal/x")


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("https://hooks.example/x?secret=S", "https://hooks.example"),
        ("https://user:pw@hooks.example:8443/a/b#frag", "https://hooks.example:8443"),
        ("https://hooks.example/services/T0/B0/secret", "https://hooks.example"),
        ("http://[::1]:9/p?q=1", "http://[::1]:9"),
        ("https://hooks.example", "https://hooks.example"),
    ],
)
def test_a_webhooks_address_leaves_out_what_may_be_a_credential(url: str, address: str) -> None:
    assert webhook_address(url) == address
