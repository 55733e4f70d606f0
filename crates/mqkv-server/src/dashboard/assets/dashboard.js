// The mqkv dashboard: reads the JSON API of the server that serves it. No other files.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = { view: "keys", me: null, afters: [], nextAfter: null, feed: null, timer: null };

async function api(path, options = {}) {
  const init = { credentials: "same-origin", headers: {} , ...options };
  if (init.body !== undefined) {
    init.method = init.method || "POST";
    init.headers["content-type"] = "application/json";
    init.headers["x-mqkv-dashboard"] = "1";
    init.body = JSON.stringify(init.body);
  }
  const res = await fetch(path, init);
  let body = null;
  try { body = await res.json(); } catch (_) { body = null; }
  if (res.status === 401 && path !== "/api/login") { showLogin(); }
  return { ok: res.ok, status: res.status, body };
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}

function shownBytes(b, format) {
  if (!b) return "";
  if (format === "hex" || b.text === null) return b.hex;
  return b.text;
}

function duration(ms) {
  if (ms === null || ms === undefined) return "never";
  if (ms < 1000) return ms + " ms";
  const s = Math.round(ms / 1000);
  if (s < 120) return s + " s";
  const m = Math.round(s / 60);
  return m < 120 ? m + " min" : Math.round(m / 60) + " h";
}

// ---- who is looking ----
async function loadMe() {
  const r = await api("/api/me");
  state.me = r.body;
  const me = r.body || {};
  $("#who").textContent = me.logged_in ? "Logged in as " + me.user : (me.allowed === false ? "Not logged in" : "Viewing read-only");
  // Only a password file's users log in: without one there is nobody to log in as.
  $("#login-open").hidden = !!me.logged_in || !me.login_required;
  $("#logout").hidden = !me.logged_in;
  $("#set-form").hidden = !me.logged_in;
  if (me.allowed === false) showLogin();
}

function showLogin() {
  const d = $("#login");
  if (!d.open) d.showModal();
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("#login-error").textContent = "";
  const r = await api("/api/login", { body: { username: $("#login-user").value, password: $("#login-password").value } });
  if (r.ok) {
    $("#login").close();
    $("#login-password").value = "";
    await loadMe();
    refresh();
  } else {
    $("#login-error").textContent = (r.body && r.body.error) || "Login failed";
  }
});
$("#login-open").addEventListener("click", showLogin);
$("#logout").addEventListener("click", async () => { await api("/api/logout", { body: {} }); await loadMe(); refresh(); });

// ---- summary ----
async function loadSummary() {
  const r = await api("/api/overview");
  if (!r.ok) return;
  const o = r.body;
  const quota = (n, max) => max ? n + " / " + max : String(n);
  $("#summary").replaceChildren(
    el("span", {}, "version ", el("b", {}, o.version)),
    el("span", {}, "up ", el("b", {}, o.uptime_s < 1 ? "0 s" : duration(o.uptime_s * 1000))),
    el("span", { id: "summary-keys" }, "keys ", el("b", {}, quota(o.keys, o.max_keys))),
    el("span", {}, "bytes ", el("b", {}, quota(o.stored_bytes, o.max_bytes))),
    el("span", {}, "clients ", el("b", {}, o.connected)),
    el("span", {}, "subscriptions ", el("b", {}, o.subscriptions)),
    el("span", {}, "retained ", el("b", {}, o.retained)),
    el("span", {}, o.clustered ? "leader " : "node ", el("b", {}, o.leader === null ? "none" : o.leader)),
  );
}

// ---- keys ----
async function loadKeys(after) {
  const params = new URLSearchParams({ pattern: $("#pattern").value || "*", limit: "50" });
  if (after) params.set("after", after);
  const r = await api("/api/keys?" + params);
  if (!r.ok) { $("#keys-status").textContent = (r.body && r.body.error) || "failed"; return; }
  const format = $("#value-format").value;
  const rows = r.body.records.map((rec) => {
    const key = shownBytes(rec.key, "text");
    const actions = el("td");
    actions.append(el("button", { type: "button", onclick: () => watchKeys([rec.key.text || key]) }, "Watch"));
    if (rec.may_write && state.me && state.me.logged_in) {
      actions.append(" ", el("button", { type: "button", class: "delete", onclick: () => deleteKey(rec.key.text || key) }, "Delete"));
    }
    return el("tr", { "data-key": key },
      el("td", { class: "mono" }, key),
      el("td", { class: "mono value" }, shownBytes(rec.value, format) + (rec.size > rec.value.size ? " …" : "")),
      el("td", {}, rec.size),
      el("td", { class: "mono" }, rec.version),
      el("td", {}, duration(rec.ttl_ms)),
      actions);
  });
  $("#keys-table tbody").replaceChildren(...rows);
  state.nextAfter = r.body.next_after;
  $("#next-page").disabled = !state.nextAfter;
  $("#prev-page").disabled = state.afters.length === 0;
  $("#keys-status").textContent = rows.length + (rows.length === 1 ? " key" : " keys") + (state.nextAfter ? ", more follow" : "");
}

$("#keys-form").addEventListener("submit", (ev) => { ev.preventDefault(); state.afters = []; state.current = null; loadKeys(null); });
$("#value-format").addEventListener("change", () => loadKeys(state.current));
$("#next-page").addEventListener("click", () => { state.afters.push(state.current); state.current = state.nextAfter; loadKeys(state.current); });
$("#prev-page").addEventListener("click", () => { state.current = state.afters.pop() || null; loadKeys(state.current); });

$("#set-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const px = parseInt($("#set-px").value, 10);
  const body = { key: $("#set-key").value, value: $("#set-value").value, px_ms: px > 0 ? px : null };
  const r = await api("/api/keys/set", { body });
  $("#set-status").textContent = r.ok ? "set, version " + r.body.version : (r.body && r.body.error) || "failed";
  $("#set-status").className = r.ok ? "ok" : "error";
  loadKeys(state.current);
});

async function deleteKey(key) {
  const r = await api("/api/keys/delete", { body: { key } });
  $("#set-status").textContent = r.ok ? "deleted " + key : (r.body && r.body.error) || "failed";
  loadKeys(state.current);
}

// ---- live feed ----
function watchKeys(keys) {
  const current = state.watched || [];
  const all = [...new Set([...current, ...keys.map((k) => k.trim()).filter((k) => k)])];
  if (all.length === 0) return;
  state.watched = all;
  if (state.feed) state.feed.close();
  $("#watched").replaceChildren(...all.map((k) => el("span", { class: "chip", "data-key": k }, k)));
  const source = new EventSource("/api/feed?keys=" + encodeURIComponent(JSON.stringify(all)));
  state.feed = source;
  $("#feed-status").textContent = "connecting…";
  source.onopen = () => { $("#feed-status").textContent = "live"; };
  source.onerror = () => { $("#feed-status").textContent = "reconnecting…"; };
  source.onmessage = (m) => onChange(JSON.parse(m.data));
  if (state.view !== "feed") show("feed");
}

function onChange(c) {
  if (c.kind === "observing" || c.kind === "refused") {
    const chip = [...document.querySelectorAll("#watched .chip")].find((e) => e.dataset.key === c.key);
    if (chip && c.kind === "refused") { chip.classList.add("refused"); chip.title = c.error; chip.textContent = c.key + " — " + c.error; }
    return;
  }
  const key = shownBytes(c.key, "text");
  const row = el("tr", { class: "flash", "data-key": key, "data-kind": c.kind },
    el("td", {}, new Date().toLocaleTimeString()),
    el("td", { class: "mono" }, key),
    el("td", {}, c.kind === "set" ? "set" : "deleted"),
    el("td", { class: "mono value" }, c.kind === "set" ? shownBytes(c.value, "text") : ""),
    el("td", { class: "mono" }, c.version));
  const log = $("#feed-log");
  log.prepend(row);
  while (log.children.length > 500) log.lastChild.remove();
}

$("#feed-form").addEventListener("submit", (ev) => { ev.preventDefault(); watchKeys($("#watch-input").value.split(",")); $("#watch-input").value = ""; });
$("#unwatch-button").addEventListener("click", () => {
  if (state.feed) state.feed.close();
  state.feed = null; state.watched = [];
  $("#watched").replaceChildren();
  $("#feed-status").textContent = "stopped";
});

// ---- clients ----
async function loadClients() {
  const r = await api("/api/clients");
  if (!r.ok) return;
  const rows = r.body.sessions.map((s) => el("tr", { "data-client": s.client_id },
    el("td", { class: "mono" }, s.client_id),
    el("td", {}, s.username || "—"),
    el("td", {}, s.connected ? "connected" : "disconnected"),
    el("td", {}, s.protocol_level === 5 ? "5.0" : s.protocol_level === 4 ? "3.1.1" : s.protocol_level === 3 ? "3.1" : "—"),
    el("td", { class: "mono" }, s.subscriptions.map(([f, q]) => f + " (QoS " + q + ")").join(", ") || "—"),
    el("td", {}, s.inflight),
    el("td", {}, s.queued),
    el("td", {}, s.dropped)));
  $("#clients-table tbody").replaceChildren(...rows);
}

// ---- cluster ----
async function loadCluster() {
  const r = await api("/api/cluster");
  if (!r.ok) { $("#cluster-note").textContent = (r.body && r.body.error) || "no answer"; return; }
  let nodes;
  if (r.body.clustered) {
    const s = r.body.status;
    $("#cluster-note").textContent = "Leader: " + (s.leader === null ? "none" : "node " + s.leader) + " (asked node " + s.answered_by + ")";
    nodes = s.nodes.map((n) => [n.id, n.role || "unreachable", n.voter ? "yes" : "no", n.term, n.applied, n.cluster_addr, (n.mqtt || []).join(", ")]);
  } else {
    $("#cluster-note").textContent = "A single node: start mqkv with cluster settings to replicate the store.";
    nodes = r.body.nodes.map((n) => [n.id, n.role, "yes", n.term, n.applied, "—", "—"]);
  }
  $("#cluster-table tbody").replaceChildren(...nodes.map((cells) => el("tr", { "data-node": cells[0] }, ...cells.map((c) => el("td", {}, c === null || c === undefined ? "—" : c)))));
}

// ---- throughput ----
function drawChart(canvas, points, color) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 48, bottom = 20;
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#6b7380";
  const max = Math.max(1, ...points.map((p) => p[1]));
  const top = niceCeil(max);
  ctx.strokeStyle = "#eceff3";
  for (let i = 0; i <= 4; i++) {
    const y = 6 + (h - bottom - 6) * i / 4;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w - 6, y); ctx.stroke();
    ctx.fillText(formatNumber(top * (4 - i) / 4), 4, y + 4);
  }
  const now = Date.now(), span = 10 * 60 * 1000;
  ctx.fillText("10 min ago", left, h - 5);
  ctx.fillText("now", w - 30, h - 5);
  if (points.length === 0) { ctx.fillText("collecting…", left + 10, 30); return; }
  ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
  points.forEach(([t, v], i) => {
    const x = left + (w - 6 - left) * (1 - Math.min(1, (now - t) / span));
    const y = 6 + (h - bottom - 6) * (1 - v / top);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function formatNumber(v) {
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return Math.round(v * 10) / 10;
}

async function loadSeries() {
  const r = await api("/api/series");
  if (!r.ok) return;
  const s = r.body.samples;
  drawChart($("#chart-in"), s.map((x) => [x.at_ms, x.publishes_received]), "#1f6feb");
  drawChart($("#chart-out"), s.map((x) => [x.at_ms, x.publishes_sent]), "#8250df");
  drawChart($("#chart-store"), s.map((x) => [x.at_ms, x.store_requests]), "#2e7d32");
  drawChart($("#chart-connected"), s.map((x) => [x.at_ms, x.connected]), "#d9480f");
}

// ---- views ----
const loaders = { keys: () => loadKeys(state.current), feed: () => {}, clients: loadClients, cluster: loadCluster, throughput: loadSeries };

function show(view) {
  state.view = view;
  for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t.dataset.view === view);
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== "view-" + view;
  location.hash = view;
  refresh();
}

function refresh() {
  loadSummary();
  (loaders[state.view] || (() => {}))();
}

for (const t of document.querySelectorAll(".tab")) t.addEventListener("click", () => show(t.dataset.view));

(async function start() {
  await loadMe();
  const initial = location.hash.slice(1);
  show(loaders[initial] ? initial : "keys");
  // Everything but the keys view (which changes only on request) and the live feed (which
  // is pushed) is read again every two seconds.
  state.timer = setInterval(() => { loadSummary(); if (["clients", "cluster", "throughput"].includes(state.view)) loaders[state.view](); }, 2000);
})();
