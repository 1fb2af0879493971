// The Durable Streams reference server (npm @durable-streams/server), for comparison runs:
//   node reference-server.mjs [--port N] [--data-dir DIR] [--long-poll-ms MS] [--webhooks]
// In memory without --data-dir, file-backed (log files + LMDB) with it. Prints one line,
// `listening on http://127.0.0.1:PORT` on stdout once it accepts connections (its log goes to
// stderr); stops on SIGTERM/SIGINT.
import { DurableStreamTestServer } from "@durable-streams/server"
import { parseArgs } from "node:util"

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    "data-dir": { type: "string" },
    "long-poll-ms": { type: "string", default: "30000" },
    webhooks: { type: "boolean", default: false },
  },
})

const server = new DurableStreamTestServer({
  host: "127.0.0.1",
  port: Number(values.port),
  dataDir: values["data-dir"],
  longPollTimeout: Number(values["long-poll-ms"]),
  webhooks: values.webhooks,
})
const url = await server.start()
process.stdout.write(`listening on ${url}\n`)
// Whatever it logs from now on goes to stderr: stdout is the one line above.
console.log = console.info = console.error

let stopping = false
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, async () => {
    if (stopping) return
    stopping = true
    await server.stop()
    process.exit(0)
  })
}
