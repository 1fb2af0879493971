// Vitest setup file: every `fetch` of the test process (the suite's own calls and those of the
// @durable-streams/client it uses) carries `Authorization: Bearer $DS_TOKEN`.
//
// Headers are taken as the Fetch standard takes them for `fetch(input, init)`: those of
// `init.headers` when given (they replace a Request's own), else those of the Request `input`.
// An Authorization header the caller set itself is kept as it is. Without DS_TOKEN nothing is
// added (the reference server needs none).
const token = process.env.DS_TOKEN

export function withBearer(fetchImpl, bearer) {
  return function fetchWithBearer(input, init) {
    const given =
      init?.headers !== undefined ? init.headers : input instanceof Request ? input.headers : undefined
    const headers = new Headers(given)
    if (!headers.has("authorization")) headers.set("authorization", `Bearer ${bearer}`)
    return fetchImpl(input, { ...init, headers })
  }
}

if (token && !globalThis.fetch.withBearer) {
  const patched = withBearer(globalThis.fetch, token)
  patched.withBearer = true
  patched.unpatched = globalThis.fetch
  globalThis.fetch = patched
}
