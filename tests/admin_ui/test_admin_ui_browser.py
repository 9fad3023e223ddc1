"""The admin UI in a real browser (Playwright driving Debian's Chromium, headless), end to end:
sign in, create a team and a key, lower its TPM and see the key refused with 429, see usage from
real requests on the dashboard (screenshot saved), revoke the key and see it refused with 401."""

import re
import time
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.admin_ui.conftest import ADMIN_PASSWORD, ADMIN_USER, ARTIFACTS, CHROMIUM
from tests.gateway.conftest import MODEL, Gateway
from tokenyard.admin_ui.usage import MAX_SERIES, OTHER

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"
)
CHAT = [{"role": "user", "content": "count the words in this prompt please #chunks=6"}]


def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _refusal(client: openai.OpenAI) -> openai.APIStatusError | None:
    try:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8)
    except openai.APIStatusError as exc:
        return exc
    return None


@pytest.fixture
def page(admin_gateway: Gateway) -> Any:
    with sync_api.sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        context = browser.new_context(
            base_url=admin_gateway.url, viewport={"width": 1280, "height": 900}
        )
        yield context.new_page()
        browser.close()


def test_admin_journey_in_a_browser(page: Any, admin_gateway: Gateway) -> None:
    expect = sync_api.expect
    name = "web" + uuid.uuid4().hex[:8]

    # anonymous: sent to sign in, then back where it was going
    page.goto("/admin/teams")
    expect(page).to_have_url(f"{admin_gateway.url}/admin/login?next=/admin/teams")
    page.fill("#user", ADMIN_USER)
    page.fill("#password", ADMIN_PASSWORD)
    page.click("text=Sign in")
    expect(page).to_have_url(f"{admin_gateway.url}/admin/teams")

    # a team, and a key shown once
    page.fill("#f-name", name)
    page.fill("#f-rpm", "600")
    page.click("text=Create team")
    expect(page.get_by_role("status")).to_contain_text("Team created")
    page.click(f"text=Create a key for {name}")
    key = page.locator("#new-key").inner_text().strip()
    assert key.startswith("ty-")
    client = admin_gateway.client(key)

    # real requests with the key, before its TPM is lowered
    for _ in range(3):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8)

    # lower its TPM: the key is refused with 429 within a second
    page.goto(f"/admin/teams/{name}")
    page.fill("#f-tpm", "5")
    page.click("text=Save")
    expect(page.get_by_role("status")).to_contain_text("Saved")
    refused = _until(lambda: _refusal(client), 1.0, "the 429")
    assert refused.status_code == 429 and refused.code == "tokens_per_minute"

    # the requests' usage on the dashboard (the billing consumer writes it within about a second)
    def dashboard_lists_team() -> bool:
        page.goto("/admin/usage")
        return page.locator("table.totals tbody a", has_text=name).count() == 1

    _until(dashboard_lists_team, 10, "the team's usage on the dashboard")
    assert page.locator("svg.chart rect").count() >= 1
    legend = page.locator("figcaption .key").all_inner_texts()
    legend = [entry.strip() for entry in legend]
    if name not in legend:
        # the session's other tests' teams share this gateway: where seven or more of them used at
        # least as many tokens, this team is drawn in "other"
        assert legend[-1] == OTHER and len(legend) == MAX_SERIES
        rows = page.locator("table.totals tbody tr")
        tokens = {
            rows.nth(i).locator("td").nth(0).inner_text().strip(): int(
                rows.nth(i).locator("td").nth(7).inner_text().replace(",", "")
            )
            for i in range(rows.count())
        }
        ours = tokens.pop(name)
        assert sum(used >= ours for used in tokens.values()) >= MAX_SERIES - 1
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "admin-dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    # drill down into the team: its models; then the same in dollars
    page.locator("table.totals tbody a", has_text=name).click()
    expect(page.locator("h1")).to_contain_text(f"Usage of team {name}")
    row = page.locator("table.totals tbody tr", has_text=MODEL)
    # the three before the TPM change, and any admitted while the change spread
    assert int(row.locator("td").nth(1).inner_text()) >= 3
    page.click("text=Cost")
    expect(page.locator("svg.chart")).to_have_attribute(
        "aria-label", re.compile("cost .USD. by model")
    )

    # revoke the key: refused with 401
    page.goto("/admin/keys")
    page.click(f"[aria-label='Revoke {key[:12]}']")
    expect(page.get_by_role("status")).to_contain_text("revoked")
    gone = _until(
        lambda: (r := _refusal(client)) is not None and r.status_code == 401 and r, 1.5, "the 401"
    )
    assert gone.code == "invalid_api_key"
