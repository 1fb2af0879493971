// The official TypeScript client (npm @durable-streams/client) against a Durable Streams server:
//   DS_BASE_URL=http://127.0.0.1:8080/api/durable-streams DS_TOKEN=... node client-check.mjs
// Creates a JSON stream, appends through an idempotent producer (a retried batch is not
// appended twice, a stale epoch is fenced), reads it back, follows it live (SSE and
// long-poll), resumes from a saved offset and closes it. Every request carries the Bearer
// token through the client's `headers` option. Prints one line per step; exits 1 on the first
// step whose outcome differs from the expected one.
import { DurableStream, IdempotentProducer, StaleEpochError, stream } from "@durable-streams/client"
import assert from "node:assert/strict"

const base = process.env.DS_BASE_URL
if (!base) throw new Error("DS_BASE_URL is not set")
const headers = process.env.DS_TOKEN ? { Authorization: `Bearer ${process.env.DS_TOKEN}` } : {}
const url = `${base}/v1/stream/ts-client-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`

function step(name, detail = "") {
  console.log(`ok ${name}${detail ? `: ${detail}` : ""}`)
}

async function readAll(offset) {
  const res = await stream({ url, headers, offset, live: false })
  const items = await res.json()
  return { items, offset: res.offset, closed: res.streamClosed }
}

// Collects the items that arrive live from `offset` until `count` have come, then cancels.
async function follow(live, offset, count, whileFollowing) {
  const res = await stream({ url, headers, offset, live })
  const items = []
  let lastOffset = offset
  const done = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${live}: ${items.length}/${count} items`)), 20_000)
    res.subscribeJson(async (batch) => {
      items.push(...batch.items)
      lastOffset = batch.offset
      if (items.length >= count) {
        clearTimeout(timer)
        resolve()
      }
    })
  })
  await whileFollowing()
  await done
  res.cancel()
  return { items, offset: lastOffset }
}

async function main() {
  const handle = await DurableStream.create({ url, headers, contentType: "application/json" })
  const head = await handle.head()
  assert.equal(head.exists, true)
  assert.match(head.contentType ?? "", /^application\/json/)
  step("create", `${url} (${head.contentType}, offset ${head.offset})`)

  const errors = []
  const producer = new IdempotentProducer(handle, "ts-producer", {
    epoch: 0,
    lingerMs: 0,
    onError: (e) => errors.push(e),
  })
  for (const n of [1, 2, 3]) {
    producer.append(JSON.stringify({ n }))
    await producer.flush() // one batch each: sequence numbers 0, 1, 2
  }
  assert.deepEqual(errors, [])
  // A producer restarted with the same id and epoch sends sequence numbers 0.. again: the
  // server answers them as duplicates and appends nothing.
  const retry = new IdempotentProducer(handle, "ts-producer", { epoch: 0, lingerMs: 0, onError: (e) => errors.push(e) })
  for (const n of [1, 2, 3]) {
    retry.append(JSON.stringify({ n }))
    await retry.flush()
  }
  await retry.detach()
  assert.deepEqual(errors, [])
  let read = await readAll(undefined)
  assert.deepEqual(read.items, [{ n: 1 }, { n: 2 }, { n: 3 }])
  step("idempotent producer", "3 appended, the retried batch not again")

  const next = new IdempotentProducer(handle, "ts-producer", { epoch: 1, lingerMs: 0, onError: (e) => errors.push(e) })
  next.append(JSON.stringify({ n: 4 }))
  await next.flush()
  producer.append(JSON.stringify({ zombie: true })) // epoch 0 after epoch 1: fenced
  await producer.flush()
  assert.equal(errors.length, 1, String(errors))
  assert.ok(errors[0] instanceof StaleEpochError, String(errors[0]))
  errors.length = 0
  read = await readAll(undefined)
  assert.deepEqual(read.items, [{ n: 1 }, { n: 2 }, { n: 3 }, { n: 4 }])
  const saved = read.offset
  step("read", `4 items, next offset ${saved}; the stale epoch was fenced`)

  let live = await follow("sse", saved, 2, async () => {
    next.append(JSON.stringify({ n: 5 }))
    next.append(JSON.stringify({ n: 6 }))
    await next.flush()
  })
  assert.deepEqual(live.items, [{ n: 5 }, { n: 6 }])
  step("follow (SSE)", `2 items live, offset ${live.offset}`)

  live = await follow("long-poll", live.offset, 1, async () => {
    await new Promise((r) => setTimeout(r, 200))
    next.append(JSON.stringify({ n: 7 }))
    await next.flush()
  })
  assert.deepEqual(live.items, [{ n: 7 }])
  step("follow (long-poll)", `1 item live, offset ${live.offset}`)

  read = await readAll(saved)
  assert.deepEqual(read.items, [{ n: 5 }, { n: 6 }, { n: 7 }])
  read = await readAll(live.offset)
  assert.deepEqual(read.items, [])
  step("resume", `from ${saved}: 3 items; from ${live.offset}: none`)

  const closed = await next.close(JSON.stringify({ n: 8 }))
  assert.deepEqual(errors, [])
  read = await readAll(live.offset)
  assert.deepEqual(read.items, [{ n: 8 }])
  assert.equal(read.closed, true)
  assert.equal(read.offset, closed.finalOffset)
  step("close", `final offset ${closed.finalOffset}`)
  await handle.delete()
  step("delete")
}

main().then(
  () => console.log("client check passed"),
  (error) => {
    console.log(`not ok: ${error?.stack ?? error}`)
    process.exit(1)
  },
)
