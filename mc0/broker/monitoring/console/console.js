// mc0 console: one page over the broker's own JSON pages (/varz, /connz, /subsz, /servicez, /consumerz,
// /journalz, /mailboxz). Plain JS and SVG, nothing fetched from elsewhere. Every name (identity, topic,
// service, journal, consumer) is put in the page as text (textContent), never as markup.
// At scale: the big tables (connections, subscriptions, consumers) are paged, sorted and filtered by the
// broker (/connz, /subsz, /consumerz's limit, offset, sort, order, filter): the page holds PAGE_ROWS rows
// of each, and every table is updated in place (a row kept by its key, a cell written only when its text
// changed), never rebuilt whole at each poll.
"use strict";

// Every 2 s, /varz (the header, the overview and its charts) and the open view's pages are asked together,
// so that one snapshot of the broker answers them all (what five open consoles cost: docs/OPERATIONS.md).
const EVERY_MS = 2000;
const HISTORY_S = 300; // charts: the last 5 minutes
const VIEWS = ["overview", "connections", "topics", "services", "journals", "mailboxes", "cluster"];
const PAGE_ROWS = 100; // rows of a server-paged table on screen
const RE_VIEW_MS = 5000; // a sort, a page or a filter of what is shown: a snapshot this recent will do

// Action buttons (POST /admin/OP, shown only when /varz says "actions": true): per view, what each does.
const ACTIONS = {
  connections: [{ label: "Close", op: "conn.close", args: (r) => ({ id: r.name }), confirm: (r) => `Close connection ${r.name}?` }],
  consumers: [{ label: "Delete", op: "consumer.rm", args: (r) => ({ journal: r.journal, name: r.name }),
    confirm: (r) => `Delete consumer ${r.name} of journal ${r.journal}?` }],
  journals: [{ label: "Purge", op: "journal.purge", args: (r) => ({ journal: r.name }),
    confirm: (r) => `Purge every record of journal ${r.name}?` }],
};

const state = {
  view: "overview",
  varz: null,
  history: [], // {t, published, delivered, rpc, rpcErrors, bytesIn, bytesOut, rss}
  previous: {}, // per table: name -> {t, figures} for per-row rates
  sorts: {},
  offsets: {}, // server-paged tables: the first row shown
  reView: {}, // server-paged tables: the next fetch re-sorts, pages or filters what is shown
  tables: {}, // per table: what is on screen (head, rows by key)
  actions: false,
  failures: 0,
};

// ------------------------------------------------------------ formatting
const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

function num(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return Math.abs(n) >= 100 || Number.isInteger(n) ? integer.format(n) : decimal.format(n);
}
function rate(n) {
  return n === null || n === undefined ? "–" : `${num(n)}/s`;
}
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return i === 0 ? `${integer.format(v)} B` : `${decimal.format(v)} ${units[i]}`;
}
function byteRate(n) {
  return n === null || n === undefined ? "–" : `${bytes(n)}/s`;
}
function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.max(0, Math.floor(s));
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${sec}s`;
  return `${sec}s`;
}
function plural(n, word) {
  return `${num(n)} ${word}${n === 1 ? "" : "s"}`;
}
function ms(n) {
  return n === null || n === undefined ? "–" : `${decimal.format(n)} ms`;
}
function since(iso) {
  const t = Date.parse(iso);
  return Number.isNaN(t) ? "–" : `${duration((Date.now() - t) / 1000)} ago`;
}

// ------------------------------------------------------------ DOM helpers (text only)
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child); // strings become text nodes
  return node;
}
function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}
function $(id) {
  return document.getElementById(id);
}

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store", headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

// ------------------------------------------------------------ tables
// columns: {key, label, kind: "text" | "name" | "num" | "bytes" | "rate" | "byterate" | "ms" | "badge" | "since",
//           value(row) (optional), sort: false}
// opts: {key(row): the row's identity (kept across polls), paged: sorted by the broker (no local sort)}
function textual(col) {
  return col.kind === "text" || col.kind === "name" || col.kind === "badge" || col.kind === "since";
}

function tableState(table, id, columns, showActions) {
  const signature = columns.map((c) => c.key).join("|") + (showActions ? "|+" : "");
  let t = state.tables[id];
  if (t && t.table === table && t.signature === signature) return t;
  clear(table);
  t = { table, signature, head: el("thead"), body: el("tbody"), rows: new Map(), empty: null, ths: [] };
  const head = el("tr");
  for (const col of columns) {
    const th = el("th", { class: textual(col) ? "text" : "", text: col.label });
    if (col.sort !== false) {
      th.classList.add("sortable");
      th.addEventListener("click", () => {
        const sort = state.sorts[id] || { key: null, asc: false };
        const asc = sort.key === col.key ? !sort.asc : textual(col);
        state.sorts[id] = { key: col.key, asc };
        state.offsets[id] = 0;
        state.reView[id] = true;
        refreshView();
      });
    }
    t.ths.push([col, th]);
    head.append(th);
  }
  if (showActions) head.append(el("th", { text: "" }));
  t.head.append(head);
  table.append(t.head, t.body);
  state.tables[id] = t;
  return t;
}

function renderTable(table, id, columns, rows, emptyText, actions, opts) {
  const options = opts || {};
  const sort = state.sorts[id] || { key: null, asc: false };
  if (sort.key && !options.paged) {
    const col = columns.find((c) => c.key === sort.key);
    const value = (r) => (col && col.value ? col.value(r) : r[sort.key]);
    rows = rows.slice().sort((a, b) => {
      const x = value(a), y = value(b);
      const order = typeof x === "number" && typeof y === "number" ? x - y : String(x ?? "").localeCompare(String(y ?? ""));
      return sort.asc ? order : -order;
    });
  }
  const showActions = Boolean(state.actions && actions && actions.length);
  const t = tableState(table, id, columns, showActions);
  for (const [col, th] of t.ths) {
    const on = sort.key === col.key;
    th.classList.toggle("sorted", on);
    th.classList.toggle("asc", on && sort.asc);
    th.classList.toggle("desc", on && !sort.asc);
  }
  const keyOf = options.key || ((r, i) => String(i));
  const seen = new Set();
  let previous = null;
  rows.forEach((row, i) => {
    const key = keyOf(row, i);
    seen.add(key);
    let entry = t.rows.get(key);
    if (!entry) {
      const tr = el("tr");
      const tds = columns.map(() => el("td"));
      tr.append(...tds);
      entry = { tr, tds, sigs: columns.map(() => null), row };
      if (showActions) tr.append(actionCell(actions, () => entry.row));
      t.rows.set(key, entry);
    }
    entry.row = row;
    columns.forEach((col, c) => fill(entry, c, col, col.value ? col.value(row) : row[col.key], row));
    const want = previous ? previous.nextSibling : t.body.firstChild;
    if (want !== entry.tr) t.body.insertBefore(entry.tr, want);
    previous = entry.tr;
  });
  for (const [key, entry] of t.rows) {
    if (!seen.has(key)) {
      entry.tr.remove();
      t.rows.delete(key);
    }
  }
  if (!rows.length) {
    if (!t.empty) t.empty = el("tr", {}, el("td", { class: "empty", colspan: String(columns.length + (showActions ? 1 : 0)) }));
    t.empty.firstChild.textContent = emptyText;
    if (t.empty.parentNode !== t.body) t.body.append(t.empty);
  } else if (t.empty && t.empty.parentNode) {
    t.empty.remove();
  }
}

// A cell's text, class and title from its value; the cell is written only when they changed.
function fill(entry, c, col, v, row) {
  let text, cls = "", title = "";
  switch (col.kind) {
    case "name": cls = "text name"; text = v === "" ? "(empty)" : String(v ?? ""); title = String(v ?? ""); break;
    case "text": cls = "text"; text = String(v ?? ""); break;
    case "badge": cls = `text badge-cell ${v[1] || ""}`; text = v[0]; break;
    case "since": cls = "text"; text = since(v); title = String(v ?? ""); break;
    case "bytes": text = bytes(v); break;
    case "rate": text = rate(v); break;
    case "byterate": text = byteRate(v); break;
    case "ms": text = ms(v); break;
    case "duration": text = duration(v); break;
    default: text = num(v);
  }
  if (typeof v === "number" && v === 0 && col.kind !== "text") cls += " zero";
  const extra = col.cls ? col.cls(row) : "";
  if (extra) cls += ` ${extra}`;
  const sig = `${cls}\u0000${title}\u0000${text}`;
  if (entry.sigs[c] === sig) return;
  entry.sigs[c] = sig;
  const td = entry.tds[c];
  td.className = cls.trim();
  td.title = title;
  if (col.kind === "badge") {
    clear(td).append(el("span", { class: `badge ${v[1] || ""}`, text }));
  } else {
    td.textContent = text;
  }
}

// A server-paged table's query: its sort, order, page and filter (and, for a re-view, a recent snapshot).
function pageQuery(id, filterId, serverSorts) {
  const sort = state.sorts[id];
  const params = new URLSearchParams({ limit: String(PAGE_ROWS), offset: String(state.offsets[id] || 0) });
  if (sort && sort.key && serverSorts[sort.key]) {
    const [field, defaultAsc] = serverSorts[sort.key];
    params.set("sort", field);
    if (sort.asc !== defaultAsc) params.set("order", sort.asc ? "asc" : "desc");
  }
  const needle = filterId ? $(filterId).value.trim() : "";
  if (needle) params.set("filter", needle.slice(0, 200));
  if (state.reView[id]) params.set("max_age_ms", String(RE_VIEW_MS));
  state.reView[id] = false;
  return params.toString();
}

// Its pager: "1–100 of 10,000" with the previous and next pages.
function renderPager(table, id, shown, count) {
  const wrap = table.closest(".table-wrap");
  let pager = wrap.nextElementSibling;
  if (!pager || !pager.classList.contains("pager")) {
    pager = el("div", { class: "pager" }, el("button", { type: "button", text: "‹ Previous" }), el("span", { class: "hint" }),
      el("button", { type: "button", text: "Next ›" }));
    const [prev, , next] = pager.children;
    prev.addEventListener("click", () => turnPage(id, -PAGE_ROWS));
    next.addEventListener("click", () => turnPage(id, PAGE_ROWS));
    wrap.after(pager);
  }
  const offset = state.offsets[id] || 0;
  const [prev, label, next] = pager.children;
  const text = count ? `${num(offset + 1)}–${num(offset + shown)} of ${num(count)}` : "none";
  if (label.textContent !== text) label.textContent = text;
  prev.disabled = offset <= 0;
  next.disabled = offset + shown >= count;
  pager.state = { count };
}

function turnPage(id, by) {
  state.offsets[id] = Math.max(0, (state.offsets[id] || 0) + by);
  state.reView[id] = true;
  refreshView();
}

// Per-row rates: the difference of a counter between two readings of the same page.
function withRates(id, rows, keyOf, fields) {
  const now = Date.now();
  const before = state.previous[id] || {};
  const after = {};
  for (const row of rows) {
    const key = keyOf(row);
    const old = before[key];
    after[key] = { t: now, figures: Object.fromEntries(fields.map((f) => [f, row[f]])) };
    for (const f of fields) {
      const dt = old ? (now - old.t) / 1000 : 0;
      row[`${f}_rate`] = old && dt > 0.2 && row[f] >= old.figures[f] ? (row[f] - old.figures[f]) / dt : null;
    }
  }
  state.previous[id] = after;
  return rows;
}

// ------------------------------------------------------------ actions (when the broker has them enabled)
function actionCell(actions, rowOf) {
  const td = el("td", { class: "actions-cell" });
  for (const action of actions) {
    const button = el("button", { type: "button", text: action.label });
    button.addEventListener("click", () => runAction(action, rowOf()));
    td.append(button);
  }
  return td;
}

async function runAction(action, row) {
  if (!window.confirm(action.confirm(row))) return;
  let token = sessionStorage.getItem("mc0-admin-token");
  if (!token) {
    token = window.prompt("Admin token (the file [http] admin_token_file names):") || "";
    if (!token) return;
    sessionStorage.setItem("mc0-admin-token", token);
  }
  const log = $("action-log");
  try {
    const response = await fetch(`admin/${action.op}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
      body: JSON.stringify(action.args(row)),
    });
    if (response.status === 401) sessionStorage.removeItem("mc0-admin-token");
    const text = await response.text();
    log.textContent = `${action.op}: ${response.status} ${text.slice(0, 300)}`;
  } catch (exc) {
    log.textContent = `${action.op}: ${exc.message}`;
  }
  log.hidden = false;
  setTimeout(() => { log.hidden = true; }, 6000);
  refreshView();
}

// ------------------------------------------------------------ charts (SVG)
const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function niceMax(v, binary) {
  if (v <= 0) return 1;
  if (binary) { // bytes: a round number of KiB, MiB, ...
    const unit = 1024 ** Math.max(0, Math.floor(Math.log(v) / Math.log(1024)));
    return niceMax(v / unit, false) * unit;
  }
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function drawChart(container, series, format, binary) {
  const width = Math.max(300, container.clientWidth || 600);
  const height = 170;
  const left = 64, right = 8, top = 8, bottom = 18;
  const now = Date.now() / 1000;
  const x = (t) => left + ((t - (now - HISTORY_S)) / HISTORY_S) * (width - left - right);
  let peak = 0;
  for (const s of series) for (const [, v] of s.points) if (v !== null && v > peak) peak = v;
  const top_ = niceMax(peak, binary);
  const y = (v) => top + (1 - v / top_) * (height - top - bottom);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img" });
  for (let i = 0; i <= 4; i += 1) {
    const v = (top_ * i) / 4;
    root.append(svg("line", { class: "grid-line", x1: left, x2: width - right, y1: y(v), y2: y(v) }));
    const label = svg("text", { class: "axis-label", x: left - 6, y: y(v) + 4, "text-anchor": "end" });
    label.textContent = format(v);
    root.append(label);
  }
  for (const [t, text] of [[now - HISTORY_S, "-5 min"], [now - HISTORY_S / 2, "-2.5 min"], [now, "now"]]) {
    const label = svg("text", { class: "axis-label", x: x(t), y: height - 2, "text-anchor": t === now ? "end" : "middle" });
    label.textContent = text;
    root.append(label);
  }
  series.forEach((s, i) => {
    const pts = s.points.filter(([, v]) => v !== null).map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`);
    if (pts.length > 1) {
      const first = pts[0].split(","), last = pts[pts.length - 1].split(",");
      root.append(svg("polygon", { class: `area-${i}`, points: `${first[0]},${y(0)} ${pts.join(" ")} ${last[0]},${y(0)}` }));
      root.append(svg("polyline", { class: `series-${i}`, points: pts.join(" ") }));
    }
  });
  const legend = el("div", { class: "legend" });
  series.forEach((s, i) => {
    const last = s.points.length ? s.points[s.points.length - 1][1] : null;
    legend.append(el("span", {}, el("i", { class: `l${i}` }), s.label, el("b", { text: format(last ?? 0) })));
  });
  clear(container).append(root, legend);
}

function drawCharts() {
  const h = state.history;
  const pts = (key) => h.map((p) => [p.t, p[key]]);
  drawChart($("chart-messages"), [{ label: "in (published)", points: pts("published") }, { label: "out (delivered)", points: pts("delivered") }], rate);
  drawChart($("chart-rpc"), [{ label: "requests", points: pts("rpc") }, { label: "errors and timeouts", points: pts("rpcErrors") }], rate);
  drawChart($("chart-bytes"), [{ label: "in", points: pts("bytesIn") }, { label: "out", points: pts("bytesOut") }], byteRate, true);
  drawChart($("chart-memory"), [{ label: "resident memory", points: pts("rss") }], bytes, true);
}

// ------------------------------------------------------------ /varz: header, overview, history
function record(varz) {
  const t = varz.now_s;
  const last = state.history[state.history.length - 1];
  const entry = { t, raw: varz, rss: varz.rss_bytes };
  const per = (key) => {
    if (!last || t <= last.t || varz[key] < last.raw[key]) return null;
    return (varz[key] - last.raw[key]) / (t - last.t);
  };
  entry.published = per("published");
  entry.delivered = per("delivered");
  entry.rpc = per("rpc_requests");
  entry.rpcErrors = per("rpc_errors");
  entry.bytesIn = per("in_bytes");
  entry.bytesOut = per("out_bytes");
  entry.errors = per("errors");
  if (last && t <= last.t) return;
  state.history.push(entry);
  while (state.history.length && state.history[0].t < t - HISTORY_S) state.history.shift();
}

function card(label, value, sub, tone) {
  return el("div", { class: `card ${tone || ""}` }, el("div", { class: "label", text: label }),
    el("div", { class: "value", text: value, title: value }), el("div", { class: "sub", text: sub || "\u00a0" }));
}

function renderOverview() {
  const v = state.varz;
  if (!v) return;
  const last = state.history[state.history.length - 1] || {};
  const cluster = v.cluster || {};
  clear($("cards")).append(
    card("Version", v.version || "–", `mc0 broker at ${location.host}`),
    card("Uptime", duration(v.uptime_s), `since ${new Date(Date.parse(v.start)).toLocaleString()}`),
    card("Peers", num(v.connections), plural(v.subscriptions, "subscription")),
    card("Messages in", rate(last.published), `${num(v.published)} published`),
    card("Messages out", rate(last.delivered), `${num(v.delivered)} delivered`),
    card("RPC", rate(last.rpc), `${plural(v.services, "service")}, ${plural(v.rpc_requests, "request")}`),
    card("Error rate", rate(last.errors), `${num(v.errors)} refused, ${num(v.rpc_errors)} RPC failed`, last.errors > 0 ? "bad" : ""),
    card("Memory", bytes(v.rss_bytes), `CPU ${decimal.format(v.cpu_s)} s`),
    card("Queued for peers", bytes(v.pending_bytes), `${num(v.dropped)} dropped`),
    card("Slow consumers", num(v.slow_consumers), "evicted since start", v.slow_consumers > 0 ? "bad" : ""),
    card("Cluster", cluster.name ? cluster.name : "standalone",
      cluster.name ? (cluster.nats_connected ? "NATS connected" : "NATS DISCONNECTED") : "no [cluster]",
      cluster.name ? (cluster.nats_connected ? "good" : "bad") : ""),
  );
  drawCharts();
}

function renderHeader() {
  const v = state.varz;
  const dot = $("status-dot");
  if (!v) {
    dot.className = "dot bad";
    $("status-text").textContent = "broker not answering";
    return;
  }
  const cluster = v.cluster || {};
  $("broker-name").textContent = cluster.name ? `${cluster.name} · ${location.host}` : location.host;
  const cutOff = cluster.name && !cluster.nats_connected;
  const namesake = cluster.name && cluster.name_collision;
  dot.className = `dot ${cutOff || namesake ? "warn" : "ok"}`;
  $("status-text").textContent = cutOff ? "degraded: NATS unreachable"
    : namesake ? `degraded: another broker is also named ${cluster.name}` : `live · ${new Date().toLocaleTimeString()}`;
  $("foot-left").textContent = `mc0 ${v.version || ""} · up ${duration(v.uptime_s)} · ${num(v.connections)} peers`;
  if (state.actions !== Boolean(v.actions)) {
    state.actions = Boolean(v.actions);
    refreshView();
  }
}

async function pollVarz() {
  try {
    state.varz = await getJSON("varz");
    state.failures = 0;
    record(state.varz);
  } catch (exc) {
    state.failures += 1;
    if (state.failures > 1) state.varz = null;
  }
  renderHeader();
  if (state.view === "overview") renderOverview();
  else if (state.view === "cluster") renderCluster();
}

// ------------------------------------------------------------ views
// The columns the broker sorts a server-paged table by: column key -> [its field, ascending by default].
const CONN_SORTS = {
  name: ["name", true], address: ["address", true], dialect: ["dialect", true], uptime_s: ["uptime_s", false],
  num_subscriptions: ["num_subscriptions", false], msgs_in: ["msgs_in", false], msgs_out: ["msgs_out", false],
  pending_bytes: ["pending_bytes", false], dropped: ["dropped", false], idle_s: ["idle_s", false],
};
const PATTERN_SORTS = { pattern: ["pattern", true], subscribers: ["subscribers", false] };
const CONSUMER_SORTS = {
  name: ["name", true], journal: ["journal", true], owner: ["owner", true], num_pending: ["num_pending", false],
  num_ack_pending: ["num_ack_pending", false], ack_floor: ["ack_floor", false], redelivered: ["redelivered", false],
  dead_lettered: ["dead_lettered", false], store: ["store", true],
};
const sortable = (columns, sorts) => columns.map((c) => (c.key in sorts ? c : { ...c, sort: false }));

async function renderConnections() {
  const again = state.reView.conn ? `&max_age_ms=${RE_VIEW_MS}` : ""; // (a re-view: both from the same snapshot)
  const query = pageQuery("conn", "conn-filter", CONN_SORTS);
  const [open, closed] = await Promise.all([getJSON(`connz?${query}`), getJSON(`connz?state=closed&limit=256${again}`)]);
  const rows = withRates("conn", open.connections, (r) => r.name, ["msgs_in", "msgs_out", "bytes_in", "bytes_out"]);
  const needle = $("conn-filter").value.trim();
  $("conn-count").textContent = needle ? `${num(open.count)} of ${num(open.total)}` : num(open.total);
  renderTable($("conn-table"), "conn", sortable([
    { key: "name", label: "Peer", kind: "name" },
    { key: "address", label: "Address", kind: "text" },
    { key: "dialect", label: "Dialect", kind: "text", value: (r) => `${r.dialect} ${r.protocol}` },
    { key: "uptime_s", label: "Connected", kind: "duration" },
    { key: "num_subscriptions", label: "Subs" },
    { key: "msgs_in_rate", label: "In msg/s", kind: "rate" },
    { key: "msgs_out_rate", label: "Out msg/s", kind: "rate" },
    { key: "bytes_in_rate", label: "In B/s", kind: "byterate" },
    { key: "bytes_out_rate", label: "Out B/s", kind: "byterate" },
    { key: "msgs_in", label: "Msgs in" },
    { key: "msgs_out", label: "Msgs out" },
    { key: "pending_bytes", label: "Queued", kind: "bytes" },
    { key: "dropped", label: "Dropped" },
    { key: "idle_s", label: "Idle", kind: "duration" },
  ], CONN_SORTS), rows, needle ? "No connection matches the filter." : "No peer is connected.", ACTIONS.connections,
  { key: (r) => r.name, paged: true });
  renderPager($("conn-table"), "conn", rows.length, open.count);
  $("closed-count").textContent = num(closed.count);
  renderTable($("closed-table"), "closed", [
    { key: "name", label: "Peer", kind: "name" },
    { key: "address", label: "Address", kind: "text" },
    { key: "reason", label: "Reason", kind: "badge", value: (r) => [r.reason, /evicted|revoked|expired|error/.test(r.reason) ? "bad" : ""] },
    { key: "closed_at", label: "Closed", kind: "since" },
    { key: "uptime_s", label: "Was up", kind: "duration" },
    { key: "msgs_in", label: "Msgs in" },
    { key: "msgs_out", label: "Msgs out" },
    { key: "dropped", label: "Dropped" },
  ], closed.connections, "No connection has closed since the broker started.", null,
  { key: (r) => `${r.name} ${r.closed_at}` });
}

async function renderTopics() {
  const subsz = await getJSON(`subsz?${pageQuery("patterns", "pattern-filter", PATTERN_SORTS)}`);
  const topics = withRates("topics", subsz.topics.map((t) => ({ ...t, key: t.other ? "\u0000other" : t.topic })), (r) => r.key, ["msgs", "bytes"]);
  const needle = $("topic-filter").value.trim().toLowerCase();
  const shown = needle ? topics.filter((t) => t.topic.toLowerCase().includes(needle)) : topics;
  renderTable($("topic-table"), "topics", [
    { key: "topic", label: "Topic", kind: "name", value: (r) => (r.other ? "(other topics)" : r.topic) },
    { key: "msgs_rate", label: "Msg/s", kind: "rate" },
    { key: "bytes_rate", label: "Bytes/s", kind: "byterate" },
    { key: "msgs", label: "Messages" },
    { key: "bytes", label: "Bytes", kind: "bytes" },
  ], shown, "Nothing published yet.", null, { key: (r) => r.key });
  const patterns = Object.entries(subsz.patterns).map(([pattern, subscribers]) => ({ pattern, subscribers }));
  $("sub-count").textContent = num(subsz.subscriptions);
  renderTable($("pattern-table"), "patterns", [
    { key: "pattern", label: "Pattern", kind: "name" },
    { key: "subscribers", label: "Subscribers" },
  ], patterns, $("pattern-filter").value.trim() ? "No pattern matches the filter." : "No subscription.", null,
  { key: (r) => r.pattern, paged: true });
  renderPager($("pattern-table"), "patterns", patterns.length, subsz.num_patterns);
  const groups = [];
  for (const [group, byPattern] of Object.entries(subsz.groups)) {
    for (const [pattern, members] of Object.entries(byPattern)) groups.push({ group, pattern, members });
  }
  renderTable($("group-table"), "groups", [
    { key: "group", label: "Group", kind: "name" },
    { key: "pattern", label: "Pattern", kind: "name" },
    { key: "members", label: "Members" },
  ], groups, "No queue group.", null, { key: (r) => `${r.group}\u0000${r.pattern}` });
}

async function renderServices() {
  const servicez = await getJSON("servicez");
  const rows = withRates("services", Object.entries(servicez).map(([name, s]) => ({ name, ...s })), (r) => r.name, ["requests", "errors"]);
  $("svc-count").textContent = num(rows.length);
  renderTable($("svc-table"), "services", [
    { key: "name", label: "Service", kind: "name" },
    { key: "workers", label: "Workers" },
    { key: "idle", label: "Idle" },
    { key: "queued", label: "Queued" },
    { key: "in_flight", label: "In flight" },
    { key: "requests_rate", label: "Req/s", kind: "rate" },
    { key: "requests", label: "Requests" },
    { key: "errors", label: "Errors" },
    { key: "timeouts", label: "Timeouts" },
    { key: "p50", label: "p50", kind: "ms", value: (r) => r.latency_ms.p50 },
    { key: "p95", label: "p95", kind: "ms", value: (r) => r.latency_ms.p95 },
    { key: "p99", label: "p99", kind: "ms", value: (r) => r.latency_ms.p99 },
  ], rows, "No service has a worker.");
}

async function renderJournals() {
  const again = state.reView.consumers ? `?max_age_ms=${RE_VIEW_MS}` : "";
  const query = pageQuery("consumers", "consumer-filter", CONSUMER_SORTS);
  const [journalz, consumerz] = await Promise.all([getJSON(`journalz${again}`), getJSON(`consumerz?${query}`)]);
  renderTable($("journal-table"), "journals", [
    { key: "name", label: "Journal", kind: "name" },
    { key: "store", label: "Store", kind: "text" },
    { key: "records", label: "Records" },
    { key: "bytes", label: "Size", kind: "bytes" },
    { key: "first_seq", label: "First seq" },
    { key: "last_seq", label: "Last seq" },
    { key: "topics", label: "Topics", kind: "name", value: (r) => (r.topics || []).join(", ") },
  ], journalz.journals, "No journal is configured ([journals.NAME]).", ACTIONS.journals, { key: (r) => r.name });
  const rows = consumerz.consumers;
  $("consumer-count").textContent = num(consumerz.count);
  renderTable($("consumer-table"), "consumers", sortable([
    { key: "name", label: "Consumer", kind: "name" },
    { key: "journal", label: "Journal", kind: "name" },
    { key: "owner", label: "Owner", kind: "name" },
    { key: "num_pending", label: "Pending", value: (r) => r.num_pending, cls: (r) => (r.num_pending_exact ? "" : "approx") },
    { key: "num_ack_pending", label: "Unacked" },
    { key: "ack_floor", label: "Ack floor" },
    { key: "redelivered", label: "Redelivered" },
    { key: "dead_lettered", label: "Dead-lettered" },
    { key: "store", label: "Store", kind: "text" },
  ], CONSUMER_SORTS), rows, $("consumer-filter").value.trim() ? "No consumer matches the filter." : "No durable consumer.",
  ACTIONS.consumers, { key: (r) => `${r.journal}\u0000${r.name}`, paged: true });
  renderPager($("consumer-table"), "consumers", rows.length, consumerz.count);
}

async function renderMailboxes() {
  const mailboxz = await getJSON("mailboxz");
  const s = mailboxz.summary;
  $("mailbox-summary").textContent = `${num(s.messages)} letters kept for ${num(s.identities)} identities, ${bytes(s.bytes)}` +
    (s.journal ? ` · journal ${s.journal}` : " · memory only");
  const rows = Object.entries(mailboxz.mailboxes).map(([identity, m]) => ({ identity, ...m }));
  renderTable($("mailbox-table"), "mailboxes", [
    { key: "identity", label: "Identity", kind: "name" },
    { key: "messages", label: "Letters" },
    { key: "bytes", label: "Size", kind: "bytes" },
  ], rows, "No letter is waiting (identities with a session connected hold none).");
}

function renderCluster() {
  const v = state.varz;
  if (!v) return;
  const c = v.cluster || {};
  clear($("cluster-cards")).append(
    card("Cluster", c.name || "standalone", c.name ? "this broker's name" : "no [cluster] configured"),
    card("NATS", c.name ? (c.nats_connected ? "connected" : "disconnected") : "not used", c.nats_server || (c.name ? "" : "standalone"),
      c.name ? (c.nats_connected ? "good" : "bad") : ""),
    card("Brokers", num((c.brokers || []).length), "with a route here"),
  );
  renderTable($("broker-table"), "brokers", [{ key: "name", label: "Broker", kind: "name" }],
    (c.brokers || []).map((name) => ({ name })), c.name ? "No other broker has a route here yet." : "Standalone: no cluster.");
  const link = Object.entries(c.link || {}).map(([name, value]) => ({ name, value }));
  renderTable($("link-table"), "link", [{ key: "name", label: "Counter", kind: "name" }, { key: "value", label: "Value" }],
    link, "No cluster link.");
}

const RENDER = {
  connections: renderConnections,
  topics: renderTopics,
  services: renderServices,
  journals: renderJournals,
  mailboxes: renderMailboxes,
  cluster: async () => renderCluster(),
  overview: async () => renderOverview(),
};

let viewBusy = false;
async function refreshView() {
  if (viewBusy) return;
  viewBusy = true;
  try {
    await RENDER[state.view]();
  } catch (exc) {
    $("status-text").textContent = `error: ${exc.message}`;
  } finally {
    viewBusy = false;
  }
}

function show(view) {
  state.view = VIEWS.includes(view) ? view : "overview";
  for (const section of document.querySelectorAll("section.view")) section.hidden = section.dataset.view !== state.view;
  for (const tab of document.querySelectorAll("#tabs a")) tab.classList.toggle("active", tab.dataset.view === state.view);
  refreshView();
}

function start() {
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  // A filter typed: the broker filters (a server-paged table), once the typing pauses.
  const tableOf = { "conn-filter": "conn", "pattern-filter": "patterns", "consumer-filter": "consumers" };
  let typing = null;
  for (const id of ["conn-filter", "topic-filter", "pattern-filter", "consumer-filter"]) {
    $(id).addEventListener("input", () => {
      if (tableOf[id]) {
        state.offsets[tableOf[id]] = 0;
        state.reView[tableOf[id]] = true;
      }
      clearTimeout(typing);
      typing = setTimeout(refreshView, 200);
    });
  }
  window.addEventListener("resize", () => state.view === "overview" && drawCharts());
  show(location.hash.slice(1) || "overview");
  const tick = () => Promise.all([pollVarz(), ["overview", "cluster"].includes(state.view) ? null : refreshView()]);
  tick();
  setInterval(tick, EVERY_MS);
}

document.addEventListener("DOMContentLoaded", start);
