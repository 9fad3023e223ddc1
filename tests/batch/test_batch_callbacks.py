"""Callback destinations and delivery, without a gateway: what is refused (never connected to),
dialling the address that was checked, no redirects, nothing secret in the log, signatures.

Names resolve through a patched getaddrinfo, so no test depends on (or reaches) real DNS, and any
connection to an address other than the local test server fails the test."""

import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest
from standardwebhooks import Webhook

from tokenyard.core.destinations import Destination, RefusedDestination, allow_list, check
from tokenyard.core.webhooks import deliver, webhook_client

LOOPBACK = allow_list("127.0.0.1")
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # any 24 bytes, base64


class _Receiver(BaseHTTPRequestHandler):
    """Answers each POST with the next status of `script` (the last one repeats)."""

    script: ClassVar[list[int]] = [200]
    received: ClassVar[list[tuple[str, bytes, dict[str, str]]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((self.path, body, {k.lower(): v for k, v in self.headers.items()}))
        status = self.script[min(len(self.received), len(self.script)) - 1]
        self.send_response(status)
        if status in (301, 302, 307, 308):
            self.send_header("location", f"http://127.0.0.1:{self.server.server_port}/moved")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.script, _Receiver.received = [200], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()
    server.server_close()


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """name → the addresses it resolves to (edit it mid-test to rebind); every lookup is logged
    under "asked". Connections anywhere but 127.0.0.1 fail the test."""
    names: dict[str, list[str]] = {"asked": []}
    real_lookup, real_connect = socket.getaddrinfo, socket.socket.connect

    def lookup(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        host = host.decode() if isinstance(host, bytes) else host
        names["asked"].append(host)
        if host not in names:
            return real_lookup(host, port, *args, **kwargs)  # a literal address: no DNS
        family = socket.AF_INET6
        return [
            (family if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in names[host]
        ]

    def connect(sock: socket.socket, address: Any) -> Any:
        assert address[0] == "127.0.0.1", f"connected to {address}"
        return real_connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(socket.socket, "connect", connect)
    return names


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://localhost/",
        "http://0x7f000001/",
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://127.1/",
        "http://127.0.0.1./",
        "http://user:pw@127.0.0.1/",
        "http://user:pw@example.com/",
        "http://[::1]/",
        "http://[::]/",
        "http://0.0.0.0/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.1.2.3/",
        "http://172.16.0.1/",
        "http://192.168.0.1/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
        "http://240.0.0.1/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[ff02::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
        "http://[2002:a9fe:a9fe::]/",  # 6to4 around 169.254.169.254
        "http://[64:ff9b::a00:1]/",  # NAT64 around 10.0.0.1
        "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",  # Teredo
        "ftp://example.com/",
        "file:///etc/passwd",
        "http:///nohost",
        "http://exa%6dple.com/",
        "not a url",
    ],
)
async def test_refused_destinations(url: str, dns: dict[str, list[str]]) -> None:
    dns["example.com"] = ["93.184.215.14"]
    dns["localhost"] = ["127.0.0.1", "::1"]
    with pytest.raises(RefusedDestination):
        await check(url)


async def test_a_name_is_refused_if_any_of_its_addresses_is(dns: dict[str, list[str]]) -> None:
    dns["mixed.example"] = ["93.184.215.14", "10.0.0.5"]
    dns["public.example"] = ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]
    with pytest.raises(RefusedDestination):
        await check("https://mixed.example/hook")
    destination = await check("https://public.example/hook")
    assert destination.address == "93.184.215.14" and destination.host == "public.example"


async def test_the_allow_list_lets_an_operator_network_through(dns: dict[str, list[str]]) -> None:
    dns["hooks.corp"] = ["10.1.2.3"]
    allow = allow_list("10.1.0.0/16, 127.0.0.1")
    assert (await check("http://hooks.corp:8080/x", allow)).address == "10.1.2.3"
    assert (await check("http://127.0.0.1/x", allow)).address == "127.0.0.1"
    with pytest.raises(RefusedDestination):  # the allow-list is of networks, not spellings
        await check("http://2130706433/", allow)
    with pytest.raises(RefusedDestination):
        await check("http://10.2.0.1/", allow)


async def _deliver(url: str, attempts: int = 1) -> bool:
    async with webhook_client() as client:
        return await deliver(
            client,
            url,
            message_id="batch_0123",
            body=b'{"id": "batch_0123"}',
            secret=SECRET,
            allow=LOOPBACK,
            attempts=attempts,
            backoff_s=0.01,
        )


async def test_delivery_dials_the_address_it_checked(
    receiver: int, dns: dict[str, list[str]]
) -> None:
    dns["hooks.test"] = ["127.0.0.1"]
    assert await _deliver(f"http://hooks.test:{receiver}/done")
    [(path, _, headers)] = _Receiver.received
    assert path == "/done" and headers["host"] == f"hooks.test:{receiver}"
    assert dns["asked"].count("hooks.test") == 1  # the check's lookup, and no second one


async def test_a_name_rebound_after_submission_is_refused_at_delivery(
    receiver: int, dns: dict[str, list[str]]
) -> None:
    dns["hooks.test"] = ["127.0.0.1"]
    url = f"http://hooks.test:{receiver}/done"
    await check(url, LOOPBACK)  # as at submission
    dns["hooks.test"] = ["169.254.169.254"]
    assert not await _deliver(url, attempts=3)  # refused at once, not retried
    assert _Receiver.received == []


async def test_redirects_are_not_followed(receiver: int, dns: dict[str, list[str]]) -> None:
    _Receiver.script = [302]
    assert not await _deliver(f"http://127.0.0.1:{receiver}/done")
    assert [path for path, _, _ in _Receiver.received] == ["/done"]


async def test_the_log_never_holds_credentials_or_the_query(
    receiver: int, dns: dict[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    _Receiver.script = [500]
    caplog.set_level(logging.WARNING, "tokenyard.webhooks")
    assert not await _deliver(f"http://127.0.0.1:{receiver}/hook/TOKEN1?key=TOKEN2", attempts=2)
    assert not await _deliver(f"http://admin:TOKEN3@127.0.0.1:{receiver}/")
    logged = caplog.text
    assert f"127.0.0.1:{receiver}" in logged
    assert not any(token in logged for token in ("TOKEN1", "TOKEN2", "TOKEN3", "admin"))


async def test_retries_keep_the_webhook_id_and_verify(
    receiver: int, dns: dict[str, list[str]]
) -> None:
    _Receiver.script = [503, 200]
    assert await _deliver(f"http://127.0.0.1:{receiver}/done", attempts=2)
    (_, _, first), (_, body, retry) = _Receiver.received
    assert first["webhook-id"] == retry["webhook-id"] == "batch_0123"
    assert Webhook(SECRET).verify(body, retry) == {"id": "batch_0123"}
    assert retry["webhook-signature"].startswith("v1,")


async def test_https_is_dialled_by_address_with_the_name_for_tls() -> None:
    """The request goes to the checked address, while Host and the TLS server name (SNI, and the
    name the certificate is checked against) stay the URL's."""
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(204)

    target = Destination(httpx.URL("https://hooks.example:8443/x?y=1"), "93.184.215.14")
    async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as client:
        await target.post(client, b"{}", {})
    [request] = sent
    assert str(request.url) == "https://93.184.215.14:8443/x?y=1"
    assert request.headers["host"] == "hooks.example:8443"
    assert request.extensions["sni_hostname"] == "hooks.example"
