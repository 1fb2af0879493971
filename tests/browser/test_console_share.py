"""The console's read-only link in a real browser (Debian's Chromium, headless, playwright):
an admin mints a link to one run, and a fresh browser context holding nothing but that link
opens the run, follows its stream, and sees no other run."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, expect, sync_playwright

from tests.conftest import BOOTSTRAP_TOKEN
from tests.support.server import ServerProcess

CHROMIUM = Path("/usr/bin/chromium")
API = "/api/workflow-streams"
WAIT_MS = 15_000


@pytest.fixture(scope="module")
def browser(server: ServerProcess) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"the browser tests need Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield browser
        browser.close()


def test_a_minted_link_opens_one_run_read_only_for_someone_else(
    server: ServerProcess, browser: Browser
) -> None:
    shared, hidden = "shared-" + secrets.token_hex(3), "hidden-" + secrets.token_hex(3)
    with admin_api(server) as api:
        for run in (shared, hidden):
            created = api.post(
                f"/runs/{run}/streams", json={"stream_id": "out", "direction": "output"}
            )
            assert created.status_code == 201, created.text
            appended = api.post(
                f"/runs/{run}/streams/out/records", json={"records": [{"data": f"in {run}"}]}
            )
            assert appended.status_code == 201
        kept = api.post(f"/runs/{shared}/streams/out/consumers/minters/ack", json={"sequence": 0})
        assert kept.status_code == 200, kept.text

        # The admin, in its own context: open the run, make a link, copy it.
        admin = browser.new_context(viewport={"width": 1400, "height": 1000})
        admin.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base_url)
        page = admin.new_page()
        page.goto(f"{server.base_url}/console#token={BOOTSTRAP_TOKEN}&run={shared}")
        expect(page.locator("#run-title")).to_have_text(f"Run {shared}", timeout=WAIT_MS)
        page.fill("#share-minutes", "10")
        page.click("#share-mint")
        link_box = page.locator("#share-link")
        expect(link_box).to_be_visible(timeout=WAIT_MS)
        page.click("#share-copy")
        expect(page.locator("#share-status")).to_have_text("Link copied.", timeout=WAIT_MS)
        link = page.evaluate("() => navigator.clipboard.readText()")
        assert link == link_box.input_value()
        admin.close()

        fragment = parse_qs(urlsplit(link).fragment)
        assert fragment["run"] == [shared] and urlsplit(link).path == "/console"
        token = fragment["token"][0]
        assert token != BOOTSTRAP_TOKEN
        # What the link's token is: read-only, this run only, ten minutes.
        minted = next(t for t in every_token(api) if t["runs"] == [shared])
        assert minted["scopes"] == ["streams:read"]
        # Under a principal of its own, not the minter's: the link's holder cannot ack the
        # minter's consumers or spend its live connections.
        assert minted["principal"].startswith("shared-link-")

    # Someone else: a fresh context with nothing but the link.
    other = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = other.new_page()
        page.goto(link)
        expect(page.locator("#run-title")).to_have_text(f"Run {shared}", timeout=WAIT_MS)
        expect(page.locator('#streams [data-stream="out"]')).to_be_visible(timeout=WAIT_MS)
        assert "token=" not in page.url  # taken out of the address
        page.goto(f"{server.base_url}/console#run={shared}&stream=out&from=0")
        expect(page.locator("#records li")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#records li").first).to_contain_text(f"in {shared}")
        # The runs list shows only the shared run; the other run is not found.
        page.goto(f"{server.base_url}/console#")
        expect(page.locator("#runs-table tbody tr")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#runs-table tbody tr").first).to_have_attribute("data-run", shared)
        page.goto(f"{server.base_url}/console#run={hidden}")
        expect(page.locator("#problem")).to_contain_text("no run", timeout=WAIT_MS)
        # Read-only: the console offers it no link to make (it may not: GET /tokens is 403).
        page.goto(f"{server.base_url}/console#run={shared}")
        expect(page.locator("#run-title")).to_have_text(f"Run {shared}", timeout=WAIT_MS)
        expect(page.locator('#streams [data-stream="out"]')).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#share-form")).to_be_hidden()
        with httpx.Client(base_url=server.base_url + API) as client:
            refused = client.post(
                f"/runs/{shared}/streams/out/records",
                json={"records": [{"data": 1}]},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert refused.status_code == 403
            # The minter's consumer is the minter's: the link's holder cannot move it on.
            minters = client.post(
                f"/runs/{shared}/streams/out/consumers/minters/ack",
                json={"sequence": 1},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert minters.status_code == 403, minters.text
            assert minters.json()["code"] == "cross-scope-ack"
    finally:
        other.close()


def admin_api(server: ServerProcess) -> httpx.Client:
    """The API with the bootstrap token (all scopes)."""
    return httpx.Client(
        base_url=server.base_url + API, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
    )


def every_token(api: httpx.Client) -> Iterator[dict]:
    """The tenant's tokens, page after page (the newest come last)."""
    params: dict[str, int | str] = {"limit": 1000}
    while True:
        page = api.get("/tokens", params=params).json()
        yield from page["tokens"]
        if page["next_after"] is None:
            return
        params["after"] = page["next_after"]


def _new_run(api: httpx.Client) -> str:
    run = "links-" + secrets.token_hex(3)
    created = api.post(f"/runs/{run}/streams", json={"stream_id": "out", "direction": "output"})
    assert created.status_code == 201, created.text
    return run


def test_a_link_never_silently_replaces_the_tabs_token(
    server: ServerProcess, browser: Browser
) -> None:
    """Login CSRF: a link carrying another token asks first; declined, the tab keeps its own."""
    with admin_api(server) as api:
        run = _new_run(api)
        minted = api.post(
            "/tokens",
            json={"scopes": ["streams:read"], "expires_in_seconds": 600, "runs": [run]},
        )
        assert minted.status_code == 201, minted.text
        other = minted.json()["token"]
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{server.base_url}/console#token={BOOTSTRAP_TOKEN}")
        expect(page.locator("#who")).to_have_text("token set for this tab", timeout=WAIT_MS)
        stored = "() => sessionStorage.getItem('ductor-streams-token')"
        asked: list[str] = []

        def decline(dialog) -> None:  # type: ignore[no-untyped-def]
            asked.append(dialog.message)
            dialog.dismiss()

        page.once("dialog", decline)
        page.evaluate(f"() => {{ location.hash = 'token={other}&run={run}'; }}")
        expect(page.locator("#run-title")).to_have_text(f"Run {run}", timeout=WAIT_MS)
        assert asked and "another token" in asked[0]
        assert page.evaluate(stored) == BOOTSTRAP_TOKEN
        assert "token=" not in page.url

        page.once("dialog", lambda dialog: dialog.accept())
        page.evaluate(f"() => {{ location.hash = 'token={other}&run={run}&x=1'; }}")
        page.wait_for_function(f"() => ({stored[6:]}) === '{other}'")
        # The same token again asks nothing.
        page.evaluate(f"() => {{ location.hash = 'token={other}&run={run}'; }}")
        expect(page.locator("#run-title")).to_have_text(f"Run {run}", timeout=WAIT_MS)

        # Forgotten: nothing kept, and the token is asked for.
        page.click("#forget-token")
        assert page.evaluate(stored) is None
        expect(page.locator("#token-dialog")).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#who")).to_have_text("no token")
    finally:
        context.close()


def test_ids_from_the_address_are_checked_before_any_request(
    server: ServerProcess, browser: Browser
) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        paths: list[str] = []
        page.on("request", lambda request: paths.append(urlsplit(request.url).path))
        runs_read = lambda r: urlsplit(r.url).path == f"{API}/runs"  # noqa: E731
        with page.expect_response(runs_read, timeout=WAIT_MS):
            page.goto(f"{server.base_url}/console#token={BOOTSTRAP_TOKEN}&run=..&stream=..")
        expect(page.locator("#runs-view")).to_be_visible(timeout=WAIT_MS)
        page.wait_for_timeout(500)
        # Still said once the runs are shown (their answer clears what was shown before).
        expect(page.locator("#problem")).to_be_visible()
        expect(page.locator("#problem")).to_contain_text("no run ID")
        elsewhere = [p for p in paths if p.startswith(f"{API}/streams") or p == f"{API}/subscribe"]
        assert elsewhere == [], paths
        assert f"{API}/runs" in paths  # the runs view instead
    finally:
        context.close()


def test_a_link_made_can_be_revoked_from_the_console(
    server: ServerProcess, browser: Browser
) -> None:
    with admin_api(server) as api:
        run = _new_run(api)
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(f"{server.base_url}/console#token={BOOTSTRAP_TOKEN}&run={run}")
            expect(page.locator("#run-title")).to_have_text(f"Run {run}", timeout=WAIT_MS)
            page.click("#share-mint")
            expect(page.locator("#share-link")).to_be_visible(timeout=WAIT_MS)
            link = page.locator("#share-link").input_value()
            token = parse_qs(urlsplit(link).fragment)["token"][0]
            reader = {"Authorization": f"Bearer {token}"}
            streams = f"{server.base_url}{API}/runs/{run}/streams"
            assert httpx.get(streams, headers=reader).status_code == 200
            page.click("#share-revoke")
            expect(page.locator("#share-status")).to_contain_text("Link revoked", timeout=WAIT_MS)
            expect(page.locator("#share-link")).to_be_hidden()
            expect(page.locator("#share-mint")).to_be_focused()  # (not lost with its button)
            # Revocation reaches every process within about 2 s.
            deadline = 40
            while deadline:
                answer = httpx.get(streams, headers=reader)
                if answer.status_code == 401:
                    break
                deadline -= 1
                page.wait_for_timeout(100)
            assert answer.status_code == 401, answer.text
        finally:
            context.close()
