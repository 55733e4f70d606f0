"""The dashboard in a real headless Chromium (Selenium and Debian's chromium-driver): a key set
over MQTT appears in the keys view; a watched key's change appears in the live feed without a
reload; the clients, cluster and throughput views show what is there; a user logs in and sets
a key through the page. A screenshot of each view is saved under target/dashboard-screenshots
(or $MQKV_SCREENSHOTS) for people to look at."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import HOST, Paho, wait_for
from statestore import StoreClient
from test_security import POLICY, login, users  # noqa: F401  (fixture)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HAVE_BROWSER = os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)

# scripts/test.sh installs the browser, so a CI run never skips these.
needs_browser = pytest.mark.skipif(
    not HAVE_BROWSER and not os.environ.get("CI"),
    reason="chromium and chromium-driver not installed (apt-get install chromium chromium-driver)",
)

SHOTS = Path(os.environ.get("MQKV_SCREENSHOTS")
             or Path(__file__).resolve().parents[2] / "target" / "dashboard-screenshots")


def start_chromium(tmp_path, *extra_args):
    """A headless Chromium under Selenium, with `extra_args` on its command line."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1280,860", f"--user-data-dir={tmp_path / 'chromium'}",
                *extra_args):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    return driver


@pytest.fixture
def browser(tmp_path):
    driver = start_chromium(tmp_path)
    yield driver
    driver.quit()


def shot(driver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 1000, f"{path} is empty"


def find(driver, css: str, timeout: float = 10.0):
    """The element `css` selects, once it is there."""
    from selenium.webdriver.common.by import By

    found = []

    def there():
        found[:] = driver.find_elements(By.CSS_SELECTOR, css)
        return bool(found)
    wait_for(there, timeout=timeout, interval=0.1, what=f"{css} on the page")
    return found[0]


def text_of(driver, css: str, expected: str, timeout: float = 10.0):
    from selenium.webdriver.common.by import By

    def has():
        return any(expected in e.text for e in driver.find_elements(By.CSS_SELECTOR, css))
    wait_for(has, timeout=timeout, interval=0.1, what=f"{expected!r} in {css}")


@needs_browser
def test_every_view_in_a_browser(mqkv, browser):
    server = mqkv("--http", f"{HOST}:0")
    writer = Paho(server, "sensor-writer")
    writer.subscribe("sensors/#", 1)
    store = StoreClient(writer, "sensor-writer")
    assert store.set("greeting", "hello from MQTT") == b"+OK\r\n"
    assert store.request("SET", "lease", "holder-1", "PX", "600000") == b"+OK\r\n"
    for key, value in (("config/firmware", '{"version": "2.4.1", "channel": "stable"}'),
                       ("sensors/line-1/temperature", "21.5"),
                       ("sensors/line-2/temperature", "19.8"),
                       ("calibration", b"\x01\x02\xfe\xff")):
        assert store.set(key, value) == b"+OK\r\n"
    browser.get(f"http://{HOST}:{server.http_port}/")
    # Keys: the key set over MQTT is listed with its value.
    row = find(browser, 'tr[data-key="greeting"]')
    assert "hello from MQTT" in row.text
    text_of(browser, 'tr[data-key="lease"]', "min")
    # A value that is not text is shown in hex.
    text_of(browser, 'tr[data-key="calibration"]', "0102feff")
    shot(browser, "keys")
    # Live feed: watch the key from its row, change it over MQTT, and the change appears
    # without a reload (a marker set on this page instance is still there).
    browser.execute_script("window.__sameLoad = 42;")
    row.find_element("css selector", "button").click()
    text_of(browser, "#feed-status", "live")
    assert store.set("greeting", "changed over MQTT") == b"+OK\r\n"
    text_of(browser, '#feed-log tr[data-key="greeting"]', "changed over MQTT")
    assert store.request("DEL", "greeting") == b":1\r\n"
    find(browser, '#feed-log tr[data-kind="delete"]')
    assert browser.execute_script("return window.__sameLoad;") == 42
    shot(browser, "feed")
    # Clients: the MQTT client with its subscriptions.
    find(browser, "#tab-clients").click()
    text_of(browser, 'tr[data-client="sensor-writer"]', "sensors/#")
    shot(browser, "clients")
    # Cluster: this node, leading.
    find(browser, "#tab-cluster").click()
    text_of(browser, 'tr[data-node="1"]', "leader")
    shot(browser, "cluster")
    # Throughput: samples arrive every two seconds while traffic flows.
    find(browser, "#tab-throughput").click()
    for i in range(30):
        writer.publish(f"sensors/{i % 3}", b"21.5", qos=1)

    def charted():
        return browser.execute_script(
            "return fetch('/api/series').then(r => r.json()).then(b => b.samples.length)") >= 2
    wait_for(charted, timeout=15, interval=0.5, what="two throughput samples")
    browser.execute_script("return loadSeries();")
    shot(browser, "throughput")


@needs_browser
def test_log_in_and_set_a_key_in_a_browser(mqkv, browser, tmp_path, users):  # noqa: F811
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    server = mqkv("--http", f"{HOST}:0", "--password-file", users, "--policy", policy)
    browser.get(f"http://{HOST}:{server.http_port}/")
    # With users configured, the page asks for credentials first.
    dialog = find(browser, "dialog#login[open]")
    shot(browser, "login")
    browser.find_element("id", "login-user").send_keys("alice")
    browser.find_element("id", "login-password").send_keys("wrong")
    browser.find_element("id", "login-button").click()
    text_of(browser, "#login-error", "wrong user name or password")
    browser.find_element("id", "login-password").clear()
    browser.find_element("id", "login-password").send_keys("alice-pw")
    browser.find_element("id", "login-button").click()
    text_of(browser, "#who", "Logged in as alice")
    assert not dialog.is_displayed()
    # The set form is there for a user who logged in; the policy still decides per key.
    browser.find_element("id", "set-key").send_keys("users:alice:color")
    browser.find_element("id", "set-value").send_keys("teal")
    browser.find_element("id", "set-button").click()
    text_of(browser, "#set-status", "set, version")
    find(browser, 'tr[data-key="users:alice:color"]')
    alice = StoreClient(login(server, "alice"), "alice-1")
    assert alice.get("users:alice:color") == b"$4\r\nteal\r\n"
    for field in ("set-key", "set-value"):
        browser.find_element("id", field).clear()
    browser.find_element("id", "set-key").send_keys("users:bob:color")
    browser.find_element("id", "set-value").send_keys("red")
    browser.find_element("id", "set-button").click()
    text_of(browser, "#set-status", "not authorized")
    bob = StoreClient(login(server, "bob"), "bob-1")
    assert bob.get("users:bob:color") == b"$-1\r\n"
