// The ductor-streams console. Everything it shows comes from the public HTTP API below
// /api/workflow-streams, read with the Bearer header like any other client.
//
//   token     kept in this tab's sessionStorage (never a cookie, never the URL query); also
//             taken from the fragment, #token=…&run=… (asked first if it would replace the
//             tab's token), which is then removed from the address bar. The browser's history
//             keeps the link it was opened with: a shared link is short-lived and revocable
//   api()     every request, and the problem+json answer of every error
//   runs      GET /runs, by prefix, a page at a time
//   run       GET /runs/{run}/streams every REFRESH_MS, the pages shown so far (one at
//             first, one more per "More streams"): each stream's state
//   follow    the live view of one stream: SSE read through fetch streaming (EventSource cannot
//             send a Bearer header), resumed with the last sequence after any cut
//   share     POST /tokens: a read-only token for the shown run only, expiring in minutes, and
//             the link #token=…&run=… that opens the run with it (needs streams:admin);
//             DELETE /tokens/{id} revokes the last one made
"use strict";

(() => {
  const API = "/api/workflow-streams";
  const TOKEN_KEY = "ductor-streams-token";
  const KEEP = 500; // records kept in the follow view: a page open for hours stays bounded
  const REFRESH_MS = 2000;
  const RUNS_PAGE = 50;
  const STREAMS_PAGE = 50; // a run of thousands of streams is read a page at a time
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  // A run's or stream's ID as the service has them: anything else from the address is refused
  // before it goes into a request's path (a "..", say, would move the request elsewhere).
  const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

  // -- DOM helpers (text only: nothing from the API is ever parsed as HTML) -------------------

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else if (name === "class") node.className = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "no limit";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    let v = n;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return `${i === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
  }

  // Local time, year first (a short locale date such as 12/7/26 reads differently by country).
  const TIME = new Intl.DateTimeFormat(undefined, { timeStyle: "medium" });
  const pad = (n) => String(n).padStart(2, "0");

  function when(iso) {
    if (!iso) return "—";
    const t = new Date(iso);
    const day = `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())}`;
    return h("time", { datetime: iso, title: iso }, `${day} ${TIME.format(t)}`);
  }

  const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;

  function seconds(s) {
    if (s === null || s === undefined) return null;
    if (s % 86400 === 0) return `${s / 86400} d`;
    if (s % 3600 === 0) return `${s / 3600} h`;
    if (s % 60 === 0) return `${s / 60} min`;
    return `${s} s`;
  }

  // -- token ---------------------------------------------------------------------------------

  const token = () => sessionStorage.getItem(TOKEN_KEY);

  const KEPT = "It stays in this tab only (session storage), never in a cookie or the address.";

  function askToken(why) {
    const dialog = $("token-dialog");
    $("token-why").textContent = why
      ? `${why} Give a bearer token (streams:read). ${KEPT}`
      : `Give a bearer token (streams:read). ${KEPT}`;
    if (dialog.open) return; // asked already: what is being typed stays
    $("token-input").value = "";
    dialog.showModal();
    $("token-input").focus();
  }

  function showWho() {
    $("who").textContent = token() ? "token set for this tab" : "no token";
    $("forget-token").hidden = !token();
  }

  function forgetToken() {
    sessionStorage.removeItem(TOKEN_KEY);
    follow.stop();
    leaveRun();
    $("streams").replaceChildren();
    $("runs-table").tBodies[0].replaceChildren();
    resetShare();
    showWho();
    clearProblem();
    history.replaceState(null, "", location.pathname);
    askToken("The token is forgotten in this tab.");
  }

  // -- the API and its problems --------------------------------------------------------------

  class Problem extends Error {
    constructor(status, title, detail, body) {
      super(`${title}: ${detail}`);
      this.status = status;
      this.title = title;
      this.detail = detail;
      this.body = body || {};
    }
  }

  async function api(path, { method = "GET", body, headers = {}, signal } = {}) {
    const t = token();
    if (!t) {
      askToken("");
      throw new Problem(401, "A token is needed", "Give a bearer token to read the API.");
    }
    let answer;
    try {
      answer = await fetch(API + path, {
        method,
        body,
        headers: { ...headers, Authorization: `Bearer ${t}` },
        signal,
        cache: "no-store",
      });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new Problem(0, "The service cannot be reached", String(error.message || error));
    }
    if (answer.ok) return answer;
    let problemBody = {};
    try { problemBody = await answer.json(); } catch { /* not problem JSON: the status says it */ }
    const problem = new Problem(
      answer.status,
      problemBody.title || `HTTP ${answer.status}`,
      problemBody.detail || answer.statusText || "",
      problemBody,
    );
    if (answer.status === 401) {
      $("who").textContent = "token refused";
      askToken(`${problem.title}: ${problem.detail}.`);
    }
    throw problem;
  }

  const getJson = async (path) => (await api(path)).json();

  // Who showed the problem: a background refresh clears only its own, so that a problem an
  // action met (a link not made, a follow refused) stays until the next action.
  let problemFrom = null;

  function showProblem(problem, from = "action") {
    const box = $("problem");
    box.replaceChildren(
      h("strong", {}, problem.title || "Error"),
      h("bdi", {}, problem.detail || String(problem.message || problem)),
    );
    box.hidden = false;
    problemFrom = from;
  }

  // No argument: any problem shown (the reader acted); else only one `from` showed.
  function clearProblem(from) {
    if (from !== undefined && problemFrom !== from) return;
    $("problem").hidden = true;
    problemFrom = null;
  }

  // -- runs ----------------------------------------------------------------------------------

  let runsAfter = null;

  // What the tenant holds against its limits (GET /usage): shown to a token that may see it (an
  // administrator's, not restricted to runs), left out for the others.
  let usageRefusedFor = null; // the token GET /usage refused: not asked again with it

  async function loadUsage() {
    const line = $("usage");
    if (usageRefusedFor === token()) { line.hidden = true; return; }
    try {
      const u = await getJson("/usage");
      const limit = (max, show) => (max === null ? "no limit" : show(max));
      const count = (n) => Number(n).toLocaleString("en");
      // "1 stream of 10,000", "3 tokens of no limit"
      const held = (n, one, max) => `${count(n)} ${n === 1 ? one : `${one}s`} of ${limit(max, count)}`;
      line.replaceChildren(
        "The tenant holds ",
        h("span", { "data-usage": "streams" }, held(u.streams, "stream", u.max_streams)),
        ", ",
        h("span", { "data-usage": "bytes" }, `${bytes(u.bytes)} of ${limit(u.max_bytes, bytes)}`),
        ", ",
        h("span", { "data-usage": "tokens" }, held(u.tokens, "token", u.max_tokens)),
        " and ",
        h("span", { "data-usage": "subscriptions" },
          held(u.subscriptions ?? 0, "subscription", u.max_subscriptions ?? null)),
        ".");
      line.hidden = false;
    } catch (problem) {
      if (problem instanceof Problem && problem.status === 403) usageRefusedFor = token();
      line.hidden = true;
    }
  }

  async function loadRuns(more) {
    const rows = $("runs-table").tBodies[0];
    if (!more) { rows.replaceChildren(); runsAfter = null; loadUsage(); }
    const query = new URLSearchParams({ limit: String(RUNS_PAGE) });
    const prefix = $("runs-prefix").value.trim();
    if (prefix && !ID.test(prefix)) {
      showProblem(new Problem(400, "Not a run ID prefix",
        "a run ID starts with a letter or a digit and holds letters, digits and . _ : - (at most 128)"));
      $("runs-empty").hidden = false;
      return;
    }
    if (prefix) query.set("prefix", prefix);
    if (runsAfter) query.set("after", runsAfter);
    try {
      const page = await getJson(`/runs?${query}`);
      clearProblem("runs");
      for (const run of page.runs) {
        rows.append(h("tr", { "data-run": run.run_id },
          h("td", {}, h("a", { href: `#run=${enc(run.run_id)}` }, run.run_id)),
          h("td", {}, run.stream_count),
          h("td", {}, when(run.created_at))));
      }
      runsAfter = page.next_after;
      $("runs-more").hidden = !runsAfter;
      $("runs-empty").hidden = rows.children.length > 0;
    } catch (problem) {
      showProblem(problem, "runs");
    }
  }

  // -- one run: its streams, refreshed -------------------------------------------------------

  let shownRun = null;
  let refreshTimer = null;
  let streamPages = 1; // how many pages of the run's streams are shown (and refreshed)

  // Whether a token may make links (streams:admin): asked once per token, of `GET /tokens`,
  // which needs the same scope, so that a read-only link's holder is not offered a form that
  // can only answer 403.
  const mayShare = new Map();

  async function offerShare() {
    const asked = token();
    if (!mayShare.has(asked)) {
      try {
        await api("/tokens?limit=1");
        mayShare.set(asked, true);
      } catch (problem) {
        if (!(problem instanceof Problem)) return; // unknown (the network): asked again later
        mayShare.set(asked, problem.status !== 403);
      }
    }
    if (asked === token()) $("share-form").hidden = !mayShare.get(asked);
  }

  function showRun(run) {
    if (shownRun === run) return;
    shownRun = run;
    resetShare();
    $("share-form").hidden = !mayShare.get(token()); // shown once the token is known to mint
    offerShare();
    streamPages = 1;
    clearInterval(refreshTimer);
    $("run-title").textContent = `Run ${run}`;
    $("run-title").focus(); // where a keyboard or a screen reader goes on: the run opened
    $("streams").replaceChildren();
    $("streams-more").hidden = true;
    refreshRun();
    refreshTimer = setInterval(() => { if (!document.hidden) refreshRun(); }, REFRESH_MS);
  }

  function leaveRun() {
    shownRun = null;
    clearInterval(refreshTimer);
  }

  let refreshing = null; // the run being read: a slow answer is not asked again on top of itself
  let refreshAgain = false; // asked for while one was under way ("More streams"): once it ends

  async function refreshRun() {
    const run = shownRun;
    if (refreshing === run) { refreshAgain = true; return; }
    refreshing = run;
    refreshAgain = false;
    try {
      const listed = [];
      let after = null;
      for (let page = 0; page < streamPages; page++) {
        const query = new URLSearchParams({ limit: String(STREAMS_PAGE) });
        if (after) query.set("after", after);
        const list = await getJson(`/runs/${enc(run)}/streams?${query}`);
        listed.push(...list.streams);
        after = list.next_after;
        if (!after) break;
      }
      // An input stream's delivery status is in its own document, not in the run's list.
      const streams = await Promise.all(listed.map((s) => (s.direction === "input"
        ? getJson(`/runs/${enc(run)}/streams/${enc(s.stream_id)}`) : s)));
      // Each stream's subscriptions (webhooks, pull-wake) and the cursor each holds on it.
      await Promise.all(streams.map(async (s) => {
        try {
          const found = await getJson(`/runs/${enc(run)}/streams/${enc(s.stream_id)}/subscriptions`);
          s.subscriptions = found.subscriptions;
        } catch {
          s.subscriptions = null;  // not shown rather than failing the run's view
        }
      }));
      if (run !== shownRun) return;
      clearProblem("refresh");
      renderStreams(run, streams);
      $("streams-more").hidden = !after;
      $("run-refreshed").textContent = `Last: ${new Date().toLocaleTimeString()}.`;
    } catch (problem) {
      if (run === shownRun) showProblem(problem, "refresh");
    } finally {
      if (refreshing === run) refreshing = null;
      if (refreshAgain && run === shownRun) refreshRun();
    }
  }

  function renderStreams(run, streams) {
    const box = $("streams");
    const cards = new Map([...box.children].map((card) => [card.dataset.stream, card]));
    for (const stream of streams) {
      let card = cards.get(stream.stream_id);
      cards.delete(stream.stream_id);
      if (!card) {
        // The heading and its button stay put across refreshes: keyboard focus is kept. The
        // button is beside the heading, not in it (a heading reads as the stream's ID alone).
        const title = h("div", { class: "stream-head" }, h("h3", {}, stream.stream_id),
          h("button", {
            type: "button",
            "aria-label": `Follow stream ${stream.stream_id}`,
            onclick: () => {
              // The last 100 records, or from the earliest retention kept if fewer are left.
              const head = Number(card.dataset.head);
              const from = Math.max(0, head - 100, Number(card.dataset.earliest) - 1);
              location.hash = `run=${enc(run)}&stream=${enc(stream.stream_id)}&from=${from}`;
            },
          }, "Follow"));
        card = h("article", { class: "stream", "data-stream": stream.stream_id }, title, h("div"));
        box.append(card);
      }
      card.dataset.head = stream.state.head;
      card.dataset.earliest = stream.state.earliest;
      card.lastChild.replaceWith(streamDetails(stream));
    }
    for (const gone of cards.values()) gone.remove();
    if (!streams.length) box.replaceChildren(h("p", {}, "This run has no streams."));
  }

  function field(name, label, ...value) {
    return [h("dt", {}, label), h("dd", { "data-field": name }, ...value)];
  }

  // A ceiling this high is none (a Durable Streams stream's: 2^53 - 1, the API says so).
  const NO_CEILING = Number.MAX_SAFE_INTEGER;

  function creditBar(name, unread, max, show) {
    const label = name === "items" ? "Unread items" : "Unread bytes";
    if (max >= NO_CEILING) return field(name, label, `${show(unread)} (no ceiling)`);
    return field(name, label,
      h("meter", { min: 0, max, value: unread, "aria-label": `${name} unread of ceiling` }),
      ` ${show(unread)} of ${show(max)}`);
  }

  function streamDetails(stream) {
    const { state, limits, retention, expiry, placement } = stream;
    const hold = state.legal_hold;
    const tags = h("p", {},
      h("span", { class: "tag" }, stream.direction), " ",
      h("span", { class: "tag" }, stream.content_class), " ",
      h("span", { class: `tag ${state.closed ? "closed" : "open"}` }, state.closed ? "closed" : "open"), " ",
      hold.enabled ? h("span", { class: "tag hold" }, "legal hold") : null);
    const keep = [
      retention.max_age_seconds !== null ? `at most ${seconds(retention.max_age_seconds)} old` : null,
      retention.max_records !== null ? `the last ${retention.max_records} records` : null,
    ].filter(Boolean).join(", ") || "everything";
    const expires = expiry.idle_seconds !== null
      ? `after ${seconds(expiry.idle_seconds)} without reads or writes`
      : expiry.expires_at ? ["at ", when(expiry.expires_at)] : "never";
    const list = h("dl", {},
      field("head", "Head", state.head),
      field("earliest", "Earliest", state.earliest),
      field("closed", "Closed", state.closed ? ["yes, ", when(state.closed_at)] : "no"),
      field("legal-hold", "Legal hold", hold.enabled
        ? ["on: ", h("bdi", {}, hold.reason || "(no reason)"), ", since ", when(hold.updated_at)]
        : "off"),
      field("totals", "Appended in all",
        `${plural(state.total_items, "record", "records")}, ${bytes(state.total_bytes)}`),
      creditBar("items", state.credit.unread_items, state.credit.max_unread_items, String),
      creditBar("bytes", state.credit.unread_bytes, state.credit.max_unread_bytes, bytes),
      field("policy", "When full", limits.unread_policy === "block"
        ? `block up to ${limits.block_timeout_seconds} s` : "reject (429)"),
      field("retention", "Retention", `keep ${keep}`),
      field("expiry", "Expiry", expires),
      field("placement", "Placement",
        `home ${placement.metadata_home}`,
        placement.metadata_replicas.length ? `, replicas ${placement.metadata_replicas.join(" ")}` : "",
        `, objects in ${placement.object_regions.join(" ")}, egress ${placement.client_egress_regions.join(" ")}, logs ${placement.log_region}`),
      state.input_delivery ? field("input-delivery", "Input delivery",
        `delivered through ${state.input_delivery.delivered_through}, ${state.input_delivery.pending} pending`,
        state.input_delivery.last_error
          ? h("span", { class: "bad" }, ", last error: ", h("bdi", {}, state.input_delivery.last_error))
          : "") : null);
    return h("div", {}, tags, list,
      // The document carries the first consumers by ID and the count of all of them.
      table(state.consumer_count > state.consumers.length
        ? `Consumers (the first ${state.consumers.length} of ${state.consumer_count})` : "Consumers",
      ["Consumer", "Acked", "Lag", "Holds credit"], state.consumers.map((c) =>
        h("tr", { "data-consumer": c.consumer_id },
          h("td", {}, c.consumer_id), h("td", {}, c.acked_sequence),
          h("td", { "data-lag": "" }, state.head - c.acked_sequence),
          h("td", { "data-holds-credit": "" }, c.holds_credit === false ? "no (tracks only)" : "yes")))),
      stream.subscriptions ? table("Subscriptions", ["Subscription", "Type", "Link", "Acked", "Status"],
        stream.subscriptions.map((sub) => {
          const link = sub.streams.find((l) => l.run_id === stream.run_id && l.stream_id === stream.stream_id)
            || { link_type: "-", acked_sequence: "-" };
          const target = sub.webhook ? sub.webhook.url : sub.wake_stream
            ? `wake stream ${sub.wake_stream.run_id}/${sub.wake_stream.stream_id}` : "";
          return h("tr", { "data-subscription": sub.id },
            h("td", { title: sub.description || "" }, sub.id),
            h("td", { title: target }, sub.type),
            h("td", {}, link.link_type),
            h("td", { "data-acked": "" }, link.acked_sequence),
            h("td", { class: sub.status === "failed" ? "bad" : "" },
              sub.wake ? `${sub.status}, waking (generation ${sub.wake.generation})` : sub.status));
        })) : null,
      table(openObjectsCaption(state), ["Object", "State", "Size", "Upload by"], (state.open_objects || []).map((o) =>
        h("tr", { "data-object": o.object_id },
          h("td", { class: "mono", title: o.object_id }, `${o.object_id.slice(0, 16)}…`),
          h("td", {}, o.state),
          h("td", {}, bytes(o.size)), h("td", {}, when(o.expires_at))))));
  }

  // The document shows the first open objects only; its counts are of all of them.
  function openObjectsCaption(state) {
    const shown = (state.open_objects || []).length;
    const count = state.open_objects_count ?? shown;
    const pledged = state.open_objects_bytes ? `, ${bytes(state.open_objects_bytes)} pledged` : "";
    return count > shown
      ? `Open objects (the oldest ${shown} of ${count}${pledged})`
      : `Open objects${pledged ? ` (${pledged.slice(2)})` : ""}`;
  }

  function table(caption, heads, rows) {
    if (!rows.length) return h("p", {}, `${caption}: none.`);
    return h("table", {}, h("caption", { class: "hint" }, caption),
      h("thead", {}, h("tr", {}, heads.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, rows));
  }

  // -- follow: the live view of one stream ---------------------------------------------------

  const RESUME = Symbol("resume"); // a live read ended by retention: read on from the earliest

  const follow = {
    run: null,
    stream: null,
    last: 0, // the cursor: every (re)connection asks for what follows it
    shown: null, // the last sequence shown (null: none yet)
    generation: 0, // bumped by start and stop: a superseded loop ends at its next step
    controller: null,
    active: false,
    from: 0, // where this view started
    reconnects: 0,
    gaps: 0,

    start(run, stream, cursor) {
      this.stop();
      Object.assign(this, {
        run, stream, from: cursor, last: cursor, shown: null, reconnects: 0, gaps: 0,
      });
      this.active = true;
      $("follow-title").textContent = `Live: ${stream}`;
      $("follow-close").href = `#run=${enc(run)}`;
      $("follow-from").value = String(cursor);
      $("records").replaceChildren();
      $("follow-skipped").textContent = "";
      this.loop(this.generation);
    },

    stop() {
      this.active = false;
      this.generation += 1;
      if (this.controller) this.controller.abort();
      this.controller = null;
    },

    status(text, live) {
      const line = $("follow-status");
      const shown = this.shown === null ? "none yet" : this.shown;
      line.textContent = `${text} Last sequence shown: ${shown}. Reconnects: ${this.reconnects}. Gaps: ${this.gaps}.`;
      line.className = live ? "live" : "down";
    },

    // Retention removed records after the cursor before they were shown: the view goes on from
    // the earliest kept, and says what it skipped (a gap), rather than stopping for good.
    skip(earliest) {
      const first = this.last + 1;
      this.last = earliest - 1;
      this.gaps += 1;
      $("follow-skipped").textContent = first === earliest - 1
        ? `Retention removed record ${first} before it was shown.`
        : `Retention removed records ${first} to ${earliest - 1} before they were shown.`;
    },

    async loop(generation) {
      let delay = 250;
      while (generation === this.generation) {
        this.controller = new AbortController();
        let ended = null;
        try {
          const answer = await api(
            `/runs/${enc(this.run)}/streams/${enc(this.stream)}/subscribe?cursor=${this.last}`,
            { headers: { Accept: "text/event-stream", "Last-Event-ID": String(this.last) },
              signal: this.controller.signal });
          this.status("Live.", true);
          delay = 250;
          ended = await this.read(answer.body, generation);
        } catch (error) {
          if (generation !== this.generation) return;
          // Records removed by retention before the cursor: on from the earliest kept.
          const earliest = error instanceof Problem ? error.body.earliest : undefined;
          if (error.status === 410 && error.body.code === "cursor-expired"
              && Number.isInteger(earliest) && earliest - 1 > this.last) {
            this.skip(earliest);
            continue;
          }
          // A refusal that retrying cannot mend (no token, no such stream, cursor ahead of the
          // head): say so and stop. Anything else (a restart, a dropped connection, 503) is
          // retried.
          if (error instanceof Problem && error.status >= 400 && error.status < 500
              && error.status !== 429) {
            showProblem(error);
            this.active = false;
            // The detail too: on a narrow screen the problem box is above, out of sight.
            this.status(`Stopped: ${error.title}${error.detail ? ` (${error.detail})` : ""}.`, false);
            return;
          }
        }
        if (generation !== this.generation) return;
        if (ended === RESUME) {
          delay = 250;
          continue; // overtaken by retention: `skip` moved the cursor on
        }
        if (ended) {
          this.active = false;
          this.status(ended, false);
          return;
        }
        this.reconnects += 1;
        this.status("Connection lost; reconnecting…", false);
        await new Promise((resolve) => { setTimeout(resolve, delay); });
        delay = Math.min(delay * 2, 4000);
      }
    },

    // Reads `text/event-stream` from the response body; answers how the stream ended (closed,
    // gone, deleted) or null when the connection was cut.
    async read(body, generation) {
      const reader = body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      let event = {};
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done || generation !== this.generation) return null;
          buffer += decoder.decode(value, { stream: true });
          const lines = buffer.split("\n");
          buffer = lines.pop(); // an incomplete line waits for the next chunk
          const batch = []; // this chunk's records, rendered together
          let ended = null;
          for (let line of lines) {
            if (line.endsWith("\r")) line = line.slice(0, -1);
            if (line === "") {
              ended = this.dispatch(event, batch);
              event = {};
              if (ended) break;
            } else if (!line.startsWith(":")) { // a comment line is a heartbeat
              const colon = line.indexOf(":");
              const name = colon < 0 ? line : line.slice(0, colon);
              let text = colon < 0 ? "" : line.slice(colon + 1);
              if (text.startsWith(" ")) text = text.slice(1);
              if (name === "data") event.data = event.data === undefined ? text : `${event.data}\n${text}`;
              else if (name === "event" || name === "id") event[name] = text;
            }
          }
          if (batch.length) {
            showRecords(this.run, this.stream, batch);
            this.status("Live.", true);
          }
          if (ended) return ended;
        }
      } finally {
        reader.cancel().catch(() => {});
      }
    },

    dispatch(event, batch) {
      if (event.event === "record") {
        const sequence = Number(event.id);
        if (!(sequence > this.last)) return null; // already shown: never twice
        if (sequence !== this.last + 1) this.gaps += 1;
        this.last = sequence;
        this.shown = sequence;
        batch.push(JSON.parse(event.data));
        if (batch.length > KEEP) batch.shift(); // would leave the view at once
        return null;
      }
      if (event.event === "closed") return `The stream is closed; every record was shown (head ${JSON.parse(event.data).head}).`;
      if (event.event === "deleted") return "The stream was deleted.";
      if (event.event === "gone") {
        const gone = JSON.parse(event.data);
        if (!Number.isInteger(gone.earliest)) return "Stopped: retention removed records not yet shown.";
        this.skip(gone.earliest);
        return RESUME;
      }
      return null;
    },
  };

  function showRecords(run, stream, records) {
    const list = $("records");
    const atBottom = list.scrollTop + list.clientHeight >= list.scrollHeight - 8;
    const items = document.createDocumentFragment();
    for (const record of records) {
      items.append(h("li", { "data-seq": record.sequence },
        h("div", { class: "meta" }, h("strong", {}, `#${record.sequence}`), h("br"),
          when(record.appended_at), h("br"), `${record.content_type}, ${bytes(record.size)}`),
        recordBody(run, stream, record)));
    }
    list.append(items);
    for (let extra = list.children.length - KEEP; extra > 0; extra -= 1) list.firstElementChild.remove();
    if (atBottom) list.scrollTop = list.scrollHeight;
  }

  const TEXTUAL = /^text\/|[/+]json\b|^application\/(xml|x-ndjson|javascript)\b/;

  function recordBody(run, stream, record) {
    if ("data" in record) return h("pre", { class: "json" }, JSON.stringify(record.data, null, 2));
    if ("object" in record) {
      const o = record.object;
      const path = `/runs/${enc(run)}/streams/${enc(stream)}/objects/${enc(o.object_id)}/body`;
      return h("div", { class: "object" }, `object ${o.object_id}, ${o.content_type}, ${bytes(o.size)} `,
        h("a", { href: API + path, download: o.object_id, onclick: (e) => { e.preventDefault(); download(path, o); } },
          "Download body"));
    }
    const raw = atob(record.data_base64);
    const octets = Uint8Array.from(raw, (c) => c.charCodeAt(0));
    if (TEXTUAL.test(record.content_type)) {
      try {
        return h("pre", { class: "text" }, new TextDecoder("utf-8", { fatal: true }).decode(octets));
      } catch { /* not UTF-8 after all: shown as bytes */ }
    }
    const shown = [...octets.subarray(0, 1024)].map((b) => b.toString(16).padStart(2, "0"));
    const lines = [];
    for (let i = 0; i < shown.length; i += 16) lines.push(shown.slice(i, i + 16).join(" "));
    if (octets.length > 1024) lines.push(`… ${octets.length - 1024} more bytes`);
    return h("pre", { class: "hex" }, lines.join("\n"));
  }

  async function download(path, object) {
    try {
      const blob = await (await api(path)).blob();
      const url = URL.createObjectURL(blob);
      const link = h("a", { href: url, download: object.object_id, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
    } catch (problem) {
      showProblem(problem);
    }
  }

  // -- share: a read-only link to the shown run ----------------------------------------------

  let sharedTokenId = null; // the last link's token, until it is revoked

  function resetShare() {
    $("share-link").hidden = true;
    $("share-link").value = "";
    $("share-copy").hidden = true;
    $("share-revoke").hidden = true;
    $("share-status").textContent = "";
    sharedTokenId = null;
  }

  const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

  async function share(run) {
    const minutes = Math.min(1440, Math.max(1, Number.parseInt($("share-minutes").value, 10) || 10));
    $("share-status").textContent = "Making a link…";
    try {
      const answer = await api("/tokens", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        // A principal of its own: the link's holder must not act as the minter (ack the
        // minter's consumers, spend the minter's live connections).
        body: JSON.stringify({
          principal: `shared-link-${hex(crypto.getRandomValues(new Uint8Array(4)))}`,
          scopes: ["streams:read"], expires_in_seconds: minutes * 60, runs: [run],
        }),
      });
      const minted = await answer.json();
      if (run !== shownRun) return;
      const link = `${location.origin}${location.pathname}#token=${enc(minted.token)}&run=${enc(run)}`;
      $("share-link").value = link;
      $("share-link").hidden = false;
      $("share-copy").hidden = false;
      $("share-revoke").hidden = false;
      sharedTokenId = minted.id;
      $("share-status").replaceChildren(
        `Anyone with this link can read run ${run} until `, when(minted.expires_at),
        `, and nothing else (token ${minted.id}; a browser that opens it keeps it in its history).`);
      clearProblem();
    } catch (problem) {
      // Said beside the button too: the reader looks there for what the click did.
      $("share-status").textContent = `No link made: ${problem.title}.`;
      if (problem instanceof Problem && problem.status === 403) mayShare.set(token(), false);
      showProblem(problem);
    }
  }

  async function revokeLink() {
    if (!sharedTokenId) return;
    try {
      await api(`/tokens/${enc(sharedTokenId)}`, { method: "DELETE" });
      const id = sharedTokenId;
      resetShare();
      $("share-status").textContent = `Link revoked (token ${id}).`;
      $("share-mint").focus(); // (the button pressed is hidden now: on to the one beside it)
      clearProblem();
    } catch (problem) {
      showProblem(problem);
    }
  }

  async function copyLink() {
    const input = $("share-link");
    try {
      await navigator.clipboard.writeText(input.value);
    } catch {
      input.select(); // no clipboard permission: the link is selected for a manual copy
      document.execCommand("copy");
    }
    $("share-status").textContent = "Link copied.";
  }

  // -- where we are: the fragment ------------------------------------------------------------

  let restartNeeded = false; // a link's token replaced the tab's: read everything again

  function route() {
    const params = new URLSearchParams(location.hash.slice(1));
    if (params.has("token")) {
      // Taken into this tab's storage and out of the address bar (the history keeps the link
      // it was opened with). A link never silently swaps the token this tab already uses: the
      // reader would take another tenant's runs for their own.
      const given = params.get("token");
      const current = token();
      if (!current || current === given
          || window.confirm("This link carries another token than the one this tab uses. Use the link's token instead?")) {
        sessionStorage.setItem(TOKEN_KEY, given);
        if (current && current !== given) restartNeeded = true;
      }
      params.delete("token");
      history.replaceState(null, "", `${location.pathname}${location.search}#${params}`);
      showWho();
    }
    if (restartNeeded) {
      restartNeeded = false;
      shownRun = null;
      follow.run = null;
    }
    const run = params.get("run");
    const stream = params.get("stream");
    for (const [what, id] of [["run", run], ["stream", stream]]) {
      if (id && !ID.test(id)) {
        const refused = new Problem(400, "Not an ID", `the address names ${what} ${JSON.stringify(id)}, which is no ${what} ID`);
        showProblem(refused);
        history.replaceState(null, "", location.pathname);
        leaveRun();
        follow.stop();
        $("runs-view").hidden = false;
        $("run-view").hidden = true;
        $("back").hidden = true;
        $("follow-view").hidden = true;
        // Said again once the runs are shown: their answer clears the problem shown before.
        loadRuns(false).finally(() => showProblem(refused));
        return;
      }
    }
    $("runs-view").hidden = Boolean(run);
    $("run-view").hidden = !run;
    $("back").hidden = !run;
    $("follow-view").hidden = !(run && stream);
    $("run-layout").classList.toggle("following", Boolean(run && stream));
    if (!run) {
      const left = shownRun; // back from a run: the keyboard goes on at the runs' heading
      leaveRun();
      follow.stop();
      loadRuns(false);
      if (left) $("runs-title").focus();
      return;
    }
    showRun(run);
    if (!stream) {
      // The live view closed: the keyboard goes back to the Follow button that opened it.
      const closed = follow.stream;
      follow.stop();
      follow.stream = null;
      const card = [...$("streams").children].find((c) => c.dataset.stream === closed);
      if (closed && card) card.querySelector("button").focus();
      return;
    }
    const from = Math.max(0, Number.parseInt(params.get("from") || "0", 10) || 0);
    if (!follow.active || follow.run !== run || follow.stream !== stream || follow.from !== from) {
      follow.start(run, stream, from);
      showFollowed(stream);
      // On to the live view, not through every other card's Follow button first.
      $("follow-title").focus({ preventScroll: true });
    }
  }

  // The live view where the eye is: on a wide screen it sits beside the cards and stays in sight
  // (sticky), and the followed card is kept in sight beside it; stacked on a narrow one, it comes
  // first (after the back link) and is scrolled to, wherever the Follow button that opened it was.
  function showFollowed(stream) {
    const view = $("follow-view");
    if (getComputedStyle(view).position === "sticky") {
      const card = [...$("streams").children].find((c) => c.dataset.stream === stream);
      if (card) card.scrollIntoView({ block: "nearest" });
    } else {
      $("run-layout").scrollIntoView({ block: "start" }); // the back link, then the view
    }
  }

  function restart() {
    // A new token: everything is read again with it.
    shownRun = null;
    follow.run = null;
    route();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("follow-keep").textContent = String(KEEP);
    $("token-form").addEventListener("submit", () => {
      const value = $("token-input").value.trim();
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      showWho();
      clearProblem();
      restart();
      // On to the content (the closing dialog would give focus back to its opener).
      setTimeout(() => ($("runs-view").hidden ? $("run-title") : $("runs-title")).focus(), 0);
    });
    $("change-token").addEventListener("click", () => askToken(""));
    $("forget-token").addEventListener("click", forgetToken);
    $("runs-search").addEventListener("submit", (e) => { e.preventDefault(); loadRuns(false); });
    $("runs-more").addEventListener("click", () => loadRuns(true));
    $("streams-more").addEventListener("click", () => { streamPages += 1; refreshRun(); });
    $("follow-form").addEventListener("submit", (e) => {
      e.preventDefault();
      clearProblem(); // the reader acted: what the last follow met is no longer the news
      const from = Math.max(0, Number.parseInt($("follow-from").value, 10) || 0);
      follow.start(follow.run, follow.stream, from);
      const params = new URLSearchParams(location.hash.slice(1));
      params.set("from", String(from));
      history.replaceState(null, "", `#${params}`);
    });
    $("share-form").addEventListener("submit", (e) => { e.preventDefault(); share(shownRun); });
    $("share-copy").addEventListener("click", copyLink);
    $("share-revoke").addEventListener("click", revokeLink);
    $("follow-stop").addEventListener("click", () => {
      clearProblem();
      follow.stop();
      follow.status("Stopped.", false);
    });
    // Going elsewhere is the reader's next action: what the last one met is cleared.
    window.addEventListener("hashchange", () => { clearProblem(); route(); });
    showWho();
    route();
  });
})();
