// meshd's dashboard: a read-only view over the HTTP API. No framework: each page fetches
// what it shows and renders it into #page; the proxies page refreshes itself.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const short = (v) => (v ? String(v).slice(0, 10) : "—");
const KINDS = ["service-defaults", "proxy-defaults", "service-router", "service-splitter", "service-resolver",
  "service-intentions", "mesh", "ingress-gateway", "terminating-gateway", "jwt-provider", "api-gateway", "http-route",
  "tcp-route", "inline-certificate", "file-system-certificate"];

let timer = null;

function token() { return sessionStorage.getItem("meshd-token") || ""; }

function notice(text) {
  const n = $("#notice");
  n.hidden = !text;
  n.textContent = text || "";
}

async function api(path) {
  const headers = {};
  if (token()) headers["X-Consul-Token"] = token();
  const resp = await fetch(path, { headers });
  if (resp.status === 403) {
    throw new Error(`Permission denied for ${path}: give a token that may read it (the field at the top right).`);
  }
  if (!resp.ok) throw new Error(`${path}: ${resp.status} ${(await resp.text()).trim()}`);
  // ACLs hid part of the answer: what the page shows is not everything there is.
  filtered = resp.headers.get("X-Consul-Results-Filtered-By-ACLs") === "true";
  return resp.json();
}

// Whether the last answer was filtered by ACLs.
let filtered = false;

function filteredNote() {
  return filtered
    ? `<div class="notice" id="filtered">Some results are hidden by ACLs: give a token that may read them (the field at the top right).</div>`
    : "";
}

function pill(cls, text) { return `<span class="pill ${cls}">${esc(text)}</span>`; }

function stamp() { $("#updated").textContent = `Updated ${new Date().toLocaleTimeString()}`; }

// Services: every service with its instances' health.
async function services(page) {
  const list = await api("/v1/internal/ui/services");
  const instances = list.reduce((a, s) => a + s.Instances, 0);
  const critical = list.reduce((a, s) => a + s.Critical, 0);
  // Green only for what the token could see in full.
  const criticalColor = critical ? "var(--bad)" : filtered ? "inherit" : "var(--ok)";
  page.innerHTML = `<h1>Services</h1><div class="sub">Every registered service and the health of its instances.</div>
    ${filteredNote()}
    <div class="cards">
      <div class="card"><div class="n" id="count-services">${list.length}</div><div class="l">services</div></div>
      <div class="card"><div class="n">${instances}</div><div class="l">instances</div></div>
      <div class="card"><div class="n" style="color:${criticalColor}">${critical}</div><div class="l">critical instances</div></div>
    </div>
    <table id="services"><thead><tr><th>Service</th><th>Kind</th><th>Instances</th><th>Health</th><th>Tags</th></tr></thead><tbody>
    ${list.map((s) => `<tr data-service="${esc(s.Name)}">
      <td><a href="#chain/${encodeURIComponent(s.Name)}">${esc(s.Name)}</a></td>
      <td>${s.Kinds.map((k) => pill("tag", k || (s.ConnectNative ? "connect-native" : "service"))).join("")}</td>
      <td>${s.Instances}</td>
      <td class="health">${s.Passing ? pill("ok", `${s.Passing} passing`) : ""}${s.Warning ? pill("warn", `${s.Warning} warning`) : ""}${s.Critical ? pill("bad", `${s.Critical} critical`) : ""}</td>
      <td>${s.Tags.map((t) => pill("idle", t)).join("")}</td></tr>`).join("")}
    </tbody></table>`;
}

const TYPE_NAMES = { Cluster: "CDS", ClusterLoadAssignment: "EDS", Listener: "LDS", RouteConfiguration: "RDS", Secret: "SDS" };

function overall(stream) {
  // Nothing sent yet: the proxy is still being set up.
  if (!stream.Types.some((t) => t.LastSent)) return "WAITING";
  let state = "SYNCED";
  for (const t of stream.Types) {
    if (t.Resources.ERROR) return "ERROR";
    if (t.Resources.STALE || t.Pending) state = "STALE";
  }
  return stream.Stuck ? "STUCK" : state;
}

// Proxies: each xDS stream's sync status, refreshed every 2 s.
async function proxies(page) {
  const streams = await api("/v1/internal/xds-status");
  const cls = { SYNCED: "ok", STALE: "warn", ERROR: "bad", STUCK: "bad", WAITING: "idle" };
  const rows = streams.map((s) => {
    const state = overall(s);
    const types = s.Types.filter((t) => t.LastSent || t.Resources.SYNCED)
      .map((t) => {
        const name = t.TypeUrl.split(".").pop();
        const version = t.LastSent ? (t.LastSent.Version || t.LastSent.Nonce) : "";
        const nack = t.LastNack ? ` title="${esc(t.LastNack.Error)}"` : "";
        return `<span class="mono"${nack}>${TYPE_NAMES[name] || name} ${esc(short(version))}</span>`;
      }).join(" · ");
    // Parts of the proxy's configuration that cannot be built: each with its reason.
    const problems = Object.entries(s.BuildProblems || {});
    const reasons = problems.map(([part, why]) =>
      `<div class="problem" data-part="${esc(part)}"><b>${esc(part)}</b>: ${esc(why)}</div>`).join("");
    // Transparent proxies: the upstreams their intentions give them, none declared.
    const implicit = s.Transparent
      ? ` <span class="pill idle mode" title="${esc((s.ImplicitUpstreams || []).join(", "))}">transparent · ${(s.ImplicitUpstreams || []).length} implicit upstream(s)</span>`
      : "";
    return `<tr data-node="${esc(s.Node)}">
      <td><a href="#troubleshoot/${encodeURIComponent(s.Node)}" title="Troubleshoot ${esc(s.Node)}"><b>${esc(s.Node)}</b></a>${implicit}</td><td>${esc(s.Protocol)}</td><td>${esc(s.Server)}</td>
      <td class="state">${pill(cls[state], state)}${problems.length ? pill("bad", `${problems.length} build problem(s)`) + reasons : ""}</td>
      <td class="versions">${types || "—"}</td>
      <td>${s.SnapshotAgeSeconds == null ? "—" : `${Math.round(s.SnapshotAgeSeconds)} s`}</td></tr>`;
  }).join("");
  page.innerHTML = `<h1>Proxies</h1><div class="sub">Each xDS stream on this server: what its proxy was sent and has acknowledged (live).</div>
    <div class="cards"><div class="card"><div class="n" id="count-proxies">${streams.length}</div><div class="l">streams</div></div>
    <div class="card"><div class="n">${streams.filter((s) => overall(s) === "SYNCED").length}</div><div class="l">in sync</div></div></div>
    <table id="proxies"><thead><tr><th>Proxy</th><th>Protocol</th><th>Server</th><th>State</th><th>Last sent (type, version)</th><th>Snapshot age</th></tr></thead>
    <tbody>${rows || `<tr><td colspan="6" class="sub">No proxy is connected to this server.</td></tr>`}</tbody></table>`;
  timer = setTimeout(() => show("proxies"), 2000);
}

// Intentions: a source × destination matrix.
async function intentions(page) {
  const list = await api("/v1/connect/intentions");
  const sources = [...new Set(list.map((i) => i.SourceName))].sort();
  const dests = [...new Set(list.map((i) => i.DestinationName))].sort();
  const cell = (src, dst) => {
    const i = list.find((x) => x.SourceName === src && x.DestinationName === dst);
    if (!i) return `<td class="cell none" data-src="${esc(src)}" data-dst="${esc(dst)}">·</td>`;
    const action = i.Action || (i.Permissions && i.Permissions.length ? "L7" : "");
    const c = action === "deny" ? "deny" : action === "allow" ? "allow" : "";
    return `<td class="cell ${c}" data-src="${esc(src)}" data-dst="${esc(dst)}" title="precedence ${i.Precedence}">${esc(action)}</td>`;
  };
  page.innerHTML = `<h1>Intentions</h1><div class="sub">Who may call whom: rows are sources, columns destinations; empty cells follow the default policy.</div>
    ${list.length ? `<table class="matrix" id="matrix"><thead><tr><th>source \\ destination</th>${dests.map((d) => `<th class="src">${esc(d)}</th>`).join("")}</tr></thead>
    <tbody>${sources.map((s) => `<tr><th class="src">${esc(s)}</th>${dests.map((d) => cell(s, d)).join("")}</tr>`).join("")}</tbody></table>`
      : `<div class="sub">No intentions.</div>`}`;
}

// Config entries, by kind.
async function config(page) {
  const parts = [];
  for (const kind of KINDS) {
    let entries = [];
    try { entries = await api(`/v1/config/${kind}`); } catch (e) { if (String(e).includes("Permission")) throw e; }
    if (!entries.length) continue;
    // A private key is never put on a page, whoever may read it.
    for (const e of entries) if (e.PrivateKey && kind === "inline-certificate") e.PrivateKey = "(hidden)";
    parts.push(`<section data-kind="${esc(kind)}"><h2>${esc(kind)} <span class="pill idle">${entries.length}</span></h2>` + entries.map((e) =>
      `<details data-entry="${esc(e.Name)}"><summary><b>${esc(e.Name)}</b> <span class="sub">modified at index ${e.ModifyIndex}</span></summary><pre class="mono">${esc(JSON.stringify(e, null, 2))}</pre></details>`).join("") + `</section>`);
  }
  page.innerHTML = `<h1>Config entries</h1><div class="sub">Every config entry, by kind.</div><div id="config">${parts.join("") || `<div class="sub">No config entries.</div>`}</div>`;
}

// A status's conditions, as pills (green when as wished) with their messages.
function conditions(status) {
  const list = (status && status.Conditions) || [];
  return list.map((c) => {
    const good = c.Type === "Conflicted" ? c.Status === "False" : c.Status === "True";
    const at = c.Resource && c.Resource.SectionName ? ` (${c.Resource.SectionName})` : "";
    return `<div class="condition" data-type="${esc(c.Type)}" data-status="${esc(c.Status)}">${pill(good ? "ok" : "bad", `${c.Type}${at}: ${c.Status}`)}
      <span class="sub">${esc(c.Reason)} — ${esc(c.Message)}</span></div>`;
  }).join("");
}

// API gateways: their listeners, the routes naming them and every entry's status.
async function gateways(page) {
  const list = await api("/v1/config/api-gateway");
  let routes = [];
  for (const kind of ["http-route", "tcp-route"]) {
    try { routes = routes.concat((await api(`/v1/config/${kind}`)).map((r) => ({ ...r, Kind: kind }))); }
    catch (e) { if (String(e).includes("Permission")) throw e; }
  }
  const names = (r, gw) => (r.Parents || []).some((p) => p.Name === gw);
  page.innerHTML = `<h1>API gateways</h1><div class="sub">Each gateway's listeners, the routes attached to it and what their status says.</div>
    ${filteredNote()}
    ${list.length ? list.map((g) => `<section class="gateway" data-gateway="${esc(g.Name)}"><h2>${esc(g.Name)}</h2>
      <table class="listeners"><thead><tr><th>Listener</th><th>Port</th><th>Protocol</th><th>Hostname</th><th>Certificates</th></tr></thead><tbody>
      ${g.Listeners.map((l) => `<tr data-listener="${esc(l.Name)}"><td>${esc(l.Name)}</td><td>${l.Port}</td><td>${esc(l.Protocol)}</td>
        <td>${esc(l.Hostname || "any")}</td><td>${((l.TLS && l.TLS.Certificates) || []).map((c) => pill("tag", c.Name)).join("") || "—"}</td></tr>`).join("")}
      </tbody></table>
      <div class="conditions">${conditions(g.Status)}</div>
      <h3>Routes</h3>
      <table class="routes"><thead><tr><th>Route</th><th>Hostnames</th><th>Status</th></tr></thead><tbody>
      ${routes.filter((r) => names(r, g.Name)).map((r) => `<tr data-route="${esc(r.Name)}"><td>${pill("idle", r.Kind)} ${esc(r.Name)}</td>
        <td>${(r.Hostnames || []).map(esc).join(", ") || "—"}</td><td>${conditions(r.Status)}</td></tr>`).join("") || `<tr><td colspan="3" class="sub">No route names this gateway.</td></tr>`}
      </tbody></table></section>`).join("") : `<div class="sub">No API gateways.</div>`}`;
}

// A service's discovery chain as a graph: routers, splitters and resolvers, then targets.
async function chain(page, service) {
  const list = await api("/v1/internal/ui/services");
  const names = list.map((s) => s.Name);
  service = service || names[0];
  const picker = `<select id="chain-service">${names.map((n) => `<option${n === service ? " selected" : ""}>${esc(n)}</option>`).join("")}</select>`;
  if (!service) { page.innerHTML = `<h1>Routing</h1><div class="sub">No service.</div>`; return; }
  const { Chain: c } = await api(`/v1/discovery-chain/${encodeURIComponent(service)}`);
  const depth = {}; const order = [];
  const edges = [];
  const visit = (name, d) => {
    if (name in depth && depth[name] >= d) return;
    depth[name] = d; if (!order.includes(name)) order.push(name);
    const n = c.Nodes[name];
    if (!n) return;
    for (const r of n.Routes || []) {
      const m = r.Definition && r.Definition.Match && r.Definition.Match.HTTP;
      const label = m ? (m.PathPrefix || m.PathExact || m.PathRegex || "match") : "default";
      edges.push([name, r.NextNode, label]); visit(r.NextNode, d + 1);
    }
    for (const s of n.Splits || []) { edges.push([name, s.NextNode, `${s.Weight}%`]); visit(s.NextNode, d + 1); }
    if (n.Resolver) {
      const t = `target:${n.Resolver.Target}`; edges.push([name, t, ""]);
      depth[t] = Math.max(depth[t] || 0, d + 1); if (!order.includes(t)) order.push(t);
      for (const f of (n.Resolver.Failover && n.Resolver.Failover.Targets) || []) {
        const ft = `target:${f}`; edges.push([name, ft, "failover"]);
        depth[ft] = Math.max(depth[ft] || 0, d + 1); if (!order.includes(ft)) order.push(ft);
      }
    }
  };
  visit(c.StartNode, 0);
  const cols = {}; for (const n of order) (cols[depth[n]] = cols[depth[n]] || []).push(n);
  const W = 230, H = 64, pos = {};
  let height = 0;
  for (const [d, ns] of Object.entries(cols)) ns.forEach((n, i) => { pos[n] = { x: 20 + d * (W + 70), y: 20 + i * (H + 24) }; height = Math.max(height, pos[n].y + H + 20); });
  const width = 40 + Object.keys(cols).length * (W + 70);
  const box = (name) => {
    const p = pos[name]; const isTarget = name.startsWith("target:");
    const n = c.Nodes[name]; const kind = isTarget ? "target" : (n ? n.Type : "");
    const label = isTarget ? name.slice(7) : (n ? n.Name : name);
    const fill = { router: "#e7edff", splitter: "#fff4db", resolver: "#e6f4ea", target: "#f1f3f5" }[kind] || "#fff";
    return `<g class="node" data-node="${esc(name)}"><rect x="${p.x}" y="${p.y}" width="${W}" height="${H}" rx="8" fill="${fill}" stroke="#c5ccd6"/>
      <text x="${p.x + 10}" y="${p.y + 22}" font-weight="600">${esc(kind)}</text><text x="${p.x + 10}" y="${p.y + 44}">${esc(label.length > 32 ? label.slice(0, 31) + "…" : label)}</text></g>`;
  };
  const line = ([a, b, label]) => {
    const p = pos[a], q = pos[b]; if (!p || !q) return "";
    const x1 = p.x + W, y1 = p.y + H / 2, x2 = q.x, y2 = q.y + H / 2;
    return `<path d="M${x1},${y1} C${x1 + 40},${y1} ${x2 - 40},${y2} ${x2},${y2}" fill="none" stroke="#8a94a6" marker-end="url(#arrow)"/>
      ${label ? `<text x="${(x1 + x2) / 2 - 16}" y="${(y1 + y2) / 2 - 6}" fill="#3b4a8a">${esc(label)}</text>` : ""}`;
  };
  page.innerHTML = `<h1>Routing</h1><div class="sub">The compiled discovery chain of ${picker} (protocol <b>${esc(c.Protocol)}</b>).</div>
    <div class="chain"><svg id="chain" width="${width}" height="${height}" xmlns="http://www.w3.org/2000/svg">
      <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#8a94a6"/></marker></defs>
      ${edges.map(line).join("")}${order.map(box).join("")}</svg></div>`;
  $("#chain-service").onchange = (e) => { location.hash = `#chain/${encodeURIComponent(e.target.value)}`; };
}

// Troubleshoot: what is wrong with one proxy, first (meshd's half of `meshd troubleshoot
// proxy`), and a request walked to one of its upstreams (`meshd troubleshoot upstream`).
async function troubleshoot(page, id) {
  if (!id) {
    const streams = await api("/v1/internal/xds-status");
    const ids = [...new Set(streams.map((s) => s.Node))].sort();
    page.innerHTML = `<h1>Troubleshoot</h1><div class="sub">Pick a proxy connected to this server.</div>
      <ul id="troubleshoot-proxies">${ids.map((n) => `<li><a href="#troubleshoot/${encodeURIComponent(n)}">${esc(n)}</a></li>`).join("")
      || `<li class="sub">No proxy is connected to this server.</li>`}</ul>`;
    return;
  }
  const enc = encodeURIComponent(id);
  const t = await api(`/v1/internal/troubleshoot/proxy/${enc}`);
  let upstreams = [];
  try { upstreams = ((await api(`/v1/internal/proxy-status/${enc}`)).Upstreams || []).map((u) => u.ID); } catch (e) { /* not registered: the findings say so */ }
  const finding = (f, cls) => `<li class="finding" data-kind="${esc(f.Kind)}">${pill(cls, f.Kind)} ${esc(f.Message)}</li>`;
  page.innerHTML = `<h1>Troubleshoot ${esc(id)}</h1>
    <div class="sub">What meshd sent this proxy and what it answered: what is wrong first. (Envoy's own half — its clusters' health, the certificates it holds — is in <code>meshd troubleshoot proxy -envoy-admin ADDR</code>.)</div>
    <ul id="problems" class="findings">${t.Problems.map((f) => finding(f, "bad")).join("") || `<li class="finding">${pill("ok", "ok")} No problem found.</li>`}</ul>
    <ul id="fine" class="findings">${t.Fine.map((f) => finding(f, "ok")).join("")}</ul>
    <h2>Walk a request</h2>
    ${upstreams.length ? "" : `<div class="sub" id="no-upstreams">This proxy has no upstream to walk to (or meshd holds no configuration for it here).</div>`}
    <form id="walk-form" class="walk"${upstreams.length ? "" : " hidden"}>
      <label>Upstream <select id="walk-upstream">${upstreams.map((u) => `<option>${esc(u)}</option>`).join("")}</select></label>
      <label>Method <select id="walk-method">${["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"].map((m) => `<option>${m}</option>`).join("")}</select></label>
      <label>Path <input id="walk-path" value="/"></label>
      <button type="submit" class="link">Walk</button>
    </form>
    <div id="walk"></div>`;
  $("#walk-form").onsubmit = (e) => { e.preventDefault(); walk(id); };
}

// The walk of a request from proxy `id` to the upstream the form names, step by step (the
// intentions that decide at each service reached included).
async function walk(id) {
  const out = $("#walk");
  const q = new URLSearchParams({ upstream: $("#walk-upstream").value, method: $("#walk-method").value, path: $("#walk-path").value });
  out.innerHTML = `<div class="sub">Walking…</div>`;
  try {
    const w = await api(`/v1/internal/troubleshoot/upstream/${encodeURIComponent(id)}?${q}`);
    const failing = w.Steps.find((s) => !s.Ok);
    out.innerHTML = `<div id="walk-result" class="${failing ? "notice" : "pill ok"}">${failing ? `The request fails at: <b>${esc(failing.Step)}</b>` : "The request gets through."}</div>
      <table id="steps"><thead><tr><th></th><th>Step</th><th>What was found</th></tr></thead><tbody>
      ${w.Steps.map((s) => `<tr data-step="${esc(s.Step)}" data-ok="${s.Ok}"><td>${pill(s.Ok ? "ok" : "bad", s.Ok ? "ok" : "fails")}</td><td><b>${esc(s.Step)}</b></td><td class="mono">${esc(s.Detail)}</td></tr>`).join("")}
      </tbody></table>`;
    stamp();
  } catch (e) {
    out.innerHTML = "";
    notice(e.message);
  }
}

const PAGES = { services, proxies, intentions, config, gateways, chain, troubleshoot };

async function show(name, arg) {
  clearTimeout(timer);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === name);
  const page = $("#page");
  try {
    await PAGES[name](page, arg);
    notice("");
    stamp();
  } catch (e) {
    notice(e.message);
    if (name === "proxies") timer = setTimeout(() => show("proxies"), 2000);
  }
}

function route() {
  const [name, arg] = (location.hash.slice(1) || "services").split("/");
  show(PAGES[name] ? name : "services", arg && decodeURIComponent(arg));
}

$("#login").onsubmit = (e) => {
  e.preventDefault();
  sessionStorage.setItem("meshd-token", $("#token").value.trim());
  $("#token").value = "";
  route();
};
window.onhashchange = route;
route();
