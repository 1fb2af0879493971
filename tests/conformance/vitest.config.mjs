// The conformance run of tests/integration/test_durable_streams_conformance.py:
//   DS_BASE_URL=http://127.0.0.1:8080/api/durable-streams DS_TOKEN=... \
//   DS_LONG_POLL_TIMEOUT_MS=15000 npx vitest run
import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["*.test.mjs"],
    setupFiles: ["./setup.mjs"],
    // One file of ~330 tests against one server: no isolation needed beyond the suite's own
    // unique stream names.
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
