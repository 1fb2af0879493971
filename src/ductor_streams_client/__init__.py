"""The Python client of ductor-streams: durable, ordered data streams over HTTP and SSE.

```python
from ductor_streams_client import StreamsClient, StreamsError

async with StreamsClient("http://127.0.0.1:8080", token) as client:
    await client.create_stream("run-1", stream_id="tokens")
    await client.append("run-1", "tokens", [{"text": "hello"}])
    async for record in client.follow("run-1", "tokens"):
        print(record["sequence"], record.get("data"))
```

It talks HTTP only and imports nothing of the service."""

from ductor_streams_client.client import API_PREFIX, Progress, RetryPolicy, StreamsClient
from ductor_streams_client.errors import StreamsError

__all__ = ["API_PREFIX", "Progress", "RetryPolicy", "StreamsClient", "StreamsError"]
