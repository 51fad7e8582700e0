// The fleet page: totals, overview map, filters, and one lazily drawn grid per
// rack, kept live by live.js. Each rack card's footer counts its free slice,
// failed, draining and spare nodes (cardStats, from every rack event); the cards
// can be sorted by those (sortRacks) and filtered to "problems only".

import { attachClicks, attachTooltip, cells, describeCell, rackStats, rackSvg, restoreCursor, utilisation } from "./grid.js";
import { api, startLive } from "./live.js";
import { drawChart } from "./chart.js";

const live = startLive();
const visible = new Set();   // rack ids whose grid is on screen
const dirty = new Set();     // rack ids changed while off screen

function paint(rackId) {
  const rack = live.racks.get(rackId);
  const el = document.querySelector(`article.rack[data-rack-id="${rackId}"]`);
  if (!rack || !el) return;
  const grid = el.querySelector(".grid");
  grid.innerHTML = rackSvg(rack, { cell: 9, match: currentMatch(rack) });
  restoreCursor(grid);
  el.dataset.painted = rack.version;
  const used = rack.nodes.reduce((n, node) => n + node[4].filter((g) => g[1] !== null).length, 0);
  const total = rack.nodes.reduce((n, node) => n + node[4].length, 0);
  el.querySelector("[data-testid=rack-used]").textContent = `${used}/${total}`;
  dirty.delete(rackId);
}

function overview(rack) {
  const sq = document.querySelector(`.overview [data-ov="${rack.rack}"]`);
  if (!sq) return;
  const u = utilisation(rack);
  const failed = rack.nodes.some((n) => n[3] === "failed" || n[3] === "in_repair");
  sq.style.background = `hsl(210 70% ${18 + u * 50}%)`;
  sq.classList.toggle("has-failed", failed);
  sq.title = `${rack.name}: ${(u * 100).toFixed(0)}% used${failed ? ", has failed nodes" : ""}`;
}

const observer = new IntersectionObserver((entries) => {
  for (const e of entries) {
    const id = Number(e.target.dataset.rackId);
    if (e.isIntersecting) { visible.add(id); if (dirty.has(id) || !e.target.dataset.painted) paint(id); }
    else visible.delete(id);
  }
}, { rootMargin: "300px" });

/** A rack card's footer counts, from its rack event (grid.js rackStats). */
function cardStats(rack) {
  const el = document.querySelector(`article.rack[data-rack-id="${rack.rack}"]`);
  if (!el) return;
  const s = rackStats(rack);
  const set = (k, v) => { const b = el.querySelector(`[data-stat="${k}"]`); if (b) b.textContent = v; };
  set("slice", s.freeSlice); set("failed", s.failed); set("draining", s.draining); set("spares", s.spares);
  el.querySelector("[data-stat-box=failed]").classList.toggle("bad", s.failed > 0);
  el.querySelector("[data-stat-box=draining]").classList.toggle("warn", s.draining > 0);
  el.dataset.problems = s.problems ? "1" : "0";
}

live.on("rack", (rack) => {
  overview(rack);
  cardStats(rack);
  if (visible.has(rack.rack)) paint(rack.rack); else dirty.add(rack.rack);
  // The order and "problems only" depend on the cells: follow them, a burst at a time.
  if (form.sort.value || form.problems.checked) scheduleFilters();
  scheduleTotals();
});
live.on("job", scheduleTotals);

// Totals: re-read the summary and fragmentation at most every 4 s while cells
// change (fragmentation costs the server ~0.6 s for 1,000 racks), and
// every 30 s anyway (fragmentation depends on the queue, not only on cells).
let totalsTimer = null;
function scheduleTotals() {
  if (totalsTimer) return;
  totalsTimer = setTimeout(async () => { totalsTimer = null; await refreshTotals(); }, 4000);
}
async function refreshTotals() {
  try {
    const [s, f] = await Promise.all([api("/api/fleet/summary/"), api("/api/fleet/fragmentation/")]);
    const set = (k, v) => { const el = document.querySelector(`[data-total="${k}"]`); if (el) el.textContent = v; };
    set("gpus_used", s.gpus_used); set("gpus_total", s.gpus_total); set("gpus_free", s.gpus_free);
    set("gpus_failed", s.gpus_failed); set("pending", s.jobs_by_state.pending); set("running", s.jobs_by_state.running);
    set("fragmentation", `${(f.fraction * 100).toFixed(0)}%`); set("largest", `${f.largest_job_gpus} GPUs (${Math.floor(f.largest_job_gpus / 4)} nodes)`);
  } catch (e) { /* shown again on the next tick */ }
}
setInterval(refreshTotals, 30000);

// Filters: site, row, node state, tenant, search by job or host, problems only;
// and the racks' order.
const form = document.querySelector("[data-testid=filters]");
const racksEl = document.querySelector(".rack-grid");
const rackOrder = new Map([...racksEl.querySelectorAll("article.rack")].map((el, i) => [el.dataset.rackId, i]));

/** Rack cards in the order the Sort field asks (most free slice, most failed or
 * draining nodes, fewest spares first), ties and racks not yet known in rack
 * order. */
function sortRacks(cards) {
  const key = form.sort.value;
  const base = (el) => rackOrder.get(el.dataset.rackId);
  if (!key) return [...cards].sort((a, b) => base(a) - base(b));
  const value = (el) => {
    const rack = live.racks.get(Number(el.dataset.rackId));
    if (!rack) return Infinity;
    const s = rackStats(rack);
    return { slice: -s.freeSlice, failed: -s.failed, draining: -s.draining, spares: s.spares }[key];
  };
  const keyed = cards.map((el) => [value(el), base(el), el]);
  keyed.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  return keyed.map((k) => k[2]);
}

/** Put the cards in ``sorted`` order, moving only if it changed. */
function placeRacks(sorted) {
  const now = [...racksEl.querySelectorAll("article.rack")];
  if (sorted.every((el, i) => el === now[i])) return;
  racksEl.append(...sorted);
}

let filtersTimer = null;
function scheduleFilters() {
  if (filtersTimer) return;
  // Cells changed, not the search: the rack events have repainted what changed.
  filtersTimer = setTimeout(() => { filtersTimer = null; applyFilters(false); }, 1000);
}

function currentMatch(rack) {
  const q = (form.q.value || "").trim().toLowerCase();
  if (!q) return null;
  const m = new Set();
  for (const n of rack.nodes) if (n[2].toLowerCase().includes(q)) m.add(n[0]);
  for (const [id, j] of Object.entries(rack.jobs)) if (`#${id}` === q || id === q.replace("#", "") || (j.name || "").toLowerCase().includes(q)) m.add(`j${id}`);
  return m;
}
function applyFilters(repaint = true) {
  const site = form.site.value, row = form.row.value, state = form.state.value, tenant = form.tenant.value;
  const q = form.q.value.trim();
  let shown = 0;
  for (const el of document.querySelectorAll("article.rack")) {
    const rack = live.racks.get(Number(el.dataset.rackId));
    let ok = (!site || el.dataset.site === site) && (!row || el.dataset.row === row);
    if (ok && rack && state) ok = state === "free" ? rack.nodes.some((n) => n[3] === "healthy" && n[4].every((g) => g[1] === null)) : rack.nodes.some((n) => n[3] === state);
    if (ok && rack && tenant) ok = Object.values(rack.jobs).some((j) => j.tenant === tenant);
    if (ok && rack && q) ok = currentMatch(rack).size > 0;
    if (ok && rack && form.problems.checked) ok = rackStats(rack).problems;
    el.hidden = !ok;
    const sq = document.querySelector(`.overview [data-ov="${el.dataset.rackId}"]`);
    if (sq) sq.classList.toggle("filtered", !ok);
    if (ok) shown++;
    if (repaint && ok && rack && visible.has(rack.rack)) paint(rack.rack);
  }
  document.querySelector("[data-testid=shown]").textContent = shown;
  placeRacks(sortRacks([...racksEl.querySelectorAll("article.rack")]));
}
form.addEventListener("input", () => applyFilters());
form.addEventListener("submit", (e) => { e.preventDefault(); applyFilters(); });

// Overview map: a square per rack; click scrolls to it.
document.querySelector(".overview").addEventListener("click", (e) => {
  const id = e.target.dataset && e.target.dataset.ov;
  if (!id) return;
  const el = document.querySelector(`article.rack[data-rack-id="${id}"]`);
  el.scrollIntoView({ behavior: "instant", block: "center" });
  el.querySelector(".grid").focus();
});

attachTooltip(racksEl, (node, gpu) => {
  const rack = live.racks.get(live.nodeRack.get(node));
  const c = rack && cells(rack).find((x) => x.node === node && x.gpu === gpu);
  return c ? `${rack.name} · ${describeCell(rack, c)}` : "";
});
attachClicks(racksEl, (node) => live.nodeRack.get(node));

const chartEl = document.querySelector("[data-testid=chart]");
const hoursEl = document.querySelector("[name=hours]");
const chart = () => drawChart(chartEl, Number(hoursEl.value)).catch(() => {});
hoursEl.addEventListener("change", chart);

live.start().then(() => {
  for (const el of document.querySelectorAll("article.rack")) observer.observe(el);
  applyFilters();
  refreshTotals();
  chart();
  document.body.dataset.ready = "1";
});
