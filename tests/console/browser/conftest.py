"""A real headless Chromium (Debian's package) driven by Selenium, and the service it looks at.

Selenium is pointed at ``/usr/bin/chromium`` and ``/usr/bin/chromedriver``:
nothing is downloaded. ``scripts/test`` installs the two packages when they
are missing; elsewhere these tests are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

from tests.api.tokens import tokens_layer
from tests.serving import serving
from tests.stub_server import StubServer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOTS = os.environ.get("ROUTEMASTER_CONSOLE_SCREENSHOTS")  # a directory, to refresh docs/

CONFIG = """
state_machines:
  orders:
    retry: {max_attempts: 3, initial_delay: 1s}
    states:
      - gate: placed
        triggers: [{metadata: paid}]
        exit_condition: metadata.paid = true
        next: notify
      - action: notify
        webhook: "{stub}/hook/<label>"
        next: shipped
      - gate: shipped
        triggers: [{metadata: returned}]
        exit_condition: metadata.returned = true
        next: placed
"""


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("chromium and chromium-driver are not installed (scripts/test installs them)")
    profile = tempfile.mkdtemp(prefix="routemaster-chromium-")
    options = Options()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def service(
    tmp_path: Path, database_url: str, db_engine: sa.Engine, stub: StubServer
) -> Iterator[str]:
    """``serve`` and ``cron`` on the test database, webhooks to the stub; the base URL."""
    config = tmp_path / "console.yaml"
    config.write_text(CONFIG.replace("{stub}", stub.url("")))
    settings = {"ROUTEMASTER_POLL_INTERVAL": "0.1", "ROUTEMASTER_CHANGES_POLL_INTERVAL": "0.1"}
    with serving(config, database_url, "--workers", "2", env=settings, with_worker=True) as base:
        yield base


@pytest.fixture
def secured_service(
    tmp_path: Path, database_url: str, db_engine: sa.Engine, stub: StubServer
) -> Iterator[str]:
    """The same service with ``api: {authentication: tokens}``."""
    config = tmp_path / "console.yaml"
    config.write_text(CONFIG.replace("{stub}", stub.url("")))
    layer = tokens_layer(tmp_path)
    settings = {"ROUTEMASTER_CHANGES_POLL_INTERVAL": "0.1"}
    with serving(config, database_url, "--workers", "2", env=settings, layers=[layer]) as base:
        yield base


@pytest.fixture
def screenshot(browser: WebDriver) -> Callable[[str], None]:
    """Save the page as ``NAME.png`` in $ROUTEMASTER_CONSOLE_SCREENSHOTS, when it is set."""

    def take(name: str) -> None:
        if SCREENSHOTS:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(Path(SCREENSHOTS) / f"{name}.png"))

    return take
