// splitserve dashboard: polls /dashboard/data every second and draws what changed.
// Rates and percentiles come from two snapshots WINDOW_S apart (cumulative counters).
"use strict";

const POLL_MS = 1000;
const WINDOW_S = 10;
const HISTORY = 300; // points kept per chart (5 minutes at one per second)
const snapshots = [];
// per chart: the poll times and one array of values per line, pushed together
const chart = (lines) => ({ at: [], lines: Array.from({ length: lines }, () => []) });
const series = { load: chart(2), ttft: chart(1), itl: chart(1), nodes: chart(4) };
const targets = { ttft: null, itl: null };
const decisions = [];
let lastDecisionAt = 0;

const $ = (id) => document.getElementById(id);
const fmtS = (s) => (s === null ? "–" : s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(2)} s`);
const fmtN = (x) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));

function quantile(buckets, q) {
  // buckets: [[upper bound, count in the window], ...] ascending, cumulative
  if (!buckets.length) return null;
  const total = buckets[buckets.length - 1][1];
  if (total <= 0) return null;
  const rank = q * total;
  let lower = 0, below = 0;
  for (const [le, count] of buckets) {
    if (count >= rank) {
      if (le >= 1e308) return lower;
      const inside = count - below;
      return lower + (le - lower) * (inside > 0 ? (rank - below) / inside : 1);
    }
    lower = le; below = count;
  }
  return lower;
}

function windowBuckets(now, before, name) {
  const old = new Map(before.histograms[name].map(([le, c]) => [le, c]));
  return now.histograms[name].map(([le, c]) => [le, Math.max(0, c - (old.get(le) || 0))]);
}

function nodeSum(snap, key) {
  return snap.nodes.reduce((acc, n) => acc + ((n.counters && n.counters[key]) || 0), 0);
}

function push(c, at, values) {
  c.at.push(at);
  values.forEach((v, i) => c.lines[i].push(v));
  for (const list of [c.at, ...c.lines]) if (list.length > HISTORY) list.shift();
}

// The plot area inside the axes, in the SVG's own pixels (its viewBox follows its size).
function frame(svg) {
  const w = Math.max(160, svg.clientWidth || 400), h = Math.max(80, svg.clientHeight || 130);
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  return { left: 40, right: w - 8, top: 8, bottom: h - 18 };
}

function yTicks(max, integer) {
  const top = max > 0 ? max * 1.1 : 1;
  const raw = top / 4;
  const mag = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].find((m) => m * mag >= raw) * mag;
  if (integer) step = Math.max(1, Math.ceil(step));
  const n = Math.max(1, Math.ceil(top / step - 1e-9));
  return Array.from({ length: n + 1 }, (_, i) => Number((i * step).toPrecision(3)));
}

function fmtAge(s) {
  return s < 120 ? `${Math.round(s)} s ago` : `${(s / 60).toFixed(1)} min ago`;
}

function axes(f, ticks, y, at) {
  const parts = ticks.map((t) =>
    `<line class="grid" x1="${f.left}" x2="${f.right}" y1="${y(t)}" y2="${y(t)}"></line>` +
    `<text class="tick y" x="${f.left - 4}" y="${y(t) + 3}">${t}</text>`);
  parts.push(`<line class="axis" x1="${f.left}" x2="${f.left}" y1="${f.top}" y2="${f.bottom}"></line>`);
  const span = at.length > 1 ? at[at.length - 1] - at[0] : 0;
  const below = f.bottom + 13;
  parts.push(`<text class="tick x" x="${f.right}" y="${below}" text-anchor="end">now</text>`);
  if (span > 0) {
    parts.push(`<text class="tick x" x="${f.left}" y="${below}">${fmtAge(span)}</text>`);
  }
  return parts;
}

// A chart: its lines over time, fill then scroll. The first `areas` lines are stacked
// totals drawn as filled bands (each from the line before it); the rest as lines. An
// `integer` chart (counts) steps from one value to the next and ticks whole numbers.
function draw(id, c, { target = null, areas = 0, integer = false } = {}) {
  const svg = $(id);
  const f = frame(svg);
  const values = c.lines.flat().filter((v) => v !== null);
  if (target !== null) values.push(target);
  const ticks = yTicks(Math.max(0, ...values), integer);
  const px = (v) => Math.round(v * 10) / 10;
  const y = (v) => px(f.bottom - (v / ticks[ticks.length - 1]) * (f.bottom - f.top));
  const last = c.at[c.at.length - 1];
  const span = Math.max(1e-9, last - c.at[0]);
  const x = (j) => px(f.right - ((last - c.at[j]) / span) * (f.right - f.left));
  // counts change in steps: the level holds until the next poll
  const xy = (points) => points.flatMap((v, j) => {
    const prev = j > 0 ? points[j - 1] : null;
    if (v === null) return [];
    const here = `${x(j)},${y(v)}`;
    return integer && prev !== null && prev !== v ? [`${x(j)},${y(prev)}`, here] : [here];
  });
  const parts = axes(f, ticks, y, c.at);
  c.lines.forEach((points, i) => {
    if (i < areas) {
      const base = i ? c.lines[i - 1] : points.map(() => 0);
      const band = [...xy(points), ...xy(base).reverse()];
      parts.push(`<polygon class="a${i}" points="${band.join(" ")}"></polygon>`);
    } else {
      const line = xy(points);
      parts.push(`<polyline class="s${i}" data-n="${line.length}" points="${line.join(" ")}"></polyline>`);
    }
  });
  if (target !== null) {
    parts.push(`<line class="target" x1="${f.left}" x2="${f.right}" y1="${y(target)}" y2="${y(target)}"></line>`);
  }
  svg.innerHTML = parts.join("");
  svg.dataset.points = String(c.at.length);
}

function showLatency(id, buckets, target) {
  const qs = [0.5, 0.9, 0.99].map((q) => quantile(buckets, q));
  const el = $(id);
  el.textContent = qs.map(fmtS).join(" / ");
  el.classList.toggle("over", target !== null && qs[1] !== null && qs[1] > target);
  $(`${id}-target`).textContent = target === null ? "" : `target p90 ${fmtS(target)}`;
  return qs[1];
}

function showNodes(now, before) {
  const dt = now.at - before.at;
  const old = new Map(before.nodes.map((n) => [n.id, n]));
  const rows = now.nodes.map((n) => {
    const c = n.counters || {};
    const prev = (old.get(n.id) || {}).counters || {};
    const moved = c.transfer_bytes !== undefined && dt > 0
      ? `${((c.transfer_bytes - (prev.transfer_bytes || 0)) / dt / 1e6).toFixed(2)} MB/s` : "–";
    const usage = Math.round(n.kv_usage * 100);
    return `<tr data-node="${n.id}"><td class="text">${n.id}</td><td class="text">${n.role}</td>` +
      `<td>${n.running}</td><td>${n.waiting}</td>` +
      `<td><span class="bar"><i style="width:${usage}%"></i></span>${usage}%</td>` +
      `<td>${moved}</td><td>${c.transfer_failures === undefined ? "–" : c.transfer_failures}</td></tr>`;
  });
  document.querySelector("#nodes tbody").innerHTML = rows.join("");
}

// Per route: rates over the window, and the totals since the router started, busiest first.
function showRoutes(now, before, dt) {
  const old = before.routes || {};
  const rate = (route, key) =>
    dt > 0 ? fmtN((now.routes[route][key] - ((old[route] || {})[key] || 0)) / dt) : "–";
  const rows = Object.keys(now.routes)
    .sort((a, b) => now.routes[b].requests - now.routes[a].requests)
    .map((route) => `<tr data-route="${route}"><td class="text">${route}</td>` +
      `<td>${rate(route, "requests")}</td><td>${rate(route, "errors")}</td>` +
      `<td>${now.routes[route].requests}</td><td>${now.routes[route].errors}</td></tr>`);
  document.querySelector("#routes tbody").innerHTML = rows.join("");
}

// Each (peer read from -> reading node, transport) pair: READs/s, and the bandwidth and mean
// time over the post-to-completion windows of the READs that completed in the window.
function pairsOf(snap) {
  const out = new Map();
  for (const n of snap.nodes) {
    for (const p of (n.counters && n.counters.pairs) || []) {
      out.set(`${p.peer}>${n.id}>${p.transport}`, { ...p, node: n.id });
    }
  }
  return out;
}

function showTransfers(now, before) {
  const dt = now.at - before.at;
  const old = pairsOf(before);
  const rows = [...pairsOf(now).entries()].map(([key, p]) => {
    const b = old.get(key) || { reads: 0, window_s: 0, bytes: 0 };
    const reads = p.reads - b.reads, win = p.window_s - b.window_s, bytes = p.bytes - b.bytes;
    const gbps = win > 0 ? `${(bytes / win / 1e9).toFixed(2)} GB/s` : "–";
    const mean = reads > 0 ? fmtS(win / reads) : "–";
    return `<tr data-pair="${key}"><td class="text">${p.peer} → ${p.node}</td>` +
      `<td class="text">${p.transport}</td>` +
      `<td>${dt > 0 ? fmtN(reads / dt) : "–"}</td><td>${gbps}</td><td>${mean}</td><td>${p.reads}</td></tr>`;
  });
  $("transfers-none").hidden = rows.length > 0;
  document.querySelector("#transfers tbody").innerHTML = rows.join("");
}

function showPlanner(planner) {
  $("planner").hidden = !planner;
  $("planner-none").hidden = !!planner;
  if (!planner) return;
  targets.ttft = planner.ttft_target_s;
  targets.itl = planner.itl_target_s;
  const rows = Object.entries(planner.pools).map(([pool, p]) =>
    `<tr data-pool="${pool}"><td class="text">${pool}</td><td>${p.current}</td>` +
    `<td>${p.starting || 0}</td><td>${p.desired}</td>` +
    `<td>${p.floor}</td><td>${fmtN(p.load)}</td><td>${fmtN(p.predicted)}</td>` +
    `<td>${p.capacity === null ? "learning" : fmtN(p.capacity)}</td><td class="text">${p.reason}</td></tr>`);
  document.querySelector("#planner tbody").innerHTML = rows.join("");
  if (planner.at === lastDecisionAt) return;
  lastDecisionAt = planner.at;
  for (const [pool, p] of Object.entries(planner.pools)) {
    if (!p.direction) continue;
    const when = new Date(planner.at * 1000).toLocaleTimeString();
    decisions.unshift(`${when}: ${pool} ${p.current} → ${p.desired} (${p.reason})`);
  }
  decisions.length = Math.min(decisions.length, 20);
  $("decisions").innerHTML = decisions.map((d) => `<li>${d}</li>`).join("");
}

function update(now) {
  snapshots.push(now);
  while (snapshots.length > 2 && now.at - snapshots[1].at >= WINDOW_S) snapshots.shift();
  const before = snapshots[0];
  const dt = now.at - before.at;
  $("model").textContent = `model ${now.model}`;
  showPlanner(now.planner);
  showNodes(now, snapshots[Math.max(0, snapshots.length - 2)]);
  showRoutes(now, before, dt);
  showTransfers(now, before);
  // stacked: prefill, then prefill + decode (the planner's wish alike)
  const [p, d] = ["prefill", "decode"].map((r) => now.nodes.filter((n) => n.role === r).length);
  const wish = now.planner ? now.planner.pools : null;
  const wp = wish ? wish.prefill.desired : null;
  push(series.nodes, now.at, [p, p + d, wp, wish ? wp + wish.decode.desired : null]);
  draw("chart-nodes", series.nodes, { areas: 2, integer: true });
  if (dt <= 0) return;
  const rate = (key) => (now.router[key] - before.router[key]) / dt;
  const rps = rate("requests");
  const tps = rate("prompt_tokens") + rate("completion_tokens");
  $("rps").textContent = fmtN(rps);
  $("tps").textContent = fmtN(tps);
  push(series.load, now.at, [rps, tps / 100]);
  const ttft = showLatency("ttft", windowBuckets(now, before, "ttft"), targets.ttft);
  const itl = showLatency("itl", windowBuckets(now, before, "itl"), targets.itl);
  push(series.ttft, now.at, [ttft]);
  push(series.itl, now.at, [itl]);
  draw("chart-load", series.load);
  draw("chart-ttft", series.ttft, { target: targets.ttft });
  draw("chart-itl", series.itl, { target: targets.itl });
  const moved = (nodeSum(now, "transfer_bytes") - nodeSum(before, "transfer_bytes")) / dt;
  $("kv-rate").textContent = `${(moved / 1e6).toFixed(2)} MB/s`;
  $("kv-failures").textContent = `${nodeSum(now, "transfer_failures")} failed transfers in all`;
  const queried = nodeSum(now, "prefix_query_tokens") - nodeSum(before, "prefix_query_tokens");
  const hits = nodeSum(now, "prefix_hit_tokens") - nodeSum(before, "prefix_hit_tokens");
  $("prefix").textContent = queried > 0 ? `${((100 * hits) / queried).toFixed(1)}%` : "–";
}

async function poll() {
  try {
    const resp = await fetch("/dashboard/data", { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    update(await resp.json());
    $("status").dataset.state = "ok";
    $("status").textContent = `live, ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    $("status").dataset.state = "error";
    $("status").textContent = `router unreachable (${err.message})`;
  }
}

poll();
setInterval(poll, POLL_MS);
