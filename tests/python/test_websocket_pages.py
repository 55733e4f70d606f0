"""MQTT over WebSocket from web pages in a real headless Chromium. A browser lets any page open
a WebSocket to a loopback address, so a page from another site is not a local client: it is
not let in anonymously, though the listener is on loopback, even when DNS rebinding makes it
"same-origin" with the listener. A listener that lists origins trusts pages from those and
refuses the others at the upgrade."""

from __future__ import annotations

import functools
import http.server
import socket
import threading
import time

import pytest

from helpers import HOST, Paho, wait_for
from test_dashboard_browser import browser, needs_browser, start_chromium  # noqa: F401  (fixture)

# A client that connects anonymously to `url` as MQTT 5 client "web" and, once let in, publishes
# "hi" to stolen/x at QoS 0. The page's title says what the broker answered.
CLIENT = """<!doctype html><title>loading</title><script>
const connect = new Uint8Array([0x10, 16, 0, 4, 77, 81, 84, 84, 5, 2, 0, 60, 0, 0, 3, 119, 101, 98]);
const topic = Array.from("stolen/x", (c) => c.charCodeAt(0));
const publish = new Uint8Array([0x30, 13, 0, 8, ...topic, 0, 104, 105]);
function go(url) {
  const ws = new WebSocket(url, "mqtt");
  ws.binaryType = "arraybuffer";
  ws.onopen = () => ws.send(connect);
  ws.onmessage = (e) => {
    const b = new Uint8Array(e.data);
    if (b[0] === 0x20) {
      document.title = "connack " + b[3];
      if (b[3] === 0) ws.send(publish);
    }
  };
  ws.onclose = () => { if (!document.title.startsWith("connack")) document.title = "refused"; };
}
</script>"""

# The client, connecting at once to the broker's WebSocket listener on WS_PORT.
PAGE = CLIENT + '<script>go("ws://127.0.0.1:WS_PORT/mqtt");</script>'


@pytest.fixture
def site(tmp_path):
    """A web server on another port than the broker's: the pages' own origin."""
    root = tmp_path / "site"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer((HOST, 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, httpd.server_address[1]
    httpd.shutdown()


def open_page(driver, site, server, host=HOST) -> str:
    """Serves the page, opens it from `host`, and returns the title it ends with."""
    root, port = site
    (root / "page.html").write_text(PAGE.replace("WS_PORT", str(server.endpoints["ws"])))
    driver.get(f"http://{host}:{port}/page.html")
    wait_for(lambda: driver.title != "loading", 10, what="the page's answer")
    return driver.title


def nothing_arrives(sub: Paho, within: float = 1.0) -> bool:
    time.sleep(within)
    return sub.messages.empty()


@needs_browser
def test_a_page_of_another_origin_is_not_let_in_anonymously(mqkv, browser, site):  # noqa: F811
    server = mqkv("--listen-ws", f"{HOST}:0")
    sub = Paho(server, "local-sub")
    assert sub.subscribe("stolen/#") == [0]
    # Not authorized (0x87), and nothing published.
    assert open_page(browser, site, server) == "connack 135"
    assert nothing_arrives(sub)
    wait_for(lambda: "anonymous client in a web page of another origin refused"
             in server.stderr_text(), what="the log line")
    # A client that is not a web page still connects anonymously over the same listener.
    Paho(server, "local-ws", listener="ws").disconnect()


@needs_browser
def test_a_listed_origin_is_trusted_and_others_are_refused(mqkv, browser, site):  # noqa: F811
    _, port = site
    server = mqkv("--listen-ws", f"{HOST}:0", "--ws-allowed-origin", f"http://{HOST}:{port}")
    sub = Paho(server, "local-sub")
    assert sub.subscribe("stolen/#") == [0]
    assert open_page(browser, site, server) == "connack 0"
    assert sub.get(5).payload == b"hi"
    # The same page from http://localhost:port is another origin: refused at the upgrade.
    assert open_page(browser, site, server, host="localhost") == "refused"
    wait_for(lambda: "an origin the listener does not list" in server.stderr_text(),
             what="the log line")
    assert nothing_arrives(sub)


@needs_browser
def test_a_page_that_rebinds_its_own_name_to_the_machine_is_not_local(mqkv, tmp_path):
    """DNS rebinding: a site serves its page from its own name and port, then points the name
    at the user's machine, where the broker listens on that port. The page's WebSocket then
    has its own origin and Host alike, a "same-origin" request, but under a DNS name, which
    proves nothing: the broker does not let it in anonymously."""
    driver = start_chromium(tmp_path, "--host-resolver-rules=MAP rebound.test 127.0.0.1")
    try:
        root = tmp_path / "site"
        root.mkdir()
        (root / "page.html").write_text(CLIENT)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            port = probe.getsockname()[1]
        httpd = http.server.ThreadingHTTPServer((HOST, port), handler)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        driver.get(f"http://rebound.test:{port}/page.html")
        assert driver.title == "loading"
        # The site's server goes; the broker now answers on its port.
        httpd.shutdown()
        httpd.server_close()
        server = mqkv("--listen-ws", f"{HOST}:{port}")
        sub = Paho(server, "local-sub")
        assert sub.subscribe("stolen/#") == [0]
        # To the host and port the page came from: its own origin, under a DNS name.
        driver.execute_script('go("ws://" + location.host + "/mqtt")')
        wait_for(lambda: driver.title != "loading", 10, what="the page's answer")
        assert driver.title == "connack 135"
        assert nothing_arrives(sub)
        wait_for(lambda: "http://rebound.test" in server.stderr_text(), what="the log line")
    finally:
        driver.quit()
