"""The wait service over HTTP: POST the event as JSON with `Idempotency-Key: <event id>`.

2xx is accepted. 5xx, 429 and timeouts are transient (the worker's bounded exponential backoff
with jitter); any other 4xx is recorded as the delivery's last error and retried slowly, never
dropped — a refusal may be fixed on the other side."""

from __future__ import annotations

from datetime import datetime

import httpx

from application.input_delivery import PublishFailed

SLOW_RETRY_SECONDS = 300.0


class HttpWaitService:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self._url = url
        self._client = httpx.AsyncClient(timeout=timeout)

    async def publish(
        self, event_id: str, event: bytes, *, stream_created_at: datetime | None = None
    ) -> None:
        try:
            answer = await self._client.post(
                self._url,
                content=event,
                headers={"Content-Type": "application/json", "Idempotency-Key": event_id},
            )
        except httpx.HTTPError as error:
            raise PublishFailed(f"wait service unreachable: {type(error).__name__}") from error
        if answer.is_success:
            return
        status = answer.status_code
        if status >= 500 or status == 429:
            raise PublishFailed(f"wait service answered {status}")
        raise PublishFailed(f"wait service refused the event with {status}", SLOW_RETRY_SECONDS)

    async def close(self) -> None:
        await self._client.aclose()
