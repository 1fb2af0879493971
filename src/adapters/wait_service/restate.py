"""The wait service is Restate: each event is a one-way call through Restate's ingress.

`POST {ingress}/{Name}/{key}/{handler}/send` with the event object as its JSON body and
`idempotency-key: <event id>`: the call goes to the virtual object or workflow `Name` keyed by
the run ID (`RESTATE_KEY`, a template over the event's tenant, run ID and stream ID: `{run_id}`
by default, as the contract has it; `{tenant}/{run_id}` keeps tenants' runs of the same ID
apart). Restate answers a repeated key with the invocation it already accepted, so a
publish repeated after a lost answer (or by a second worker) starts nothing new. The
dispatcher sends a stream's record n+1 only after Restate accepted n, and Restate runs a
key's exclusive handlers in the order their calls arrived.

2xx is accepted. Connection failures, timeouts, 5xx and 429 are transient (the worker's
bounded exponential backoff with jitter). Any other 4xx (an unknown service or handler, a
workflow whose `run` already finished, a body the handler refuses) is recorded as the
delivery's last error and retried slowly, never dropped: it may be fixed on Restate's side (a
deployment registered, a handler added)."""

from __future__ import annotations

import re
from datetime import datetime
from urllib.parse import quote

import httpx

from adapters.wait_service.templates import Names, check_template, names_of
from application.input_delivery import PublishFailed

SLOW_RETRY_SECONDS = 60.0
TARGET = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)/([A-Za-z_][A-Za-z0-9_]*)$")


def parse_target(target: str) -> tuple[str, str]:
    match = TARGET.match(target.strip())
    if not match:
        raise ValueError(
            f"RESTATE_TARGET={target!r} is not `Name/handler` (a virtual object or workflow "
            "and its handler, e.g. `Inbox/on_record`)"
        )
    return match.group(1), match.group(2)


class RestateWaitService:
    def __init__(
        self, ingress_url: str, target: str, key: str = "{run_id}", timeout: float = 10.0
    ) -> None:
        if not ingress_url.startswith(("http://", "https://")):
            raise ValueError(f"RESTATE_INGRESS_URL={ingress_url!r} is not an http(s) URL")
        self._ingress = ingress_url.rstrip("/")
        self._service, self._handler = parse_target(target)
        self._key = check_template("RESTATE_KEY", key)
        self._client = httpx.AsyncClient(timeout=timeout)

    def url(self, names: Names) -> str:
        key = quote(names.fill(self._key), safe="")
        return f"{self._ingress}/{self._service}/{key}/{self._handler}/send"

    async def check(self) -> str | None:
        """None when the ingress answers its health check, else why not."""
        try:
            answer = await self._client.get(f"{self._ingress}/restate/health", timeout=3.0)
        except httpx.HTTPError as error:
            return f"unreachable ({type(error).__name__})"
        return None if answer.is_success else f"health check answered {answer.status_code}"

    async def publish(
        self, event_id: str, event: bytes, *, stream_created_at: datetime | None = None
    ) -> None:
        try:
            answer = await self._client.post(
                self.url(names_of(event)),
                content=event,
                headers={"Content-Type": "application/json", "idempotency-key": event_id},
            )
        except httpx.HTTPError as error:
            raise PublishFailed(f"Restate ingress unreachable: {type(error).__name__}") from error
        if answer.is_success:
            return
        status = answer.status_code
        detail = _message(answer)
        if status >= 500 or status == 429:
            raise PublishFailed(f"Restate ingress answered {status}{detail}")
        raise PublishFailed(f"Restate refused the call with {status}{detail}", SLOW_RETRY_SECONDS)

    async def close(self) -> None:
        await self._client.aclose()


def _message(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return f": {str(message)[:300]}" if message else ""
