// Partita's web console: polls /api/status every second and redraws the page.
// No framework, no build step, nothing loaded from elsewhere; the charts are
// SVG drawn here. Names from the server (topics, groups, consumers) are only
// ever set as text, never parsed as HTML.
"use strict";

const POLL_MS = 1000;
const WINDOW = 120; // samples kept for the rolling charts (two minutes)
const RATE_SPAN = 5; // rates over the last five polls: steady when a poll is late or early
const COLORS = ["#3467d6", "#1f8a4c", "#c07a00", "#8e44ad", "#c0392b", "#16a0a0", "#7f8c8d", "#d35400"];

const history = { times: [], entriesIn: [], entriesOut: [], lag: new Map() };
const recent = []; // the last RATE_SPAN + 1 statuses' totals, for rates
const topicRates = new Map(); // topic -> entries appended per second

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else node.setAttribute(k, String(v));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function fmtInt(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v : v.toFixed(1)) + " " + units[i];
}

function fmtRate(n) {
  if (n === null || n === undefined || !isFinite(n)) return "–";
  return n >= 100 ? Math.round(n).toLocaleString("en-US") : n.toFixed(1);
}

function fmtDuration(s) {
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
}

function table(id, headers, rows) {
  const t = document.getElementById(id) || el("table", { id });
  t.replaceChildren(el("tr", {}, ...headers.map(h => el("th", { class: h.num ? "num" : null }, h.label))));
  for (const row of rows) t.append(row);
  return t;
}

function cell(value, num, cls) {
  return el("td", { class: [num ? "num" : "", cls || ""].join(" ").trim() || null }, value);
}

function push(series, value) {
  series.push(value);
  if (series.length > WINDOW) series.shift();
}

// -- charts ---------------------------------------------------------------

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function drawChart(svgId, legendId, series) {
  const svg = document.getElementById(svgId);
  const W = 600, H = 200, L = 48, B = 14, T = 6;
  const values = series.flatMap(s => s.values.filter(v => v !== null));
  const top = niceMax(Math.max(0, ...values));
  svg.replaceChildren();
  for (let i = 0; i <= 5; i++) { // niceMax's tops split in five round steps
    const y = T + (H - T - B) * (1 - i / 5);
    svg.append(svgEl("line", { class: "grid", x1: L, x2: W, y1: y, y2: y }));
    const text = svgEl("text", { class: "axis", x: L - 6, y: y + 4, "text-anchor": "end" });
    const tick = top * i / 5;
    text.textContent = tick >= 100 ? fmtRate(tick) : String(Math.round(tick * 100) / 100);
    svg.append(text);
  }
  const ago = svgEl("text", { class: "axis", x: L, y: H - 1 });
  ago.textContent = "-" + Math.round(WINDOW * POLL_MS / 1000) + "s";
  svg.append(ago);
  const now = svgEl("text", { class: "axis", x: W, y: H - 1, "text-anchor": "end" });
  now.textContent = "now";
  svg.append(now);
  const legend = document.getElementById(legendId);
  legend.replaceChildren();
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const n = s.values.length;
    const points = [];
    s.values.forEach((v, j) => {
      if (v === null) return;
      const x = L + (W - L) * (WINDOW - n + j) / (WINDOW - 1);
      const y = T + (H - T - B) * (1 - v / top);
      points.push(x.toFixed(1) + "," + y.toFixed(1));
    });
    if (points.length) svg.append(svgEl("polyline", { points: points.join(" "), stroke: color, "data-series": s.name }));
    const last = s.values.length ? s.values[s.values.length - 1] : null;
    const swatch = el("i");
    swatch.style.background = color; // through the CSSOM: the page's CSP allows no inline style attribute
    legend.append(el("span", { "data-series": s.name }, swatch, s.name + " " + fmtRate(last)));
  });
}

// -- sections -------------------------------------------------------------

function renderSummary(st) {
  const n = st.node;
  const partitions = st.topics.reduce((a, t) => a + t.partitions, 0);
  const totalLag = st.groups.reduce((a, g) => a + (g.lag || 0), 0);
  const cards = [
    ["node", n.id === null ? "single" : "node " + n.id],
    ["topics", fmtInt(st.topics.length)],
    ["partitions", fmtInt(partitions)],
    ["groups", fmtInt(st.groups.length)],
    ["group lag", fmtInt(totalLag)],
    ["in /s", fmtRate(history.entriesIn[history.entriesIn.length - 1])],
    ["out /s", fmtRate(history.entriesOut[history.entriesOut.length - 1])],
    ["clients", fmtInt(n.connected_clients) + (n.blocked_clients ? " (" + n.blocked_clients + " blocked)" : "")],
  ];
  document.getElementById("summary").replaceChildren(
    ...cards.map(([name, value]) => el("div", { class: "card", "data-card": name },
                                       el("div", { class: "name" }, name), el("div", { class: "value" }, value))));
  document.getElementById("node-line").textContent =
    (n.id === null ? "single node" : "node " + n.id) + " · port " + n.port + " · Partita " + n.version +
    " (Redis " + n.redis_version + " streams) · fsync " + n.fsync + " · up " + fmtDuration(n.uptime_s);
}

function renderCluster(st) {
  const c = st.cluster;
  const section = document.getElementById("cluster");
  if (!c) {
    section.hidden = false;
    document.getElementById("cluster-line").textContent =
      "A single node (no cluster-nodes): it leads every partition.";
    document.getElementById("cluster-tables").hidden = true;
    return;
  }
  document.getElementById("cluster-tables").hidden = false;
  document.getElementById("cluster-line").textContent =
    c.nodes.length + " nodes · controller leader: " + (c.controller.leader === null ? "none" : "node " + c.controller.leader) +
    " (term " + c.controller.term + ", voters " + c.controller.voters.join(", ") + ") · this node's controller role: " +
    c.controller.role + " · leader changes seen: " + c.leader_changes;
  table("nodes", [{ label: "node" }, { label: "address" }, { label: "bus" }, { label: "role" },
                  { label: "shards led", num: true }],
        c.nodes.map(n => el("tr", { "data-node": n.id },
          cell(n.id + (n.id === c.node_id ? " (this)" : "")), cell(n.address), cell(n.bus_port),
          el("td", {}, n.controller ? el("span", { class: "tag ok" }, "controller") : null,
             n.voter ? el("span", { class: "tag" }, "voter") : null,
             n.fenced ? el("span", { class: "tag bad" }, "fenced") : null),
          cell(n.shards_led, true))));
  table("shards", [{ label: "shard" }, { label: "slots" }, { label: "leader" }, { label: "epoch", num: true },
                   { label: "replicas" }, { label: "ISR" }],
        c.shards.map(s => el("tr", { "data-shard": s.shard },
          cell(s.shard), cell(s.slots), cell("node " + s.leader), cell(s.epoch, true),
          cell(s.replicas.join(", ")),
          el("td", {}, el("span", { class: "tag " + (s.isr.length < s.replicas.length ? "warn" : "ok") },
                          s.isr.join(", "))))));
}

function renderTopics(st) {
  const list = document.getElementById("topic-list");
  if (!st.topics.length) {
    list.replaceChildren(el("p", { class: "muted" }, "No topics yet: XADD creates one, or TOPIC CREATE."));
    return;
  }
  list.replaceChildren(...st.topics.map(t => {
    const rows = t.partition_list.map(p => el("tr", { "data-partition": p.partition },
      cell(p.key), cell(p.leader === null ? "this node" : "node " + p.leader + (p.leading ? " (this)" : "")),
      cell(p.replicas.length ? p.isr.join(", ") + " / " + p.replicas.join(", ") : "–"),
      cell(fmtInt(p.log_start_offset), true), cell(fmtInt(p.log_end_offset), true),
      cell(fmtInt(p.high_watermark), true), cell(fmtInt(p.entries), true),
      cell(fmtInt(p.segments), true), cell(fmtBytes(p.size_bytes), true)));
    const rate = topicRates.get(t.name);
    return el("div", { class: "topic", "data-topic": t.name, "data-partitions": t.partitions },
      el("h3", {}, t.name, el("span", { class: "muted partition-count" }, t.partitions + " partition" +
        (t.partitions === 1 ? "" : "s") + " · " + fmtInt(t.entries) + " entries · " + fmtBytes(t.size_bytes) +
        " · " + fmtRate(rate) + " appended/s")),
      table(null, [{ label: "partition" }, { label: "leader" }, { label: "ISR / replicas" },
                   { label: "start offset", num: true }, { label: "end offset", num: true },
                   { label: "high watermark", num: true }, { label: "entries", num: true },
                   { label: "segments", num: true }, { label: "size", num: true }], rows));
  }));
}

function renderGroups(st) {
  const list = document.getElementById("group-list");
  if (!st.groups.length) {
    list.replaceChildren(el("p", { class: "muted" }, "No consumer groups yet: XGROUP CREATE makes one."));
    return;
  }
  list.replaceChildren(...st.groups.map(g => {
    const members = g.members.length
      ? el("p", {}, "members: ", ...g.members.map(m => el("span", { class: "tag " + (m.alive ? "ok" : "bad"),
              "data-member": m.name }, m.name + " → " + (m.partitions.length ? m.partitions.join(", ") : "none"))))
      : el("p", { class: "muted" }, "consumers: " + (g.consumers.join(", ") || "none") +
           " (no topic-wide members: partitions are read by their keys)");
    const rows = g.partitions.map(p => el("tr", { "data-partition": p.partition, "data-lag": p.lag },
      cell(p.partition), cell(p.owner || p.consumers.map(c => c.name).join(", ") || "–"),
      cell(p.last_id), cell(fmtInt(p.entries_read), true), cell(fmtInt(p.pending), true),
      cell(fmtInt(p.lag), true, p.lag > 1000 ? "lag-high" : null)));
    return el("div", { class: "group", "data-topic": g.topic, "data-group": g.group, "data-lag": g.lag,
                       "data-pending": g.pending },
      el("h3", {}, g.group, el("span", { class: "muted" }, "on " + g.topic + " · lag " + fmtInt(g.lag) +
        " · pending " + fmtInt(g.pending))),
      members,
      table(null, [{ label: "partition" }, { label: "assigned to / consumers" }, { label: "last delivered" },
                   { label: "entries read", num: true }, { label: "pending", num: true },
                   { label: "lag", num: true }], rows));
  }));
}

// -- polling --------------------------------------------------------------

function record(st) {
  recent.push({ time_ms: st.time_ms, node: st.node, topics: new Map(st.topics.map(t => [t.name, t.entries_added])) });
  if (recent.length > RATE_SPAN + 1) recent.shift();
  const first = recent[0];
  const dt = (st.time_ms - first.time_ms) / 1000;
  if (recent.length > 1 && dt > 0) {
    push(history.entriesIn, Math.max(0, (st.node.entries_in - first.node.entries_in) / dt));
    push(history.entriesOut, Math.max(0, (st.node.entries_out - first.node.entries_out) / dt));
    for (const t of st.topics) {
      if (first.topics.has(t.name)) topicRates.set(t.name, Math.max(0, (t.entries_added - first.topics.get(t.name)) / dt));
    }
  }
  push(history.times, st.time_ms);
  const seen = new Set();
  for (const g of st.groups) {
    const name = g.group + " @ " + g.topic;
    seen.add(name);
    if (!history.lag.has(name)) history.lag.set(name, new Array(Math.max(0, history.times.length - 1)).fill(null));
    push(history.lag.get(name), g.lag);
  }
  for (const [name, values] of history.lag) {
    if (!seen.has(name)) push(values, null);
    if (values.every(v => v === null)) history.lag.delete(name);
  }
}

async function poll() {
  try {
    const response = await fetch("/api/status", { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) throw new Error(response.status + " " + response.statusText);
    const st = await response.json();
    record(st);
    renderSummary(st);
    renderCluster(st);
    renderTopics(st);
    renderGroups(st);
    drawChart("chart-throughput", "legend-throughput",
              [{ name: "in", values: history.entriesIn }, { name: "out", values: history.entriesOut }]);
    drawChart("chart-lag", "legend-lag", [...history.lag].map(([name, values]) => ({ name, values })));
    document.getElementById("updated").textContent = "updated " + new Date(st.time_ms).toLocaleTimeString();
    document.body.dataset.ready = String(Number(document.body.dataset.ready || 0) + 1);
  } catch (e) {
    document.getElementById("updated").textContent = "not updated: " + e.message;
  }
}

poll();
setInterval(poll, POLL_MS);
