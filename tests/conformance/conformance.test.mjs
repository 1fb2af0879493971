// The Durable Streams conformance suite against the server at $DS_BASE_URL (the protocol base:
// streams are at `${DS_BASE_URL}/v1/stream/...`). $DS_LONG_POLL_TIMEOUT_MS is the server's
// long-poll timeout, so that the suite waits no longer than the server does. $DS_SUBSCRIPTIONS=1
// turns on the suite's opt-in "Reserved subscription APIs" group.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.DS_BASE_URL
if (!baseUrl) throw new Error("DS_BASE_URL is not set (the server's Durable Streams base URL)")

runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.DS_LONG_POLL_TIMEOUT_MS ?? 20_000),
  subscriptions: process.env.DS_SUBSCRIPTIONS === "1",
})
