"""The console in a real browser: Debian's Chromium, headless, driven by playwright, against a
real server process and worker on PostgreSQL.

Playwright never downloads a browser here: it is pointed at /usr/bin/chromium, which
`python3 dev.py test` installs when missing. A machine without it fails these tests (a skipped
browser test proves nothing). Screenshots and the measured figures go to the test run's
artefacts (DUCTOR_STREAMS_TEST_ARTEFACTS, default .test-artefacts/ in the repository);
DUCTOR_STREAMS_UPDATE_SCREENSHOT=1 also writes docs/img/console.png."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ROOT, ServerProcess, WorkerProcess

CHROMIUM = Path("/usr/bin/chromium")
API = "/api/workflow-streams"
ARTEFACTS = Path(os.environ.get("DUCTOR_STREAMS_TEST_ARTEFACTS", ROOT / ".test-artefacts"))
SCREENSHOT = ROOT / "docs" / "img" / "console.png"
WAIT_MS = 15_000  # how long an expectation may take on a slow machine (not a speed check)

# Records the moment each record element enters the page, on the page's own clock (ms since
# the epoch, as time.time() * 1000 in the test: one machine, one clock).
# Every `every`-th sequence only, so that the bookkeeping itself stays small.
OBSERVE_RECORDS = """(every) => {
  window.__shown = {};
  new MutationObserver((mutations) => {
    const now = performance.timeOrigin + performance.now();
    for (const m of mutations) for (const node of m.addedNodes)
      if (node.dataset && node.dataset.seq % every === 0) window.__shown[node.dataset.seq] = now;
  }).observe(document.getElementById("records"), { childList: true });
}"""
SHOWN_SEQUENCES = "() => [...document.querySelectorAll('#records li')].map((li) => +li.dataset.seq)"


@pytest.fixture(scope="module")
def artefacts() -> Path:
    path = ARTEFACTS / "console"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def console_server(
    own_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server of this module's own (the restart test stops and starts it) and a worker, which
    delivers the input streams' records."""
    data = tmp_path_factory.mktemp("console")
    # Small pools: these two processes share the PostgreSQL with the session's servers.
    env = {**SERVER_ENV, "DUCTOR_STREAMS_POOL_MIN_SIZE": "1", "DUCTOR_STREAMS_POOL_MAX_SIZE": "4"}
    server = ServerProcess(database_url=own_database, data_dir=data, env=env).start()
    worker = WorkerProcess(database_url=own_database, data_dir=data, env=env).start()
    yield server
    worker.stop()
    server.stop()


@pytest.fixture(scope="module")
def browser(console_server: ServerProcess) -> Iterator[Browser]:
    # After the server's fixtures: playwright's sync API keeps an event loop of its own running
    # in this thread, and the database fixture's asyncio.run must not find one.
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser tests need Chromium at {CHROMIUM} (`python3 dev.py test` installs it "
            "as root: apt-get update && apt-get install -y chromium)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield page
    context.close()
    # A failed fetch is logged by the browser as an error while the server is down: only script
    # errors and CSP refusals count.
    script_errors = [e for e in errors if "Failed to load resource" not in e]
    assert script_errors == []


@pytest.fixture
def api(console_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=console_server.base_url + API,
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        timeout=30,
    ) as client:
        yield client


def created(answer: httpx.Response) -> dict:
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def append(api: httpx.Client, path: str, *records: dict) -> dict:
    return created(api.post(f"{path}/records", json={"records": list(records)}))


def demo_run(api: httpx.Client) -> tuple[str, str]:
    """A run with an output stream (JSON, text, bytes and an object record, an open intent, a
    consumer), an input stream and a stream with retention and expiry."""
    run = "checkout-" + secrets.token_hex(3)
    tokens = f"/runs/{run}/streams/tokens"
    created(
        api.post(
            f"/runs/{run}/streams",
            json={
                "stream_id": "tokens",
                "direction": "output",
                "content_class": "model_output",
                "limits": {"max_unread_items": 50, "max_unread_bytes": 4096},
            },
        )
    )
    append(
        api,
        tokens,
        {"data": {"text": "Hello", "tokens": 1}},
        {"data": {"text": " world", "tokens": 2, "done": False}},
        {
            "data_base64": base64.b64encode("plain text, äöü".encode()).decode(),
            "content_type": "text/plain",
        },
        {
            "data_base64": base64.b64encode(bytes(range(20))).decode(),
            "content_type": "application/octet-stream",
        },
    )
    body = b"a small report\n"
    intent = created(
        api.post(
            f"{tokens}/objects",
            json={
                "idempotency_key": "report",
                "size": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
                "content_type": "text/plain",
            },
        )
    )
    assert api.put(f"{tokens}/objects/{intent['object_id']}/body", content=body).status_code == 200
    created(api.post(f"{tokens}/objects/{intent['object_id']}/commit"))
    created(
        api.post(
            f"{tokens}/objects",
            json={
                "idempotency_key": "pending",
                "size": 10,
                "sha256": "0" * 64,
                "content_type": "image/png",
            },
        )
    )
    created(api.post(f"{tokens}/consumers/ui/ack", json={"sequence": 2}))
    created(api.post(f"/runs/{run}/streams", json={"stream_id": "approvals", "direction": "input"}))
    append(
        api, f"/runs/{run}/streams/approvals", {"data": {"approved": True}}, {"data": {"by": "ops"}}
    )
    created(
        api.post(
            f"/runs/{run}/streams",
            json={
                "stream_id": "logs",
                "direction": "output",
                "content_class": "logs",
                "retention": {"max_age_seconds": 86400, "max_records": 1000},
                "expiry": {"idle_seconds": 3600},
            },
        )
    )
    append(api, f"/runs/{run}/streams/logs", {"data": {"level": "info", "msg": "started"}})
    # More open objects than the stream document shows (its first 20, and the counts of all).
    for n in range(22):
        created(
            api.post(
                f"/runs/{run}/streams/logs/objects",
                json={"idempotency_key": f"dump-{n}", "size": 10, "sha256": "0" * 64},
            )
        )
    return run, tokens


def open_console(page: Page, server: ServerProcess) -> None:
    """Load the page without a token, see it ask for one, and give it."""
    page.goto(server.base_url + "/console")
    expect(page.locator("#token-dialog")).to_be_visible()
    page.get_by_role("textbox", name="Token").fill(BOOTSTRAP_TOKEN)
    page.keyboard.press("Enter")
    expect(page.locator("#token-dialog")).to_be_hidden()


def stream_field(page: Page, stream: str, name: str):
    return page.locator(f'[data-stream="{stream}"] [data-field="{name}"]')


def test_the_console_shows_runs_streams_and_follows_live(
    page: Page, console_server: ServerProcess, api: httpx.Client, artefacts: Path
) -> None:
    run, tokens = demo_run(api)
    open_console(page, console_server)
    # The token is in the tab's session storage, nowhere else.
    assert page.evaluate("sessionStorage.getItem('ductor-streams-token')") == BOOTSTRAP_TOKEN
    assert page.context.cookies() == [] and BOOTSTRAP_TOKEN not in page.url

    # The runs, searched by prefix; then the run.
    page.get_by_label("Run ID starts with").fill(run[:-1])
    page.get_by_role("button", name="Search").click()
    expect(page.locator(f'tr[data-run="{run}"] td').nth(1)).to_have_text("3", timeout=WAIT_MS)
    page.get_by_role("link", name=run).click()
    expect(page.locator("#run-title")).to_have_text(f"Run {run}")

    # Each stream's state.
    expect(stream_field(page, "tokens", "head")).to_have_text("5", timeout=WAIT_MS)
    expect(stream_field(page, "tokens", "earliest")).to_have_text("1")
    expect(stream_field(page, "tokens", "closed")).to_have_text("no")
    expect(stream_field(page, "tokens", "legal-hold")).to_have_text("off")
    expect(stream_field(page, "tokens", "items")).to_contain_text("3 of 50")
    assert (
        page.locator('[data-stream="tokens"] [data-field="items"] meter').get_attribute("value")
        == "3"
    )
    expect(page.locator('[data-stream="tokens"] [data-consumer="ui"] [data-lag]')).to_have_text("3")
    expect(
        page.locator('[data-stream="tokens"] [data-consumer="ui"] [data-holds-credit]')
    ).to_have_text("yes")
    expect(page.locator('[data-stream="tokens"] tr[data-object] td').nth(1)).to_have_text(
        "prepared"
    )
    expect(page.locator('[data-stream="tokens"] caption', has_text="Open objects")).to_have_text(
        "Open objects (10 B pledged)"
    )
    expect(page.locator('[data-stream="logs"] caption', has_text="Open objects")).to_have_text(
        "Open objects (the oldest 20 of 22, 220 B pledged)"
    )
    expect(page.locator('[data-stream="logs"] tr[data-object]')).to_have_count(20)
    expect(stream_field(page, "logs", "retention")).to_have_text(
        "keep at most 1 d old, the last 1000 records"
    )
    expect(stream_field(page, "logs", "expiry")).to_have_text("after 1 h without reads or writes")
    expect(stream_field(page, "logs", "placement")).to_contain_text("home ")
    expect(stream_field(page, "approvals", "input-delivery")).to_have_text(
        "delivered through 2, 0 pending", timeout=WAIT_MS
    )

    # Follow the output stream from the start: JSON pretty-printed, text as text, bytes as hex,
    # the object record linked to its body.
    page.get_by_role("button", name="Follow stream tokens").click()
    page.get_by_label("From sequence (exclusive cursor)").fill("0")
    page.get_by_role("button", name="Follow from here").click()
    records = page.locator("#records li")
    expect(records).to_have_count(5, timeout=WAIT_MS)
    assert records.nth(0).locator("pre.json").inner_text() == json.dumps(
        {"text": "Hello", "tokens": 1}, indent=2
    )
    assert records.nth(2).locator("pre.text").inner_text() == "plain text, äöü"
    assert records.nth(3).locator("pre.hex").inner_text().startswith("00 01 02 03")
    with page.expect_download() as download:
        records.nth(4).get_by_role("link", name="Download body").click()
    assert Path(download.value.path()).read_bytes() == b"a small report\n"

    # A record appended through the API appears in the page; the time from the append request
    # to the page is measured (and reported), not asserted.
    page.evaluate(OBSERVE_RECORDS, 1)
    latencies = []
    for n in range(20):
        sent = time.time() * 1000
        sequence = append(api, tokens, {"data": {"n": n}})["last_sequence"]
        expect(page.locator(f'#records li[data-seq="{sequence}"]')).to_be_visible(timeout=WAIT_MS)
        latencies.append(page.evaluate(f"window.__shown['{sequence}']") - sent)
        created(api.post(f"{tokens}/consumers/ui/ack", json={"sequence": sequence}))
    # Acknowledged: the lag and the credit change in the page.
    expect(page.locator('[data-stream="tokens"] [data-consumer="ui"] [data-lag]')).to_have_text(
        "0", timeout=WAIT_MS
    )
    expect(stream_field(page, "tokens", "items")).to_contain_text("0 of 50", timeout=WAIT_MS)

    # A legal hold set through the API shows, with its reason.
    created(api.put(f"{tokens}/legal-hold", json={"enabled": True, "reason": "case 42"}))
    expect(stream_field(page, "tokens", "legal-hold")).to_contain_text(
        "on: case 42", timeout=WAIT_MS
    )
    # Five more, not yet acknowledged: the lag and the credit bars show them.
    append(
        api, tokens, *({"data": {"text": word}} for word in ("one", "two", "three", "four", "five"))
    )
    expect(page.locator('[data-stream="tokens"] [data-consumer="ui"] [data-lag]')).to_have_text(
        "5", timeout=WAIT_MS
    )
    expect(page.locator('#records li[data-seq="30"]')).to_be_visible(timeout=WAIT_MS)
    page.evaluate("window.scrollTo(0, 0); document.getElementById('records').scrollTop = 0")
    page.screenshot(path=artefacts / "console.png", full_page=True)
    if os.environ.get("DUCTOR_STREAMS_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOT, full_page=True)
    figures = {
        "append_request_to_page_ms": {
            "median": round(statistics.median(latencies), 1),
            "max": round(max(latencies), 1),
            "samples": len(latencies),
        }
    }
    (artefacts / "latency.json").write_text(json.dumps(figures, indent=2))
    print(figures)


IN_VIEWPORT = """(id) => {
  const box = document.getElementById(id).getBoundingClientRect();
  return {top: box.top, bottom: box.bottom, left: box.left, right: box.right,
          width: innerWidth, height: innerHeight};
}"""


def assert_in_viewport(page: Page, element_id: str) -> None:
    """The element is entirely inside the window, as it is drawn (not merely in the page)."""
    box = page.evaluate(IN_VIEWPORT, element_id)
    assert box["top"] >= 0 and box["bottom"] <= box["height"], box
    assert box["left"] >= 0 and box["right"] <= box["width"], box


@pytest.mark.parametrize(
    ("width", "layout"), [(1400, "beside"), (800, "stacked")], ids=["wide", "narrow"]
)
def test_follow_shows_the_live_view_in_sight_and_a_link_leads_back_to_the_runs(
    page: Page,
    console_server: ServerProcess,
    api: httpx.Client,
    artefacts: Path,
    width: int,
    layout: str,
) -> None:
    """The live view opened by a card's Follow button far down a run's page is where the eye
    is (beside the cards, or scrolled to), with its first records; a visible link leads back to
    the runs list."""
    page.set_viewport_size({"width": width, "height": 900})
    run = "many-" + secrets.token_hex(3)
    for n in range(8):
        created(
            api.post(f"/runs/{run}/streams", json={"stream_id": f"s{n}", "direction": "output"})
        )
    append(api, f"/runs/{run}/streams/s7", *({"data": {"n": n}} for n in range(3)))
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}")
    expect(stream_field(page, "s7", "head")).to_have_text("3", timeout=WAIT_MS)

    follow = page.get_by_role("button", name="Follow stream s7")
    follow.scroll_into_view_if_needed()
    assert page.evaluate("scrollY") > 900, "the last card should be below the first screen"
    follow.click()
    expect(page.locator("#records li")).to_have_count(3, timeout=WAIT_MS)
    page.wait_for_timeout(200)  # a smooth scroll, had there been one, is over
    assert_in_viewport(page, "follow-title")
    assert_in_viewport(page, "follow-status")
    assert_in_viewport(page, "records")
    expect(page.locator("#follow-title")).to_have_text("Live: s7")
    if layout == "beside":  # the card followed is in sight beside its live view
        card = page.locator('[data-stream="s7"]').bounding_box()
        assert card is not None and 0 <= card["y"] < 900, card
    page.screenshot(path=artefacts / f"console-follow-{layout}.png")

    # A record appended now shows in sight, without scrolling.
    append(api, f"/runs/{run}/streams/s7", {"data": {"n": 3}})
    expect(page.locator('#records li[data-seq="4"]')).to_be_in_viewport(timeout=WAIT_MS)

    # Back to the runs list by a link that says so, in sight when stacked above the live view.
    back = page.get_by_role("link", name="← All runs")
    expect(back).to_be_visible()
    if layout == "stacked":
        assert_in_viewport(page, "back-to-runs")
    back.click()
    expect(page.locator("#runs-view")).to_be_visible()
    expect(page.locator("#run-view")).to_be_hidden()
    expect(page.locator("#follow-view")).to_be_hidden()
    expect(page.get_by_role("link", name=run)).to_be_visible(timeout=WAIT_MS)


def test_closing_the_live_view_stops_following_and_keeps_the_run(
    page: Page, console_server: ServerProcess, api: httpx.Client
) -> None:
    run = "close-" + secrets.token_hex(3)
    created(api.post(f"/runs/{run}/streams", json={"stream_id": "s", "direction": "output"}))
    append(api, f"/runs/{run}/streams/s", {"data": {"n": 1}})
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}&stream=s&from=0")
    expect(page.locator("#records li")).to_have_count(1, timeout=WAIT_MS)
    page.get_by_role("link", name="Close the live view").click()
    expect(page.locator("#follow-view")).to_be_hidden()
    expect(page.locator("#run-title")).to_have_text(f"Run {run}")
    assert page.evaluate("location.hash") == f"#run={run}"


def test_following_survives_a_server_restart_without_gap_or_duplicate(
    page: Page, console_server: ServerProcess, api: httpx.Client, artefacts: Path
) -> None:
    run = "restart-" + secrets.token_hex(3)
    path = f"/runs/{run}/streams/s"
    created(api.post(f"/runs/{run}/streams", json={"stream_id": "s", "direction": "output"}))
    append(api, path, *({"data": {"n": n}} for n in range(1, 11)))
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}&stream=s&from=0")
    expect(page.locator("#records li")).to_have_count(10, timeout=WAIT_MS)

    console_server.stop()  # SIGTERM: the server ends every subscription, then exits
    expect(page.locator("#follow-status")).to_contain_text("reconnecting", timeout=WAIT_MS)
    console_server.start()
    # Appended before the page is back: it must get these from its last sequence.
    append(api, path, *({"data": {"n": n}} for n in range(11, 16)))
    expect(page.locator('#records li[data-seq="15"]')).to_be_visible(timeout=WAIT_MS)
    append(api, path, *({"data": {"n": n}} for n in range(16, 21)))
    expect(page.locator('#records li[data-seq="20"]')).to_be_visible(timeout=WAIT_MS)

    assert page.evaluate(SHOWN_SEQUENCES) == list(range(1, 21))
    status = page.locator("#follow-status").inner_text()
    assert "Gaps: 0." in status and "Reconnects: 0." not in status, status
    page.screenshot(path=artefacts / "console-after-restart.png")


def test_a_run_of_many_streams_is_shown_a_page_at_a_time(
    page: Page, console_server: ServerProcess, api: httpx.Client
) -> None:
    run = "wide-" + secrets.token_hex(3)
    for n in range(55):
        created(
            api.post(
                f"/runs/{run}/streams", json={"stream_id": f"s-{n:02d}", "direction": "output"}
            )
        )
    listings: list[str] = []
    page.on(
        "request",
        lambda r: (
            listings.append(r.url)
            if f"/runs/{run}/streams" in r.url and "/subscriptions" not in r.url
            else None
        ),
    )
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}")
    expect(page.locator("article.stream")).to_have_count(50, timeout=WAIT_MS)
    more = page.get_by_role("button", name="More streams")
    expect(more).to_be_visible()
    assert all("limit=50" in url for url in listings), listings
    more.click()
    expect(page.locator("article.stream")).to_have_count(55, timeout=WAIT_MS)
    expect(page.locator('[data-stream="s-54"]')).to_be_visible()
    expect(more).to_be_hidden()
    assert any("after=s-49" in url for url in listings), listings


def test_a_streams_subscriptions_are_shown_with_their_acknowledged_sequence(
    page: Page, console_server: ServerProcess, api: httpx.Client
) -> None:
    run = "subs-" + secrets.token_hex(3)
    created(api.post(f"/runs/{run}/streams", json={"stream_id": "s", "direction": "output"}))
    created(
        api.post(f"/runs/{run}/streams/s/records", json={"records": [{"data": 1}, {"data": 2}]})
    )
    name = "sub-" + secrets.token_hex(3)
    body = {
        "type": "webhook",
        "streams": [{"run_id": run, "stream_id": "s"}],
        "webhook": {"url": "http://127.0.0.1:9/hook"},  # nothing listens: no delivery needed
    }
    created(api.put(f"/subscriptions/{name}", json=body))
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}")
    row = page.locator(f'[data-stream="s"] tr[data-subscription="{name}"]')
    expect(row.locator("[data-acked]")).to_have_text("2", timeout=WAIT_MS)
    expect(row.locator("td").nth(1)).to_have_text("webhook")
    expect(row.locator("td").nth(2)).to_have_text("explicit")


def test_the_runs_view_shows_what_the_tenant_holds_to_a_token_that_may_see_it(
    page: Page, console_server: ServerProcess, api: httpx.Client
) -> None:
    run = "usage-" + secrets.token_hex(4)
    created(api.post(f"/runs/{run}/streams", json={"stream_id": "s", "direction": "output"}))
    append(api, f"/runs/{run}/streams/s", {"data": "x" * 2046})  # 2 KiB with its quotes
    usage = api.get("/usage").json()
    open_console(page, console_server)
    expect(page.locator('#usage [data-usage="streams"]')).to_have_text(
        f"{usage['streams']:,} stream{'' if usage['streams'] == 1 else 's'} of 1,000,000",
        timeout=WAIT_MS,
    )
    shown = page.locator('#usage [data-usage="bytes"]').text_content() or ""
    assert shown.endswith(" of 1.0 TiB") and shown != "0 B of 1.0 TiB"
    expect(page.locator('#usage [data-usage="tokens"]')).to_have_text(
        f"{usage['tokens']:,} token{'' if usage['tokens'] == 1 else 's'} of 1,000,000"
    )
    expect(page.locator('#usage [data-usage="subscriptions"]')).to_contain_text(" of 10,000")
    # A token restricted to a run sees its run, not the tenant's figures.
    minted = created(
        api.post(
            "/tokens",
            json={"scopes": ["streams:read"], "expires_in_seconds": 600, "runs": [run]},
        )
    )
    other = page.context.new_page()  # a tab of its own: its own session storage
    other.goto(f"{console_server.base_url}/console#token={minted['token']}")
    expect(other.locator(f'tr[data-run="{run}"]')).to_be_visible(timeout=WAIT_MS)
    expect(other.locator("#usage")).to_be_hidden()


def test_a_phone_shows_a_runs_cards_within_its_width(
    page: Page, console_server: ServerProcess, api: httpx.Client, artefacts: Path
) -> None:
    """At 375 px nothing of a run's page lies beyond the right edge: no sideways scrolling,
    each card's Follow button and its values in sight."""
    run, _ = demo_run(api)
    page.set_viewport_size({"width": 375, "height": 740})
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}")
    expect(stream_field(page, "tokens", "head")).not_to_have_text("", timeout=WAIT_MS)
    page.screenshot(path=artefacts / "console-phone-run.png", full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    for button in page.get_by_role("button", name=re.compile("^Follow stream")).all():
        box = button.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375, box
    for card in page.locator("#streams article").all():
        box = card.bounding_box()
        assert box is not None and box["x"] + box["width"] <= 375, box
    # The share link's field, once made, fits too.
    page.click("#share-mint")
    expect(page.locator("#share-link")).to_be_visible(timeout=WAIT_MS)
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    # And in the live view, an object record's link is in sight without scrolling sideways.
    page.get_by_role("button", name="Follow stream tokens").click()
    link = page.get_by_role("link", name="Download body").first
    expect(link).to_be_visible(timeout=WAIT_MS)
    box = link.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375, box
    assert page.evaluate("document.getElementById('records').scrollWidth") <= page.evaluate(
        "document.getElementById('records').clientWidth"
    )


def test_the_keyboard_goes_to_the_live_view_and_back_to_its_button(
    page: Page, console_server: ServerProcess, api: httpx.Client
) -> None:
    """Enter on a card's Follow button puts the focus on the live view (not on the next card's
    button); closing the view gives it back to the button that opened it."""
    run = "keys-" + secrets.token_hex(3)
    for name in ("a", "b", "c"):
        created(api.post(f"/runs/{run}/streams", json={"stream_id": name, "direction": "output"}))
    append(api, f"/runs/{run}/streams/b", {"data": 1})
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}")
    expect(stream_field(page, "b", "head")).to_have_text("1", timeout=WAIT_MS)
    page.get_by_role("button", name="Follow stream b").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#records li")).to_have_count(1, timeout=WAIT_MS)
    assert page.evaluate("document.activeElement.id") == "follow-title"
    page.keyboard.press("Tab")  # on through the live view: its close link comes first
    assert page.evaluate("document.activeElement.id") == "follow-close"
    page.keyboard.press("Enter")
    expect(page.locator("#follow-view")).to_be_hidden()
    expect(page.get_by_role("button", name="Follow stream b")).to_be_focused()
    # Back to the runs by the link: the keyboard goes on at the runs' heading.
    page.get_by_role("link", name="← All runs").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#runs-title")).to_be_focused(timeout=WAIT_MS)


def test_a_follow_refused_stays_shown_until_the_next_follow_clears_it(
    page: Page, console_server: ServerProcess, api: httpx.Client
) -> None:
    run = "again-" + secrets.token_hex(3)
    created(api.post(f"/runs/{run}/streams", json={"stream_id": "s", "direction": "output"}))
    append(api, f"/runs/{run}/streams/s", {"data": 1}, {"data": 2})
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}&stream=s&from=0")
    expect(page.locator("#records li")).to_have_count(2, timeout=WAIT_MS)
    page.fill("#follow-from", "99999")
    page.click("#follow-start")
    expect(page.locator("#problem")).to_contain_text("Cursor ahead of head", timeout=WAIT_MS)
    page.wait_for_timeout(2500)  # the run's refresh (every 2 s) does not clear it
    expect(page.locator("#problem")).to_be_visible()
    page.fill("#follow-from", "1")
    page.click("#follow-start")
    expect(page.locator("#records li")).to_have_count(1, timeout=WAIT_MS)
    expect(page.locator("#problem")).to_be_hidden()


def test_problems_are_shown_and_401_asks_for_a_token(
    page: Page, console_server: ServerProcess, artefacts: Path
) -> None:
    # No token yet: the page loads and asks for one.
    page.goto(f"{console_server.base_url}/console#run=nope")
    expect(page.locator("#token-dialog")).to_be_visible()
    # A wrong one: 401, the problem's title and detail, and the question again.
    page.get_by_role("textbox", name="Token").fill("dst_not_a_token")
    page.keyboard.press("Enter")
    expect(page.locator("#problem")).to_contain_text("nauthenticated", timeout=WAIT_MS)
    expect(page.locator("#token-dialog")).to_be_visible()
    page.screenshot(path=artefacts / "console-401.png")
    # The right one: a run that does not exist is the 404 problem, not a blank page.
    page.get_by_role("textbox", name="Token").fill(BOOTSTRAP_TOKEN)
    page.keyboard.press("Enter")
    page.goto(f"{console_server.base_url}/console#run=nope&stream=nothing")
    expect(page.locator("#problem")).to_contain_text("Not found", timeout=WAIT_MS)
    expect(page.locator("#follow-status")).to_contain_text("Stopped", timeout=WAIT_MS)


def test_the_page_is_served_with_a_strict_policy_and_no_token(
    console_server: ServerProcess,
) -> None:
    page = httpx.get(console_server.base_url + "/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    for name in ("console.js", "console.css"):
        assert httpx.get(f"{console_server.base_url}/console/{name}").status_code == 200
    missing = httpx.get(console_server.base_url + "/console/other.js")
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")
    # Nothing the page loads comes from another origin.
    assert "http" not in page.text.replace("http-equiv", "")


@pytest.mark.slow
def test_a_page_following_100_records_a_second_stays_bounded(
    page: Page, console_server: ServerProcess, api: httpx.Client, artefacts: Path
) -> None:
    """100 records/s (10 every 100 ms) for SOAK_SECONDS (20 s in the suite; the figures of the
    closing note were taken with DUCTOR_STREAMS_CONSOLE_SOAK_SECONDS=60): the view keeps its
    last 500 records and the page's JavaScript heap (after a collection) stays flat from the
    first 10 s (when the view is full) to the end; commit-to-page latency measured."""
    seconds = int(os.environ.get("DUCTOR_STREAMS_CONSOLE_SOAK_SECONDS", "20"))
    ticks = 10 * max(seconds, 20)
    total = 10 * ticks
    run = "busy-" + secrets.token_hex(3)
    path = f"/runs/{run}/streams/s"
    created(
        api.post(
            f"/runs/{run}/streams",
            json={
                "stream_id": "s",
                "direction": "output",
                "limits": {"max_unread_items": 1_000_000},
            },
        )
    )
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}&stream=s&from=0")
    expect(page.locator("#follow-status")).to_contain_text("Live", timeout=WAIT_MS)
    page.evaluate(OBSERVE_RECORDS, 10)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")

    def heap_mib() -> float:
        cdp.send("HeapProfiler.collectGarbage")
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        return metrics["JSHeapUsedSize"] / 2**20

    sent_at: dict[int, float] = {}
    answered_at: dict[int, float] = {}
    heap = []
    start = time.monotonic()
    for tick in range(ticks):
        sent = time.time() * 1000
        answer = append(
            api, path, *({"data": {"tick": tick, "n": n, "text": "x" * 80}} for n in range(10))
        )
        answered = time.time() * 1000
        for sequence in range(answer["first_sequence"], answer["last_sequence"] + 1):
            sent_at[sequence], answered_at[sequence] = sent, answered
        if tick % 100 == 99:
            heap.append(round(heap_mib(), 2))
        delay = start + (tick + 1) * 0.1 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    expect(page.locator(f'#records li[data-seq="{total}"]')).to_be_visible(timeout=WAIT_MS)
    shown = page.evaluate("window.__shown")
    latencies = sorted(at - sent_at[int(sequence)] for sequence, at in shown.items())
    after_answer = sorted(at - answered_at[int(sequence)] for sequence, at in shown.items())
    dom_nodes = page.evaluate("document.getElementsByTagName('*').length")
    figures = {
        "records": len(sent_at),
        "seconds": round(time.monotonic() - start, 1),
        "records_in_view": page.locator("#records li").count(),
        "dom_elements": dom_nodes,
        "js_heap_used_mib_every_10s": heap,
        "append_request_to_page_ms": {
            "median": round(latencies[len(latencies) // 2], 1),
            "p99": round(latencies[int(len(latencies) * 0.99)], 1),
            "max": round(latencies[-1], 1),
        },
        "append_answer_to_page_ms": {
            "median": round(after_answer[len(after_answer) // 2], 1),
            "p99": round(after_answer[int(len(after_answer) * 0.99)], 1),
            "max": round(after_answer[-1], 1),
        },
    }
    (artefacts / "memory-100-per-second.json").write_text(json.dumps(figures, indent=2))
    print(figures)
    assert figures["records_in_view"] == 500
    assert page.evaluate(SHOWN_SEQUENCES) == list(range(total - 499, total + 1))
    # Bounded: after a collection, the heap at the end is the heap after the first 10 s (by
    # then the view is full) within 0.5 MiB; keeping the 5,500 records that left the view would
    # be more than 2 MiB. The elements are those of 500 records and the page around them.
    assert heap[-1] <= heap[0] + 0.5, heap
    assert dom_nodes < 10 * 500 + 300, dom_nodes


def test_a_follow_where_retention_removed_records_goes_on_from_the_earliest_kept(
    page: Page, console_server: ServerProcess, api: httpx.Client
) -> None:
    """A stream whose first records retention removed: its Follow starts at the earliest kept,
    and a view asked from before it goes on from there, saying what was skipped, rather than
    stopping at 'cursor expired'. Nothing is shown that was not there; the card says 'no
    ceiling' for a ceiling that is none, and a problem an action met outlasts the refresh."""
    run = "pruned-" + secrets.token_hex(3)
    created(
        api.post(
            f"/runs/{run}/streams",
            json={"stream_id": "s", "direction": "output", "retention": {"max_records": 2}},
        )
    )
    append(api, f"/runs/{run}/streams/s", *({"data": n} for n in range(5)))
    deadline = time.monotonic() + 15
    while api.get(f"/runs/{run}/streams/s").json()["state"]["earliest"] != 4:
        assert time.monotonic() < deadline, "retention did not prune"
        time.sleep(0.1)
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}")
    expect(stream_field(page, "s", "earliest")).to_have_text("4", timeout=WAIT_MS)
    expect(stream_field(page, "s", "totals")).to_have_text("5 records, 5 B")
    page.get_by_role("button", name="Follow stream s").click()
    expect(page.locator("#records li")).to_have_count(2, timeout=WAIT_MS)
    assert page.evaluate(SHOWN_SEQUENCES) == [4, 5]
    expect(page.locator("#follow-skipped")).to_have_text("")
    # From before what retention kept: on from the earliest, the skip said, and counted a gap.
    page.goto(f"{console_server.base_url}/console#run={run}&stream=s&from=0")
    expect(page.locator("#records li")).to_have_count(2, timeout=WAIT_MS)
    assert page.evaluate(SHOWN_SEQUENCES) == [4, 5]
    expect(page.locator("#follow-skipped")).to_have_text(
        "Retention removed records 1 to 3 before they were shown."
    )
    expect(page.locator("#follow-status")).to_contain_text("Last sequence shown: 5")
    expect(page.locator("#follow-status")).to_contain_text("Gaps: 1")
    # A cursor ahead of the head stops, and says nothing was shown.
    page.goto(f"{console_server.base_url}/console#run={run}&stream=s&from=99")
    expect(page.locator("#follow-status")).to_contain_text("Stopped", timeout=WAIT_MS)
    expect(page.locator("#follow-status")).to_contain_text("Last sequence shown: none yet")
    # A problem an action met stays past the run's refresh (every 2 s), until the next action.
    expect(page.locator("#problem")).to_contain_text("ahead", timeout=WAIT_MS)
    refreshed = page.locator("#run-refreshed").inner_text()
    expect(page.locator("#run-refreshed")).not_to_have_text(refreshed, timeout=WAIT_MS)
    expect(page.locator("#problem")).to_be_visible()
    expect(page.locator("#problem")).to_contain_text("ahead")


def test_a_stream_without_a_ceiling_says_so(
    page: Page, console_server: ServerProcess, api: httpx.Client
) -> None:
    """A Durable Streams stream has no unread ceiling (2^53 - 1 in its document): the card says
    'no ceiling' rather than a sixteen-digit number and an empty bar."""
    run = "ds-" + secrets.token_hex(3)
    made = httpx.put(
        f"{console_server.base_url}/api/durable-streams/v1/stream/{run}/chat",
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}", "Content-Type": "text/plain"},
        content=b"hello",
    )
    assert made.status_code == 201, made.text
    open_console(page, console_server)
    page.goto(f"{console_server.base_url}/console#run={run}")
    expect(stream_field(page, "chat", "items")).to_have_text("1 (no ceiling)", timeout=WAIT_MS)
    expect(stream_field(page, "chat", "bytes")).to_contain_text("(no ceiling)")
    expect(page.locator('[data-stream="chat"] meter')).to_have_count(0)
    expect(stream_field(page, "chat", "totals")).to_have_text("1 record, 5 B")
