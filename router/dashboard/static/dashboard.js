// splitserve dashboard: polls /dashboard/data every second and draws what changed.
// Rates and percentiles come from two snapshots WINDOW_S apart (cumulative counters).
"use strict";

const POLL_MS = 1000;
const WINDOW_S = 10;
const HISTORY = 300; // points kept per chart (5 minutes at one per second)
const snapshots = [];
const series = { load: [[], []], ttft: [[]], itl: [[]], nodes: [[], [], [], []] };
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

function push(list, value) {
  list.push(value);
  if (list.length > HISTORY) list.shift();
}

function draw(id, lines, target) {
  const svg = $(id);
  const all = lines.flat().filter((v) => v !== null);
  if (target !== null && target !== undefined) all.push(target);
  const top = Math.max(1e-9, ...all) * 1.1;
  const y = (v) => (120 - (v / top) * 115).toFixed(1);
  const longest = Math.max(2, ...lines.map((l) => l.length));
  const parts = lines.map((points, i) => {
    const step = 400 / (longest - 1); // the charts fill up, then scroll
    const start = 400 - step * (points.length - 1);
    const xy = points
      .map((v, j) => (v === null ? null : `${(start + j * step).toFixed(1)},${y(v)}`))
      .filter((p) => p !== null);
    return `<polyline class="s${i}" data-n="${xy.length}" points="${xy.join(" ")}"></polyline>`;
  });
  if (target !== null && target !== undefined) {
    parts.push(`<polyline class="target" points="0,${y(target)} 400,${y(target)}"></polyline>`);
  }
  svg.innerHTML = parts.join("");
  svg.dataset.points = String(Math.max(0, ...lines.map((l) => l.length)));
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

function showPlanner(planner) {
  $("planner").hidden = !planner;
  $("planner-none").hidden = !!planner;
  if (!planner) return;
  targets.ttft = planner.ttft_target_s;
  targets.itl = planner.itl_target_s;
  const rows = Object.entries(planner.pools).map(([pool, p]) =>
    `<tr data-pool="${pool}"><td class="text">${pool}</td><td>${p.current}</td><td>${p.desired}</td>` +
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
  const pools = ["prefill", "decode"].map((r) => now.nodes.filter((n) => n.role === r).length);
  const wish = ["prefill", "decode"].map((r) => (now.planner ? now.planner.pools[r].desired : null));
  [...pools, ...wish].forEach((v, i) => push(series.nodes[i], v));
  draw("chart-nodes", series.nodes, null);
  if (dt <= 0) return;
  const rate = (key) => (now.router[key] - before.router[key]) / dt;
  const rps = rate("requests");
  const tps = rate("prompt_tokens") + rate("completion_tokens");
  $("rps").textContent = fmtN(rps);
  $("tps").textContent = fmtN(tps);
  push(series.load[0], rps);
  push(series.load[1], tps / 100);
  const ttft = showLatency("ttft", windowBuckets(now, before, "ttft"), targets.ttft);
  const itl = showLatency("itl", windowBuckets(now, before, "itl"), targets.itl);
  push(series.ttft[0], ttft);
  push(series.itl[0], itl);
  draw("chart-load", series.load, null);
  draw("chart-ttft", series.ttft, targets.ttft);
  draw("chart-itl", series.itl, targets.itl);
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
