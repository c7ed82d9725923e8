"""The dashboard at /ui in headless Chromium (Debian's, MESHD_CHROMIUM), driven over the
Chrome DevTools protocol: the services page lists the registered services with their health
counts, a proxy's row changes version after a write (live, without reloading) and shows the
reasons of build problems, a proxy's troubleshoot page shows meshd's findings and walks a
request to its upstream, the intention matrix shows a deny, and the config entries page
lists every entry by kind. Screenshots go to target/ui-screenshots/ (not committed); DOM
checks decide."""

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

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHOTS = ROOT / "target" / "ui-screenshots"
# `cargo xtask screenshots` sets this: the shots the docs show are written there too.
UPDATE_DOCS = os.environ.get("MESHD_UPDATE_DOCS_SCREENSHOTS") == "1"

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
        # URL substring -> JSON body served in place of the server's answer (see `serve`).
        self.canned = {}

    def _command(self, method, params=None):
        mid = next(self.ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params or {}}))
        return mid

    def send(self, method, params=None):
        mid = self._command(method, params)
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == "Fetch.requestPaused":
                self._fulfill(msg["params"])
            elif msg.get("id") == mid:
                assert "error" not in msg, msg
                return msg["result"]

    def _fulfill(self, paused):
        body = next((b for part, b in self.canned.items() if part in paused["request"]["url"]), None)
        if body is None:
            self._command("Fetch.continueRequest", {"requestId": paused["requestId"]})
            return
        self._command("Fetch.fulfillRequest", {
            "requestId": paused["requestId"], "responseCode": 200,
            "responseHeaders": [{"name": "Content-Type", "value": "application/json"}],
            "body": base64.b64encode(json.dumps(body).encode()).decode(),
        })

    def serve(self, url_part, body):
        """Answers the page's requests whose URL contains `url_part` with `body` (JSON)."""
        self.canned[url_part] = body
        self.send("Fetch.enable", {"patterns": [{"urlPattern": f"*{url_part}*"}]})

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

    def screenshot(self, name, docs=None):
        """Saves a screenshot as a test artifact; `docs` names the image under docs/ it
        replaces when the docs' screenshots are being regenerated."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        data = base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])
        path = SHOTS / f"{name}.png"
        path.write_bytes(data)
        if docs and UPDATE_DOCS:
            (ROOT / "docs" / docs).write_bytes(data)
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
        health = {"web": "passing", "billing": "critical"}
        for name, native in (("web", False), ("api", True), ("billing", False)):
            body = {"Node": f"node-{name}", "Address": "127.0.0.1",
                    "Service": {"Service": name, "ID": f"{name}-1", "Port": 9000, "Connect": {"Native": native}}}
            if name in health:
                body["Check"] = {"CheckID": f"{name}-alive", "Name": "alive", "ServiceID": f"{name}-1",
                                 "Status": health[name]}
            register(http, body)
        register(http, {"Node": "node-client", "Address": "127.0.0.1",
                        "Service": {"Service": "client", "ID": "client-1", "Port": 1, "Connect": {"Native": True}}})
        r = requests.put(f"http://{http}/v1/connect/intentions/exact?source=web&destination=api", json={"Action": "deny"})
        assert r.ok, r.text
        r = requests.put(f"http://{http}/v1/connect/intentions/exact?source=billing&destination=api", json={"Action": "allow"})
        assert r.ok, r.text

        # Services.
        chrome.open(f"http://{http}/ui#services")
        # The server's own `consul` service is listed too, as in Consul's UI.
        chrome.wait("document.querySelectorAll('#services tr[data-service]').length === 5", "the services table")
        listed = chrome.eval("[...document.querySelectorAll('#services tr[data-service]')].map(r => r.dataset.service)")
        assert listed == ["api", "billing", "client", "consul", "web"]
        cell = "document.querySelector('#services tr[data-service=\"{}\"] td.health').innerText"
        assert chrome.eval(cell.format("web")) == "1 passing"
        assert chrome.eval(cell.format("billing")) == "1 critical"
        # The cards count instances, and critical ones.
        cards = chrome.eval("[...document.querySelectorAll('.card')].map(c => [...c.children].map(x => x.textContent).join(' '))")
        assert cards == ["5 services", "5 instances", "1 critical instances"], cards
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
        chrome.screenshot("proxies-after", docs="ui-proxies.png")

        # Troubleshoot, from the proxy's row: meshd's findings, then a request walked to
        # one of its upstreams, step by step.
        chrome.eval(f"{row}.querySelector('a').click()")
        chrome.wait("location.hash === '#troubleshoot/client-1' && !!document.querySelector('#fine')", "the troubleshoot page")
        assert chrome.eval("document.querySelector('#problems').innerText").strip() == "ok No problem found."
        fine = chrome.eval("[...document.querySelectorAll('#fine li')].map(l => l.innerText)")
        assert any(f.startswith("synced ClusterLoadAssignments: Envoy acknowledged version") for f in fine), fine
        assert chrome.eval("[...document.querySelectorAll('#walk-upstream option')].map(o => o.value)") == ["api"]
        # api's instances are connect-native and nothing of theirs runs: the walk gets as far
        # as dialling them, and fails there, as the client itself would.
        chrome.eval("document.querySelector('#walk-form button').click()")
        chrome.wait("!!document.querySelector('#steps')", "the walk")
        steps = chrome.eval("[...document.querySelectorAll('#steps tr[data-step]')].map(r => [r.dataset.step, r.dataset.ok])")
        assert steps == [["certificate", "true"], ["listener", "true"], ["target", "true"], ["instances", "true"],
                         ["handshake", "false"], ["handshake", "false"], ["intention", "true"]], steps
        assert chrome.eval("document.querySelector('#walk-result').innerText") == "The request fails at: handshake"
        assert "proxyless gRPC" in chrome.eval("document.querySelector('#steps tr[data-step=\"listener\"]').innerText")
        chrome.screenshot("troubleshoot", docs="ui-troubleshoot.png")

        # Build problems show with their reasons: the server's own answer, with a problem
        # added (no valid configuration makes one: see crates/xds/tests/protocol.rs for the
        # server's side).
        status = requests.get(f"http://{http}/v1/internal/xds-status").json()
        reason = 'upstream api: route leads to router "router:missing"'
        for stream in status:
            stream["BuildProblems"] = {"api": reason}
        chrome.serve("/v1/internal/xds-status", status)
        chrome.open(f"http://{http}/ui#proxies")
        problem = f"{row}.querySelector('.problem[data-part=\"api\"]')"
        chrome.wait(f"!!{row} && !!{problem}", "the build problem's reason")
        assert chrome.eval(f"{problem}.innerText") == f"api: {reason}"
        assert "1 build problem(s)" in chrome.eval(f"{row}.querySelector('.state').innerText")
        chrome.screenshot("proxies-build-problem")
        chrome.canned.clear()
        chrome.send("Fetch.disable")

        # Intentions.
        chrome.open(f"http://{http}/ui#intentions")
        cell = "document.querySelector('#matrix td[data-src=\"web\"][data-dst=\"api\"]')"
        chrome.wait(f"!!{cell}", "the matrix")
        assert chrome.eval(f"{cell}.className") == "cell deny"
        assert chrome.eval(f"{cell}.innerText") == "deny"
        assert chrome.eval("document.querySelector('#matrix td[data-src=\"billing\"][data-dst=\"api\"]').className") == "cell allow"
        chrome.screenshot("intentions")

        # Config entries, by kind, each expandable to its JSON.
        for entry in ({"Kind": "service-defaults", "Name": "web", "Protocol": "http"},
                      {"Kind": "service-resolver", "Name": "billing", "ConnectTimeout": "3s"}):
            r = requests.put(f"http://{http}/v1/config", json=entry)
            assert r.ok, r.text
        chrome.open(f"http://{http}/ui#config")
        chrome.wait("!!document.querySelector('#config section[data-kind=\"service-resolver\"]')", "the config entries")
        kinds = chrome.eval("[...document.querySelectorAll('#config section')].map(s => "
                            "[s.dataset.kind, [...s.querySelectorAll('details')].map(d => d.dataset.entry)])")
        assert kinds == [["service-defaults", ["web"]], ["service-resolver", ["billing"]],
                         ["service-intentions", ["api"]]], kinds
        shown = chrome.eval("const d = document.querySelector('#config details[data-entry=\"billing\"]'); "
                            "d.open = true; JSON.parse(d.querySelector('pre').innerText)")
        assert (shown["Kind"], shown["Name"], shown["ConnectTimeout"]) == ("service-resolver", "billing", "3s"), shown
        chrome.screenshot("config")

        # API gateways: listeners, the routes naming each, and their status.
        for entry in ({"Kind": "api-gateway", "Name": "edge", "Listeners": [
                          {"Name": "web", "Port": 8080, "Protocol": "http", "Hostname": "*.example.com"}]},
                      {"Kind": "http-route", "Name": "to-api", "Parents": [{"Name": "edge"}],
                       "Hostnames": ["api.example.com"], "Rules": [{"Services": [{"Name": "api"}]}]},
                      {"Kind": "http-route", "Name": "elsewhere", "Parents": [{"Name": "edge", "SectionName": "web"}],
                       "Hostnames": ["api.other.org"], "Rules": [{"Services": [{"Name": "nobody"}]}]}):
            r = requests.put(f"http://{http}/v1/config", json=entry)
            assert r.ok, r.text
        chrome.open(f"http://{http}/ui#gateways")
        chrome.wait("document.querySelectorAll('section.gateway tr[data-route]').length === 2", "the gateway's routes")
        assert chrome.eval("[...document.querySelectorAll('section[data-gateway=\"edge\"] tr[data-listener]')]"
                           ".map(r => r.innerText.split('\\t').slice(0, 4))") == [["web", "8080", "http", "*.example.com"]]
        status = "[...document.querySelectorAll('tr[data-route=\"{}\"] .condition')].map(c => [c.dataset.type, c.dataset.status])"
        assert chrome.eval(status.format("to-api")) == [["Accepted", "True"], ["ResolvedRefs", "True"], ["Bound", "True"]]
        assert chrome.eval(status.format("elsewhere")) == [["Accepted", "True"], ["ResolvedRefs", "False"], ["Bound", "False"]]
        why = chrome.eval("document.querySelector('tr[data-route=\"elsewhere\"]').innerText")
        assert "NoMatchingListenerHostname" in why and "nobody" in why, why
        chrome.screenshot("gateways", docs="ui-gateways.png")

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
        # It says the list was filtered and asks for a token, rather than a green "0".
        assert "hidden by ACLs" in chrome.eval("document.getElementById('filtered').innerText")
        chrome.eval(f"document.getElementById('token').value = {json.dumps(secret)}; "
                    "document.getElementById('login').requestSubmit(); true")
        chrome.wait("document.querySelectorAll('#services tr[data-service]').length === 2", "the list with the token (web and the server's consul)")
        assert chrome.eval("document.getElementById('filtered') === null"), "nothing hidden from management"
        chrome.open(f"http://{http}/ui#proxies")
        chrome.wait("!!document.getElementById('count-proxies')", "the proxies page, allowed with the token")
        assert chrome.eval("document.getElementById('notice').hidden")
    finally:
        _stop_server(proc)
