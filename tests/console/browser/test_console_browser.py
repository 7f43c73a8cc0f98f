"""The console in a real browser: what a person sees, live, and the retry button."""

from __future__ import annotations

from collections.abc import Callable

import requests
import sqlalchemy as sa
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from routemaster.auth.admin import create_token
from tests.stub_server import Reply, StubServer

LABELS = "/state-machines/orders/labels"


def _count(browser: WebDriver, state: str) -> str:
    cell = browser.find_element(By.CSS_SELECTOR, f'[data-machine="orders"][data-state="{state}"]')
    return str(cell.text)


def _wait(
    browser: WebDriver, condition: Callable[[WebDriver], object], seconds: float = 20
) -> None:
    # a condition may read the page while it is being replaced: look again
    WebDriverWait(
        browser, seconds, poll_frequency=0.05, ignored_exceptions=(StaleElementReferenceException,)
    ).until(condition)


def _create(base: str, name: str, **metadata: object) -> None:
    response = requests.post(f"{base}{LABELS}/{name}", json={"metadata": metadata}, timeout=10)
    assert response.status_code == 201, response.text


def test_the_front_page_lists_the_machine_and_its_counts(
    browser: WebDriver, service: str, screenshot: Callable[[str], None]
) -> None:
    for name in ("order-1", "order-2", "order-3"):
        _create(service, name)
    browser.get(f"{service}/console/")
    link = browser.find_element(By.LINK_TEXT, "orders").get_attribute("href")
    assert link is not None and link.endswith("/console/machines/orders")
    assert _count(browser, "placed") == "3"
    assert _count(browser, "shipped") == "0"
    screenshot("front-page")


def test_a_label_created_through_the_api_appears_and_moves_live(
    browser: WebDriver, service: str, stub: StubServer, screenshot: Callable[[str], None]
) -> None:
    _create(service, "earlier")
    browser.get(f"{service}/console/machines/orders")
    _wait(browser, lambda b: b.find_element(By.ID, "live").text == "live")
    browser.execute_script("window.notReloaded = true;")
    assert _count(browser, "placed") == "1"

    _create(service, "order-42", customer="Ada", items=[{"sku": "tea", "count": 2}])
    _wait(browser, lambda b: _count(b, "placed") == "2")
    changes = browser.find_element(By.ID, "changes")
    _wait(browser, lambda b: "order-42 created in placed" in changes.text)

    requests.patch(f"{service}{LABELS}/order-42", json={"metadata": {"paid": True}}, timeout=10)
    _wait(browser, lambda b: _count(b, "shipped") == "1")  # through the action, by the worker
    assert _count(browser, "placed") == "1"
    assert _count(browser, "notify") == "0"
    assert "order-42 notify → shipped" in changes.text
    assert "order-42 placed → notify" in changes.text
    assert browser.execute_script("return window.notReloaded;") is True
    screenshot("machine")

    browser.find_element(By.LINK_TEXT, "order-42").click()
    _wait(browser, lambda b: "Why it is here" in b.page_source)
    assert browser.find_element(By.ID, "state").text == "shipped"
    assert '"customer": "Ada"' in browser.find_element(By.TAG_NAME, "pre").text
    screenshot("label")


def test_the_retry_button_on_an_errored_label_works(
    browser: WebDriver, service: str, stub: StubServer, screenshot: Callable[[str], None]
) -> None:
    stub.script("/hook/refused", Reply(410), Reply(200))  # refused for good, then accepted
    _create(service, "refused")
    requests.patch(f"{service}{LABELS}/refused", json={"metadata": {"paid": True}}, timeout=10)

    def errored(b: WebDriver) -> bool:
        b.get(f"{service}/console/machines/orders")
        return bool(b.find_elements(By.CSS_SELECTOR, 'button[value="refused"]'))

    _wait(browser, errored)
    assert "errored" in browser.find_element(By.CSS_SELECTOR, "svg.graph").text
    screenshot("errored")
    browser.find_element(By.CSS_SELECTOR, 'button[value="refused"]').click()
    _wait(browser, lambda b: "'refused' retried." in b.find_element(By.TAG_NAME, "main").text)

    def shipped(_: WebDriver) -> bool:
        label = requests.get(f"{service}{LABELS}/refused", timeout=10).json()
        return bool(label["state"] == "shipped")

    _wait(browser, shipped)
    assert len(stub.received("/hook/refused")) == 2
    browser.get(f"{service}/console/machines/orders/labels/refused")
    history = browser.find_element(By.XPATH, "//h2[text()='History']/following-sibling::table")
    assert "forced: retried" in history.text


def test_with_tokens_a_person_signs_in_and_sees_changes_live(
    browser: WebDriver,
    secured_service: str,
    db_engine: sa.Engine,
    screenshot: Callable[[str], None],
) -> None:
    secret, _ = create_token(
        db_engine, "console-operator", {"read", "write", "operate"}, wait=10, direct=db_engine
    )
    bearer = {"Authorization": f"Bearer {secret.secret}"}
    browser.delete_all_cookies()
    browser.get(f"{secured_service}/console/machines/orders")
    _wait(browser, lambda b: "/console/login" in b.current_url)
    field = browser.find_element(By.NAME, "token")
    field.send_keys("rm_wrong_guess")
    screenshot("sign-in")
    field.submit()
    _wait(browser, lambda b: "unknown, revoked" in b.find_element(By.TAG_NAME, "main").text)
    browser.find_element(By.NAME, "token").send_keys(secret.secret)
    browser.find_element(By.NAME, "token").submit()
    _wait(browser, lambda b: b.current_url.endswith("/console/machines/orders"))
    _wait(browser, lambda b: b.find_element(By.ID, "live").text == "live")
    assert "signed in" in browser.find_element(By.TAG_NAME, "header").text

    created = requests.post(
        f"{secured_service}{LABELS}/signed-1", json={"metadata": {}}, headers=bearer, timeout=10
    )
    assert created.status_code == 201
    _wait(browser, lambda b: _count(b, "placed") == "1")  # the stream follows the cookie
    browser.find_element(By.XPATH, "//header//button[text()='Sign out']").click()
    _wait(browser, lambda b: "/console/login" in b.current_url)
    browser.get(f"{secured_service}/console/")
    assert "/console/login" in browser.current_url


def test_a_label_becoming_errored_counts_live_and_its_receiver_is_listed(
    browser: WebDriver, service: str, stub: StubServer, screenshot: Callable[[str], None]
) -> None:
    stub.script("/hook/late", Reply(410))
    _create(service, "late")
    browser.get(f"{service}/console/")
    _wait(browser, lambda b: b.find_element(By.ID, "live").text == "live")
    browser.execute_script("window.notReloaded = true;")

    def errored_count(b: WebDriver) -> str:
        selector = '[data-errored-machine="orders"][data-errored-state="notify"]'
        return str(b.find_element(By.CSS_SELECTOR, selector).text)

    assert errored_count(browser) == "0"
    requests.patch(f"{service}{LABELS}/late", json={"metadata": {"paid": True}}, timeout=10)
    _wait(browser, lambda b: errored_count(b) == "1")  # the errored event, on the stream
    assert _count(browser, "notify") == "1"
    assert browser.execute_script("return window.notReloaded;") is True

    browser.get(f"{service}/console/receivers")
    receiver = "http-127.0.0.1-" + stub.url("").rsplit(":", 1)[1]
    row = browser.find_element(By.ID, f"receiver-{receiver}")
    assert "closed" in row.text
    assert "gone" in browser.find_element(By.TAG_NAME, "main").text  # its recent failure
    wakeups = browser.find_element(By.CSS_SELECTOR, '[data-listener="worker"]').text
    assert "worker" in wakeups and ("LISTEN" in wakeups or "polled every 0.1 s" in wakeups)
    screenshot("receivers")


def test_the_versions_page_lists_versions_and_compares_two(
    browser: WebDriver, service: str, db_engine: sa.Engine, screenshot: Callable[[str], None]
) -> None:
    with db_engine.begin() as conn:  # a second version: the first with one more state
        conn.execute(
            sa.text(
                "INSERT INTO machine_versions (machine, version, digest, definition)"
                " SELECT machine, 2, 'second', jsonb_set(definition, '{states}',"
                ' definition->\'states\' || \'[{"name": "archived", "kind": "gate"}]\')'
                " FROM machine_versions WHERE machine = 'orders' AND version = 1"
            )
        )
    browser.get(f"{service}/console/machines/orders")
    browser.find_element(By.LINK_TEXT, "Versions of this machine").click()
    _wait(browser, lambda b: "Compare" in b.page_source)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    _wait(browser, lambda b: "From version 1 to version 2" in b.page_source)
    rows = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "table.diff tbody tr")]
    assert rows == ["archived added"]
    screenshot("versions")
