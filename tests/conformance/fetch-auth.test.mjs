// The setup file's header handling, against a local echo server (no Durable Streams server).
import { createServer } from "node:http"
import { afterAll, beforeAll, describe, expect, test } from "vitest"
import { withBearer } from "./setup.mjs"

let server
let url
const plainFetch = globalThis.fetch.unpatched ?? globalThis.fetch

beforeAll(async () => {
  server = createServer((req, res) => {
    res.writeHead(200, { "content-type": "application/json" })
    res.end(JSON.stringify(req.headers))
  })
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve))
  url = `http://127.0.0.1:${server.address().port}/echo`
})
afterAll(() => new Promise((resolve) => server.close(resolve)))

describe("setup: Bearer on every fetch", () => {
  const fetchB = withBearer(plainFetch, "tok")
  const echo = async (...args) => (await fetchB(...args)).json()

  test("a URL alone", async () => {
    expect((await echo(url)).authorization).toBe("Bearer tok")
  })
  test("init headers (object, array, Headers) are kept", async () => {
    for (const headers of [{ "x-a": "1" }, [["x-a", "1"]], new Headers({ "x-a": "1" })]) {
      const seen = await echo(url, { headers })
      expect(seen["x-a"]).toBe("1")
      expect(seen.authorization).toBe("Bearer tok")
    }
  })
  test("a Request's headers, method and body are kept", async () => {
    const request = new Request(url, { method: "POST", headers: { "x-r": "2" }, body: "hi" })
    const seen = await echo(request)
    expect(seen["x-r"]).toBe("2")
    expect(seen["content-length"]).toBe("2")
    expect(seen.authorization).toBe("Bearer tok")
  })
  test("init headers replace a Request's, as fetch(request, init) does", async () => {
    const seen = await echo(new Request(url, { headers: { "x-r": "2" } }), {
      headers: { "x-i": "3" },
    })
    expect(seen["x-r"]).toBeUndefined()
    expect(seen["x-i"]).toBe("3")
    expect(seen.authorization).toBe("Bearer tok")
  })
  test("an Authorization the caller set wins", async () => {
    expect((await echo(url, { headers: { Authorization: "Bearer own" } })).authorization).toBe(
      "Bearer own",
    )
    expect((await echo(new Request(url, { headers: { authorization: "x" } }))).authorization).toBe(
      "x",
    )
  })
})
