"use strict";
// The health page: fetches /api/v1/state every poll period and rebuilds its parts in place
// (no reload). Every string a peer wrote reaches the page as a text node (Node.append with a
// string, textContent): never as markup, so a name like "<script>..." is shown, not run.

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

// an element with fixed attributes (never a peer's string as an attribute name) and text or element children
function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  node.append(...children.map((c) => (c instanceof Node ? c : String(c))));
  return node;
}

function number(value, digits) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  return seconds < 7200 ? `${Math.round(seconds / 60)} min` : `${Math.round(seconds / 3600)} h`;
}

function bytes(n) {
  if (!n) return "0";
  const units = ["B", "kB", "MB", "GB", "TB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log10(n) / 3));
  return `${(n / 1000 ** i).toFixed(i ? 1 : 0)} ${units[i]}`;
}

// how the page checked a host's checkpoint (swarm/health/checks.py)
const CHECKS = { whole: "downloaded, sha256 matches", chunk: "chunk list and one chunk" };

function label(peerId, name) { return name || `peer …${peerId.slice(-6)}`; }

function renderSummary(state) {
  document.getElementById("swarm").textContent = state.swarm ?? "…";
  document.getElementById("config").textContent = state.config_hash ? `config ${state.config_hash.slice(0, 12)}, ${state.n_blocks} blocks;` : "";
  const when = state.updated_at ? new Date(state.updated_at * 1000).toLocaleTimeString() : "–";
  document.getElementById("updated").textContent = `updated ${when} (every ${state.poll_period_s ?? "?"} s)`;
  const status = document.getElementById("model-status");
  status.textContent = state.status;
  status.className = `status ${state.status}`;
  const missing = state.missing_blocks ?? [];
  document.getElementById("missing").textContent = missing.length
    ? `no verified host for block${missing.length > 1 ? "s" : ""} ${missing.join(", ")}`
    : state.status === "healthy" ? "every block has a live peer whose checkpoint this page has checked" : "";
  const skipped = (state.blocks ?? []).filter((b) => b.skipped > 0);
  const skippedLine = document.getElementById("skipped");
  skippedLine.hidden = !skipped.length;
  skippedLine.textContent = `malformed records skipped: ${skipped.map((b) => `block ${b.block}: ${b.skipped}`).join(", ")}`;
  document.getElementById("errors").replaceChildren(...(state.errors ?? []).map((e) => el("li", {}, e)));
}

function hostCells(h) {
  const checkpoint = h.checkpoint_step === null ? "none" : `step ${h.checkpoint_step}, ${age(h.checkpoint_age_s)} old`;
  const ping = h.rtt_s === null ? "–" : `${(h.rtt_s * 1000).toFixed(1)} ms`;
  return [
    el("td", { class: "text", title: h.peer_id }, `…${h.peer_id.slice(-12)}`),
    el("td", { class: "text name" }, h.public_name),
    el("td", { class: "text" }, h.state),
    el("td", {}, h.step),
    el("td", {}, number(h.loss, 3)),
    el("td", {}, number(h.throughput, 2)),
    el("td", { class: "text" }, checkpoint),
    el("td", { class: h.verified ? "text yes" : "text no" }, h.verified ? `verified (${CHECKS[h.check] ?? h.check})` : `unverified: ${h.problem}`),
    el("td", { class: "text" }, h.reached),
    el("td", {}, ping),
    el("td", {}, `${bytes(h.sync_bytes_sent)} / ${bytes(h.sync_bytes_received)}`),
    el("td", {}, h.drift === null ? "–" : Number(h.drift).toExponential(1)),
    el("td", { class: "text" }, h.version),
  ];
}

function renderHosts(state) {
  const rows = [];
  for (const block of state.blocks ?? []) {
    const hosts = state.hosts.filter((h) => h.block === block.block);
    const verdict = block.healthy ? "healthy" : "broken";
    const head = el("td", { class: `block ${verdict}`, rowspan: Math.max(1, hosts.length) }, `${block.block}: ${verdict}`);
    if (!hosts.length) {
      rows.push(el("tr", { class: "block-start", "data-block": block.block }, head, el("td", { class: "missing text", colspan: 13 }, "no live host")));
    }
    hosts.forEach((h, i) => {
      const cells = hostCells(h);
      rows.push(el("tr", { class: i ? "" : "block-start", "data-block": block.block }, ...(i ? cells : [head, ...cells])));
    });
  }
  document.querySelector("#hosts tbody").replaceChildren(...rows);
}

function plot(series, width = 380, height = 170) {
  const pad = { left: 42, right: 8, top: 8, bottom: 22 };
  const points = series.flatMap((s) => s.points);
  const [t0, t1] = [Math.min(...points.map((p) => p[0])), Math.max(...points.map((p) => p[0]))];
  const [y0, y1] = [Math.min(...points.map((p) => p[2])), Math.max(...points.map((p) => p[2]))];
  const x = (t) => pad.left + ((t - t0) / Math.max(t1 - t0, 1e-9)) * (width - pad.left - pad.right);
  const y = (v) => height - pad.bottom - ((v - y0) / Math.max(y1 - y0, 1e-9)) * (height - pad.top - pad.bottom);
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  svg.append(
    el("svg:line", { x1: pad.left, y1: height - pad.bottom, x2: width - pad.right, y2: height - pad.bottom, stroke: "#9aa4b5" }),
    el("svg:line", { x1: pad.left, y1: pad.top, x2: pad.left, y2: height - pad.bottom, stroke: "#9aa4b5" }),
    el("svg:text", { x: 2, y: pad.top + 8 }, y1.toFixed(2)),
    el("svg:text", { x: 2, y: height - pad.bottom }, y0.toFixed(2)),
    el("svg:text", { x: pad.left, y: height - 6 }, "0 s"),
    el("svg:text", { x: width - pad.right - 40, y: height - 6 }, `${Math.round(t1 - t0)} s`),
  );
  series.forEach((s, i) => {
    const coords = s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[2]).toFixed(1)}`).join(" ");
    const line = s.points.length > 1
      ? el("svg:polyline", { points: coords, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 2 })
      : el("svg:circle", { cx: x(s.points[0][0]), cy: y(s.points[0][2]), r: 3, fill: COLORS[i % COLORS.length] });
    line.append(el("svg:title", {}, label(s.peer_id, s.public_name)));
    svg.append(line);
  });
  return svg;
}

function renderPlots(state) {
  const figures = [];
  for (const block of state.blocks ?? []) {
    const series = (state.loss_history ?? {})[block.block] ?? [];
    const legend = el("ul", { class: "legend" }, ...series.map((s, i) =>
      el("li", {}, el("span", { class: `swatch c${i % COLORS.length}` }), label(s.peer_id, s.public_name))));
    const body = series.length ? plot(series) : el("p", { class: "meta" }, "no loss announced yet");
    figures.push(el("figure", { "data-block": block.block }, el("figcaption", {}, `block ${block.block}`), body, legend));
  }
  document.getElementById("plots").replaceChildren(...figures);
}

function renderPings(state) {
  const peers = [...new Map((state.hosts ?? []).map((h) => [h.peer_id, h])).values()];
  const rtt = new Map((state.pings ?? []).map((p) => [`${p.from} ${p.to}`, p.seconds]));
  const name = (h) => `${label(h.peer_id, h.public_name)} (block ${h.block})`;
  document.querySelector("#pings thead").replaceChildren(el("tr", {}, el("th", {}, "from \\ to"), ...peers.map((h) => el("th", {}, name(h)))));
  document.querySelector("#pings tbody").replaceChildren(...peers.map((from) => el("tr", {}, el("th", {}, name(from)),
    ...peers.map((to) => {
      const seconds = rtt.get(`${from.peer_id} ${to.peer_id}`);
      return el("td", {}, seconds === undefined ? "–" : (seconds * 1000).toFixed(1));
    }))));
  document.getElementById("no-pings").hidden = rtt.size > 0;
}

// the leaderboard: each key's work that two other keys attest (swarm/p2p/ledger.py)
function renderLeaderboard(state) {
  const rows = state.contributions ?? [];
  document.querySelector("#leaderboard tbody").replaceChildren(...rows.map((c, i) => el("tr", { "data-key": c.key },
    el("td", {}, i + 1),
    el("td", { class: "text name" }, c.name || "–"),
    el("td", { class: "text", title: c.key }, c.key.slice(0, 12)),
    el("td", {}, c.verified_steps),
    el("td", {}, c.accepted_payloads),
    el("td", {}, c.agreed_answers),
    el("td", {}, age(c.uptime_s)),
    el("td", { class: "text" }, c.attesters.join(" ")))));
  document.getElementById("no-contributions").hidden = rows.length > 0;
}

function render(state) {
  renderSummary(state);
  if (!state.blocks) return;  // no poll has finished yet
  renderHosts(state);
  renderLeaderboard(state);
  renderPlots(state);
  renderPings(state);
}

async function refresh() {
  let period = 2;
  try {
    const response = await fetch("/api/v1/state", { cache: "no-store" });
    const state = await response.json();
    period = Math.max(1, Number(state.poll_period_s) || 2);
    render(state);
  } catch (error) {
    document.getElementById("errors").replaceChildren(el("li", {}, `the page's server did not answer: ${error}`));
  }
  setTimeout(refresh, period * 1000);
}

refresh();
