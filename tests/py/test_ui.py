"""The dashboard at /ui in headless Chromium (Debian's, MESHD_CHROMIUM), driven over the
Chrome DevTools protocol: the services page lists the registered services, a proxy's row
changes version after a write (live, without reloading), and the intention matrix shows a
deny. Screenshots go to target/ui-screenshots/ (not committed); DOM checks decide."""

import base64
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
import requests
import websocket

from conftest import _meshd_binary, _start_server, _stop_server

SHOTS = pathlib.Path(__file__).resolve().parents[2] / "target" / "ui-screenshots"

# A proxyless gRPC client that keeps its xDS stream open until killed.
HOLD = r"""
import sys, time, grpc
channel = grpc.insecure_channel("xds:///api")
# Asking for the connectivity state makes the channel resolve xds:///api: its xDS stream
# opens and stays open (api's instances need not answer).
channel.subscribe(lambda state: None, try_to_connect=True)
print("ready", flush=True)
time.sleep(600)
"""


def _chromium():
    path = os.environ.get("MESHD_CHROMIUM")
    if not path or not os.path.exists(path):
        raise RuntimeError("MESHD_CHROMIUM must name Debian's chromium; run these tests through `cargo xtask test`")
    return path


class Chrome:
    """One headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="meshd-ui-")
        self.proc = subprocess.Popen(
            [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "--window-size=1400,900",
             "about:blank"],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        )
        port = None
        for line in self.proc.stderr:
            if "DevTools listening on ws://" in line:
                port = line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
                break
        assert port, "Chromium did not start its DevTools endpoint"
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
        page = next(p for p in pages if p["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], suppress_origin=True, timeout=30)
        self.ids = itertools.count(1)

    def send(self, method, params=None):
        mid = next(self.ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params or {}}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                assert "error" not in msg, msg
                return msg["result"]

    def open(self, url):
        self.send("Page.navigate", {"url": url})

    def eval(self, expression):
        return self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})["result"].get("value")

    def wait(self, expression, what, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"not within {timeout} s: {what}; page text: {self.eval('document.body.innerText')!r}")

    def screenshot(self, name):
        SHOTS.mkdir(parents=True, exist_ok=True)
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path = SHOTS / f"{name}.png"
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self):
        self.ws.close()
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture
def chrome():
    c = Chrome()
    yield c
    c.close()


def register(http, body):
    r = requests.put(f"http://{http}/v1/catalog/register", json=body)
    assert r.ok, r.text


def test_the_dashboard_shows_services_live_proxy_sync_and_the_intention_matrix(chrome, tmp_path):
    proc, (host, port) = _start_server("-dev")
    grpc_addr = proc.stdout.readline().strip().split("on ", 1)[1]
    http = f"{host}:{port}"
    holder = None
    try:
        for name, native in (("web", False), ("api", True), ("billing", False)):
            register(http, {"Node": f"node-{name}", "Address": "127.0.0.1",
                            "Service": {"Service": name, "ID": f"{name}-1", "Port": 9000, "Connect": {"Native": native}}})
        register(http, {"Node": "node-client", "Address": "127.0.0.1",
                        "Service": {"Service": "client", "ID": "client-1", "Port": 1, "Connect": {"Native": True}}})
        r = requests.put(f"http://{http}/v1/connect/intentions/exact?source=web&destination=api", json={"Action": "deny"})
        assert r.ok, r.text
        r = requests.put(f"http://{http}/v1/connect/intentions/exact?source=billing&destination=api", json={"Action": "allow"})
        assert r.ok, r.text

        # Services.
        chrome.open(f"http://{http}/ui#services")
        chrome.wait("document.querySelectorAll('#services tr[data-service]').length === 4", "the services table")
        listed = chrome.eval("[...document.querySelectorAll('#services tr[data-service]')].map(r => r.dataset.service)")
        assert listed == ["api", "billing", "client", "web"]
        chrome.screenshot("services")

        # A proxy (a proxyless gRPC client) connected to this server.
        out = subprocess.run([_meshd_binary(), "connect", "grpc-bootstrap", "-service", "client", "-http-addr", http,
                              "-grpc-addr", grpc_addr, "-cert-dir", str(tmp_path / "certs")],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        (tmp_path / "b.json").write_text(out.stdout)
        holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, GRPC_XDS_BOOTSTRAP=str(tmp_path / "b.json")))
        assert holder.stdout.readline().strip() == "ready"
        chrome.open(f"http://{http}/ui#proxies")
        row = "document.querySelector('#proxies tr[data-node=\"client-1\"]')"
        chrome.wait(f"!!{row} && {row}.querySelector('.state').innerText.includes('SYNCED') && "
                    f"{row}.querySelector('.versions').innerText.includes('EDS')", "client-1 in sync")
        before = chrome.eval(f"{row}.querySelector('.versions').innerText")
        assert "EDS" in before, before
        chrome.screenshot("proxies-before")
        # A second api instance changes client-1's load assignment: the open page shows the
        # new version by itself.
        register(http, {"Node": "node-api-2", "Address": "127.0.0.1",
                        "Service": {"Service": "api", "ID": "api-2", "Port": 9001, "Connect": {"Native": True}}})
        chrome.wait(f"{row}.querySelector('.versions').innerText !== {json.dumps(before)} && "
                    f"{row}.querySelector('.state').innerText.includes('SYNCED')", "the row's new version")
        chrome.screenshot("proxies-after")

        # Intentions.
        chrome.open(f"http://{http}/ui#intentions")
        cell = "document.querySelector('#matrix td[data-src=\"web\"][data-dst=\"api\"]')"
        chrome.wait(f"!!{cell}", "the matrix")
        assert chrome.eval(f"{cell}.className") == "cell deny"
        assert chrome.eval(f"{cell}.innerText") == "deny"
        assert chrome.eval("document.querySelector('#matrix td[data-src=\"billing\"][data-dst=\"api\"]').className") == "cell allow"
        chrome.screenshot("intentions")

        # The routing graph draws a chain.
        chrome.open(f"http://{http}/ui#chain/api")
        chrome.wait("document.querySelectorAll('#chain g.node').length >= 2", "the chain graph")
        chrome.screenshot("chain")
    finally:
        if holder:
            holder.kill()
            holder.wait()
        _stop_server(proc)


def test_with_acls_the_dashboard_asks_for_a_token_and_uses_it(chrome):
    proc, (host, port) = _start_server("-dev", "-acl-enabled", "-acl-default-policy", "deny")
    proc.stdout.readline()
    http = f"{host}:{port}"
    try:
        secret = requests.put(f"http://{http}/v1/acl/bootstrap").json()["SecretID"]
        r = requests.put(f"http://{http}/v1/catalog/register", headers={"X-Consul-Token": secret},
                         json={"Node": "n", "Address": "127.0.0.1", "Service": {"Service": "web", "Port": 80}})
        assert r.ok, r.text
        chrome.open(f"http://{http}/ui#services")
        # Anonymous (deny): the list is filtered to nothing.
        chrome.wait("!!document.getElementById('count-services')", "the page")
        assert chrome.eval("document.getElementById('count-services').innerText") == "0"
        chrome.eval(f"document.getElementById('token').value = {json.dumps(secret)}; "
                    "document.getElementById('login').requestSubmit(); true")
        chrome.wait("document.querySelectorAll('#services tr[data-service]').length === 1", "the list with the token")
        chrome.open(f"http://{http}/ui#proxies")
        chrome.wait("!!document.getElementById('count-proxies')", "the proxies page, allowed with the token")
        assert chrome.eval("document.getElementById('notice').hidden")
    finally:
        _stop_server(proc)
