// The fleet page: totals, overview map, filters, and the racks grouped by site
// and row, one lazily drawn grid per rack, kept live by live.js.
//
// 1. Groups. A header per site and row counts its racks, GPUs, free nodes,
//    failed and draining nodes, from the live racks (rackStats), and its
//    largest free slice from the fragmentation report (see 6). A fleet of
//    more than data-open-limit racks starts collapsed: a collapsed group's
//    cards wait in a <template> (parsed, not in the document) and are moved
//    in when it opens. The card elements are the same
//    objects either way, so their counts are kept current all along.
// 2. Filters, sort and density live in the query string (replaceState), and a
//    loaded URL restores them (/?state=failed, /?q=r12, /?density=tiny). A
//    filter that leaves at most data-open-limit racks opens their groups; a
//    click on a header overrides that until the filters change.
// 3. The overview map is one tab stop (roving tabindex); arrows move inside it,
//    Enter opens the rack's group and focuses its grid.
// 4. Kiosk (?kiosk=1): no chrome, every group open, and the largest cell size
//    at which all shown racks fit the viewport (fitKiosk). The grid
//    placeholders take their size from --step, so measuring needs no repaint.
// 5. Rack events repaint the grids on screen at the next frame; the others
//    when they scroll into view (IntersectionObserver).
// 6. Totals and slices come from /api/fleet/fragmentation/ (the same report as
//    the chart's samples and /metrics): the header's fragmentation and largest
//    free slice, and each card's "slice" (the engine's offer to a
//    non-preemptible gang, spares kept, which a rack event cannot tell: it
//    depends on which jobs borrowed the spares). So the header's largest free
//    slice is always the best card's. Read once before the page is ready, then
//    at most every 4 s while cells change and every 30 s anyway.

import { attachClicks, attachTooltip, drawGrid, gridSize, rackStats, utilisation } from "./grid.js";
import { api, startLive } from "./live.js";
import { drawChart } from "./chart.js";

const params = new URLSearchParams(location.search);
const kiosk = params.get("kiosk") === "1";
if (kiosk) document.body.classList.add("kiosk");

const live = startLive();
const form = document.querySelector("[data-testid=filters]");
const groupsEl = document.querySelector("[data-testid=groups]");
const overviewEl = document.querySelector(".overview");
const openLimit = Number(groupsEl.dataset.openLimit);

// Cell sizes (px) of the density control; the card padding follows in rackwise.css.
const DENSITY = { comfortable: 12, compact: 6, tiny: 4 };
// Below this cell size a card shows its name and grid only (the group header counts).
const SMALL_CELL = 6;
// Kiosk grids at least this big label their big jobs (a 4K wall of 8 racks: about 40 px).
const KIOSK_LABEL_CELL = 16;
const URL_FIELDS = { site: "", row: "", state: "", tenant: "", q: "", problems: "", sort: "", density: "comfortable" };

const cards = new Map();     // rack id -> article.rack, in the document or in its group's template
const groupOf = new Map();   // rack id -> group
const figures = new Map();   // rack id -> rackStats plus GPU and free-node counts, from its last event, and freeSlice
const slices = new Map();    // rack id -> its free slice (nodes), from the last fragmentation report
const visible = new Set();   // rack ids whose grid is on screen
const dirty = new Set();     // rack ids changed while off screen
const overviewButtons = new Map([...overviewEl.querySelectorAll("[data-ov]")].map((b) => [Number(b.dataset.ov), b]));

const groups = [...groupsEl.querySelectorAll(".rack-group")].map((el, index) => {
  const body = el.querySelector("[data-group-racks]");
  const template = body.querySelector("template");
  const g = { el, body, template, index, toggle: el.querySelector(".group-toggle"), ids: [], open: !body.hidden, explicit: null, shown: 0 };
  for (const card of (template ? template.content : body).querySelectorAll("article.rack")) {
    const id = Number(card.dataset.rackId);
    cards.set(id, card);
    groupOf.set(id, g);
    g.ids.push(id);
  }
  return g;
});
const rackOrder = new Map([...cards.keys()].map((id, i) => [id, i]));
const large = cards.size > openLimit;

let cell = DENSITY.comfortable;   // the grids' cell size (px) as painted

function paint(rackId) {
  const rack = live.racks.get(rackId);
  const el = cards.get(rackId);
  if (!rack || !el) return;
  // On a wall (kiosk) with room for it, big jobs carry their id and name.
  drawGrid(el.querySelector(".grid"), rack, { cell, match: currentMatch(rack), jobLabels: kiosk && cell >= KIOSK_LABEL_CELL });
  el.dataset.painted = rack.version;
  el.dataset.paintedCell = cell;
  dirty.delete(rackId);
}

/** The placeholders' size (CSS) for a cell size, of every card or of one; no repaint. */
function sizePlaceholders(size, el = groupsEl) {
  el.style.setProperty("--cell", size);
  el.style.setProperty("--step", `${gridSize(1, 1, size).height}px`);  // a cell and its gap, as drawGrid draws them
  el.classList.toggle("small-cells", size < SMALL_CELL);
  if (el === groupsEl) groupsEl.dataset.cell = size;
}

// Rack events repaint at the next frame, once per rack however many came: the
// snapshot's 1,000 events then add no grids while live.js is still applying them.
const toPaint = new Set();
let paintFrame = null;
function paintSoon(rackId) {
  toPaint.add(rackId);
  if (!paintFrame) paintFrame = requestAnimationFrame(flushPaints);
}
function flushPaints() {
  cancelAnimationFrame(paintFrame);
  paintFrame = null;
  for (const id of toPaint) if (visible.has(id)) paint(id); else dirty.add(id);
  toPaint.clear();
}

/** Set the cell size of every grid: the placeholders at once, the grids on
 * screen repainted, the others when they come into view. */
function setCell(size) {
  sizePlaceholders(size);
  if (size === cell) return;
  cell = size;
  for (const id of cards.keys()) dirty.add(id);
  for (const id of visible) paint(id);
}

function overview(rack) {
  const sq = overviewButtons.get(rack.rack);
  if (!sq) return;
  const u = utilisation(rack);
  const failed = rack.nodes.some((n) => n[3] === "failed" || n[3] === "in_repair");
  sq.style.background = `hsl(210 70% ${18 + u * 50}%)`;
  sq.classList.toggle("has-failed", failed);
  sq.classList.toggle("fabric-degraded", Boolean(rack.fabric_degraded));
  sq.title = `${rack.name}: ${(u * 100).toFixed(0)}% used${failed ? ", has failed nodes" : ""}${rack.fabric_degraded ? ", fabric degraded" : ""}`;
}

const observer = new IntersectionObserver((entries) => {
  for (const e of entries) {
    const id = Number(e.target.dataset.rackId);
    if (e.isIntersecting) { visible.add(id); if (dirty.has(id) || !e.target.dataset.painted) paint(id); }
    else visible.delete(id);
  }
}, { rootMargin: "300px" });

const isFree = (n) => n[3] === "healthy" && n[4].every((g) => g[1] === null);

/** What a card and its group header count, from a rack event. A degraded
 * fabric, or GPUs a health rule gave a verdict, are problems too. */
function rackFigures(rack) {
  let used = 0, total = 0;
  for (const n of rack.nodes) for (const g of n[4]) { total++; if (g[1] !== null) used++; }
  const stats = rackStats(rack);
  const verdicts = Object.values(rack.verdicts || {}).reduce((a, n) => a + n, 0);
  const problems = stats.problems || Boolean(rack.fabric_degraded) || verdicts > 0;
  return { ...stats, problems, verdicts, used, total, freeNodes: rack.nodes.filter(isFree).length, freeSlice: slices.get(rack.rack) ?? null };
}

// The worst verdict first: the badge takes its colour.
const VERDICTS = ["fail", "drain", "suspect"];

/** A card's health badges: its fabric degraded (which nodes, why), and how
 * many of its GPUs a health rule gave a verdict (the GPU degraded, its node
 * draining). Hidden when there is nothing to say. */
function cardBadges(rack) {
  const el = cards.get(rack.rack);
  if (!el) return;
  const fabric = el.querySelector("[data-testid=rack-fabric-badge]");
  const nodes = rack.fabric_nodes || [];
  fabric.hidden = !rack.fabric_degraded;
  fabric.textContent = nodes.length ? `fabric degraded: ${nodes.length} node${nodes.length === 1 ? "" : "s"}` : "fabric degraded";
  fabric.title = rack.fabric_degraded ? `${rack.fabric_degraded}${nodes.length ? `\nreporting now: ${nodes.join(", ")}` : ""}` : "";
  const verdicts = rack.verdicts || {};
  const count = Object.values(verdicts).reduce((a, n) => a + n, 0);
  const badge = el.querySelector("[data-testid=rack-verdict-badge]");
  badge.hidden = count === 0;
  badge.textContent = `${count} GPU${count === 1 ? "" : "s"} flagged`;
  badge.title = `Health rules' verdicts in force: ${VERDICTS.filter((v) => verdicts[v]).map((v) => `${verdicts[v]} ${v}`).join(", ")}`
    + " (suspect: GPU degraded; drain: its node drains; fail: GPU failed)";
  badge.dataset.worst = VERDICTS.find((v) => verdicts[v]) || "";
  el.classList.toggle("fabric-degraded", Boolean(rack.fabric_degraded));
}

/** A rack card's footer counts (works on a card still in its template). */
function cardStats(rackId) {
  const el = cards.get(rackId);
  const s = figures.get(rackId);
  if (!el || !s) return;
  const set = (k, v) => { const b = el.querySelector(`[data-stat="${k}"]`); if (b) b.textContent = v; };
  set("slice", s.freeSlice ?? "…"); set("failed", s.failed); set("draining", s.draining); set("spares", s.spares);
  el.querySelector("[data-testid=rack-used]").textContent = `${s.used}/${s.total}`;
  el.querySelector("[data-stat-box=failed]").classList.toggle("bad", s.failed > 0);
  el.querySelector("[data-stat-box=draining]").classList.toggle("warn", s.draining > 0);
  el.dataset.problems = s.problems ? "1" : "0";
}

/** A group's header figures, summed over its racks (largest free slice: the
 * largest of one rack, what a big gang could get in one NVLink domain; null
 * until the first fragmentation report). */
function groupFigures(g) {
  const a = { used: 0, total: 0, freeNodes: 0, freeSlice: null, failed: 0, draining: 0, spares: Infinity, known: 0 };
  for (const id of g.ids) {
    const s = figures.get(id);
    if (!s) continue;
    a.known++;
    a.used += s.used; a.total += s.total; a.freeNodes += s.freeNodes; a.failed += s.failed; a.draining += s.draining;
    if (s.freeSlice !== null) a.freeSlice = Math.max(a.freeSlice ?? 0, s.freeSlice);
    a.spares = Math.min(a.spares, s.spares);
  }
  return a;
}

const staleGroups = new Set();
let groupsFrame = null;
function scheduleGroups(g) {
  staleGroups.add(g);
  if (!groupsFrame) groupsFrame = requestAnimationFrame(renderGroups);
}
function renderGroups() {
  groupsFrame = null;
  for (const g of staleGroups) {
    const a = groupFigures(g);
    if (!a.known) continue;
    const set = (k, v) => { g.el.querySelector(`[data-agg="${k}"]`).textContent = v; };
    set("used", a.used); set("total", a.total); set("free", a.freeNodes); set("slice", a.freeSlice ?? "…");
    set("failed", a.failed); set("draining", a.draining);
    g.el.querySelector("[data-agg-box=failed]").classList.toggle("bad", a.failed > 0);
    g.el.querySelector("[data-agg-box=draining]").classList.toggle("warn", a.draining > 0);
  }
  staleGroups.clear();
}

live.on("rack", (rack) => {
  const id = rack.rack;
  figures.set(id, rackFigures(rack));
  overview(rack);
  cardStats(id);
  cardBadges(rack);
  // live.js marks the cards in the document; a card in a template gets it here.
  const el = cards.get(id);
  if (el) el.dataset.version = rack.version;
  if (visible.has(id)) paintSoon(id); else dirty.add(id);
  if (groupOf.has(id)) scheduleGroups(groupOf.get(id));
  // The order and the filters other than site and row depend on the cells:
  // follow them, a burst at a time.
  if (form.sort.value || form.problems.checked || form.state.value || form.tenant.value || form.q.value) scheduleFilters();
  scheduleTotals();
});
live.on("job", scheduleTotals);
// A rack the server no longer has (a topology import removed it while we were
// away): its card, overview square and figures go.
live.on("removed", (id) => {
  figures.delete(id); slices.delete(id); dirty.delete(id); visible.delete(id);
  const el = cards.get(id);
  if (el) { observer.unobserve(el); el.remove(); }
  cards.delete(id);
  const sq = overviewButtons.get(id);
  if (sq) { sq.remove(); overviewButtons.delete(id); }
  if (groupOf.has(id)) { scheduleGroups(groupOf.get(id)); groupOf.delete(id); }
  scheduleTotals();
});

// Totals (6): re-read the summary and fragmentation at most every 4 s while
// cells change (fragmentation costs the server ~0.6 s for 1,000 racks, once per
// change: a shared read model), and every 30 s anyway (it depends on the jobs
// submitted, not only on cells).
let totalsTimer = null;
function scheduleTotals() {
  if (totalsTimer) return;
  totalsTimer = setTimeout(async () => { totalsTimer = null; await refreshTotals(); }, 4000);
}
async function refreshTotals() {
  try {
    const [s, f] = await Promise.all([api("/api/fleet/summary/"), api("/api/fleet/fragmentation/")]);
    let changed = false;
    const set = (k, v) => {
      const el = document.querySelector(`[data-total="${k}"]`);
      if (el && el.textContent !== String(v)) { el.textContent = v; changed = true; }
    };
    set("gpus_used", s.gpus_used); set("gpus_total", s.gpus_total); set("gpus_free", s.gpus_free);
    set("gpus_failed", s.gpus_failed); set("pending", s.jobs_by_state.pending); set("running", s.jobs_by_state.running);
    set("fragmentation", `${(f.fraction * 100).toFixed(0)}%`); set("typical", `${f.typical_job_gpus}-GPU`);
    set("largest", `${f.largest_slice_nodes} nodes (${f.largest_job_gpus} GPUs)`);
    applySlices(f.racks);
    // The totals sit above the racks: longer figures can take another line.
    if (kiosk && changed) scheduleFit();
  } catch (e) { /* shown again on the next tick */ }
}
/** Each card's slice from the report (a rack it leaves out has no nodes: 0). */
function applySlices(racks) {
  const fresh = new Map(racks.map((r) => [r.rack_id, r.slice_nodes]));
  for (const id of cards.keys()) {
    const n = fresh.get(id) ?? 0;
    if (slices.get(id) === n) continue;
    slices.set(id, n);
    const s = figures.get(id);
    if (s) { s.freeSlice = n; cardStats(id); }
    if (groupOf.has(id)) scheduleGroups(groupOf.get(id));
    if (form.sort.value === "slice") scheduleFilters();
  }
}
setInterval(refreshTotals, 30000);

// Groups: open moves a collapsed group's cards into the document (once).
function setOpen(g, open) {
  if (open && g.template) {
    g.body.append(g.template.content);
    g.template.remove();
    g.template = null;
    for (const id of g.ids) observer.observe(cards.get(id));
  }
  g.open = open;
  g.body.hidden = !open;
  g.toggle.setAttribute("aria-expanded", String(open));
}
for (const g of groups) {
  if (!g.template) for (const id of g.ids) observer.observe(cards.get(id));
  g.toggle.addEventListener("click", () => { g.explicit = !g.open; setOpen(g, g.explicit); });
}

// Filters: site, row, node state, tenant, search by rack, job or host,
// problems only; the racks' order; the density. All kept in the URL.

/** Rack cards (of one group) in the order the Sort field asks (most free
 * slice, most failed or draining nodes, fewest spares first), ties and racks
 * not yet known in rack order. Groups follow the same figure of their header. */
const SORT_VALUE = {
  slice: (s) => -s.freeSlice, failed: (s) => -s.failed, draining: (s) => -s.draining, spares: (s) => s.spares,
};
function sortedIds(ids, key) {
  if (!key) return ids;
  const value = (id) => (figures.has(id) ? SORT_VALUE[key](figures.get(id)) : Infinity);
  return ids.map((id) => [value(id), rackOrder.get(id), id]).sort((a, b) => a[0] - b[0] || a[1] - b[1]).map((k) => k[2]);
}

/** Put children in ``sorted`` order, moving them only if it changed. */
function place(parent, sorted) {
  const now = [...parent.children].filter((el) => el.tagName !== "TEMPLATE");
  if (sorted.length === now.length && sorted.every((el, i) => el === now[i])) return;
  parent.append(...sorted);
}

function placeRacks() {
  const key = form.sort.value;
  for (const g of groups) place(g.template ? g.template.content : g.body, sortedIds(g.ids, key).map((id) => cards.get(id)));
  const groupValue = (g) => { const a = groupFigures(g); return key && a.known ? SORT_VALUE[key](a) : Infinity; };
  const order = groups.map((g) => [groupValue(g), g.index, g]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  place(groupsEl, order.map((k) => k[2].el));
}

let filtersTimer = null;
function scheduleFilters() {
  if (filtersTimer) return;
  // Cells changed, not the search: the rack events have repainted what changed.
  filtersTimer = setTimeout(() => { filtersTimer = null; applyFilters(false); }, 1000);
}

const query = () => (form.q.value || "").trim().toLowerCase();

function currentMatch(rack) {
  const q = query();
  if (!q) return null;
  const m = new Set();
  for (const n of rack.nodes) if (n[2].toLowerCase().includes(q)) m.add(n[0]);
  for (const [id, j] of Object.entries(rack.jobs)) if (`#${id}` === q || id === q.replace("#", "") || (j.name || "").toLowerCase().includes(q)) m.add(`j${id}`);
  return m;
}

function rackShown(id) {
  const el = cards.get(id);
  const rack = live.racks.get(id);
  const site = form.site.value, row = form.row.value, state = form.state.value, tenant = form.tenant.value, q = query();
  if ((site && el.dataset.site !== site) || (row && el.dataset.row !== row)) return false;
  if (q && !el.dataset.name.toLowerCase().includes(q) && !(rack && currentMatch(rack).size > 0)) return false;
  if (!rack) return true;
  if (state && !(state === "free" ? rack.nodes.some(isFree) : rack.nodes.some((n) => n[3] === state))) return false;
  if (tenant && !Object.values(rack.jobs).some((j) => j.tenant === tenant)) return false;
  if (form.problems.checked && !figures.get(id).problems) return false;
  return true;
}

function applyFilters(repaint = true) {
  for (const g of groups) g.shown = 0;
  let shown = 0;
  const q = query();
  for (const [id, el] of cards) {
    const ok = rackShown(id);
    el.hidden = !ok;
    el.classList.toggle("name-match", Boolean(q) && ok && el.dataset.name.toLowerCase().includes(q));
    const sq = overviewButtons.get(id);
    if (sq) sq.classList.toggle("filtered", !ok);
    if (ok) { shown++; groupOf.get(id).shown++; }
    if (repaint && ok && visible.has(id)) paint(id);
  }
  document.querySelector("[data-testid=shown]").textContent = shown;
  // Open what a narrowing filter leaves, when it is few racks; a small fleet,
  // and the kiosk, show everything.
  const narrowed = ["site", "row", "state", "tenant", "q"].some((k) => form[k].value) || form.problems.checked;
  const auto = kiosk || !large || (narrowed && shown <= openLimit);
  for (const g of groups) {
    g.el.hidden = g.shown === 0;
    g.el.querySelector("[data-agg=shown]").textContent = g.shown < g.ids.length ? `, ${g.shown} shown` : "";
    const open = g.shown > 0 && (g.explicit ?? auto);
    if (open !== g.open) setOpen(g, open);
  }
  placeRacks();
  if (kiosk && shown !== fittedFor) scheduleFit();
}

/** The form's values into the query string (defaults left out, other
 * parameters such as kiosk kept). */
function writeURL() {
  const p = new URLSearchParams(location.search);
  for (const [name, fallback] of Object.entries(URL_FIELDS)) {
    const field = form[name];
    const value = field.type === "checkbox" ? (field.checked ? "1" : "") : field.value;
    if (value && value !== fallback) p.set(name, value); else p.delete(name);
  }
  const search = p.toString();
  history.replaceState(history.state, "", `${location.pathname}${search ? `?${search}` : ""}${location.hash}`);
}

/** The query string into the form (a value the form has no option for is ignored). */
function readURL() {
  for (const name of Object.keys(URL_FIELDS)) {
    if (!params.has(name)) continue;
    const field = form[name], value = params.get(name);
    if (field.type === "checkbox") field.checked = value === "1" || value === "true";
    else if (field.tagName === "SELECT") { if ([...field.options].some((o) => o.value === value)) field.value = value; }
    else field.value = value;
  }
}

function applyDensity() {
  const d = DENSITY[form.density.value] ? form.density.value : "comfortable";
  groupsEl.dataset.density = d;
  if (!kiosk) setCell(DENSITY[d]);
}

form.addEventListener("input", (e) => {
  // A new filter decides again which groups are open.
  if (e.target.name !== "density") for (const g of groups) g.explicit = null;
  if (e.target.name === "density") applyDensity(); else applyFilters();
  writeURL();
});
form.addEventListener("submit", (e) => { e.preventDefault(); applyFilters(); });

// Overview map: a square per rack, one tab stop; arrows move (up and down by
// its column count), Home/End, and Enter or a click goes to the rack.
function rove(button) {
  for (const b of overviewEl.querySelectorAll("[data-ov][tabindex='0']")) b.tabIndex = -1;
  button.tabIndex = 0;
}
function overviewColumns(buttons) {
  const top = buttons[0].offsetTop;
  let n = 0;
  while (n < buttons.length && buttons[n].offsetTop === top) n++;
  return Math.max(1, n);
}
overviewEl.addEventListener("keydown", (e) => {
  const b = e.target.closest && e.target.closest("[data-ov]");
  if (!b) return;
  const buttons = [...overviewButtons.values()];
  const i = buttons.indexOf(b);
  const cols = overviewColumns(buttons);
  const to = { ArrowRight: i + 1, ArrowLeft: i - 1, ArrowDown: i + cols, ArrowUp: i - cols, Home: 0, End: buttons.length - 1 }[e.key];
  if (to === undefined) return;
  e.preventDefault();
  if (to < 0 || to >= buttons.length) return;
  rove(buttons[to]);
  buttons[to].focus();
});
overviewEl.addEventListener("click", (e) => {
  const b = e.target.closest && e.target.closest("[data-ov]");
  if (!b) return;
  rove(b);
  goToRack(Number(b.dataset.ov));
});

/** Open the rack's group and focus its grid (its group header if a filter hides it). */
function goToRack(id) {
  const g = groupOf.get(id), el = cards.get(id);
  if (!g) return;
  if (g.el.hidden) return;   // a filter hides every rack of its group
  g.explicit = true;
  setOpen(g, true);
  const target = el.hidden ? g.toggle : el.querySelector(".grid");
  if (!el.hidden) paint(id);
  target.scrollIntoView({ behavior: "instant", block: "center" });
  target.focus();
}

// Kiosk: the largest cell at which every shown rack fits the viewport. The
// bisection sizes a copy of one card, out of the flow, and computes the rows
// the flex layout will make, so that neither the other cards nor the drawn
// grids are restyled at each step (a layout of 1,000 cards costs ~0.1 s);
// then the page itself is checked, and the size lowered while it would scroll.
function fits() {
  const root = document.scrollingElement;
  return root.scrollHeight <= window.innerHeight && root.scrollWidth <= window.innerWidth;
}
let fittedFor = -1;   // how many racks the last fit was for
function fitKiosk() {
  const shown = [...cards.values()].filter((el) => el.isConnected && !el.hidden);
  fittedFor = shown.length;
  if (!shown.length) return;
  const gap = parseFloat(getComputedStyle(groupsEl).rowGap) || 0;
  const width = groupsEl.clientWidth;
  const height = window.innerHeight - (groupsEl.getBoundingClientRect().top + window.scrollY)
    - parseFloat(getComputedStyle(document.querySelector("main")).paddingBottom);
  const box = Object.assign(document.createElement("div"), { className: "fleet-groups kiosk-probe" });
  const probe = shown[0].cloneNode(true);
  box.append(probe);
  groupsEl.after(box);
  const roomFor = (size) => {
    sizePlaceholders(size, probe);
    const w = probe.offsetWidth + gap, h = probe.offsetHeight + gap;
    const cols = Math.floor((width + gap) / w);
    return cols >= 1 && Math.ceil(shown.length / cols) * h - gap <= height;
  };
  let lo = 3, hi = 200;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (roomFor(mid)) lo = mid; else hi = mid - 1;
  }
  box.remove();
  sizePlaceholders(lo);
  while (lo > 3 && !fits()) sizePlaceholders(--lo);
  setCell(lo);
}
let fitTimer = null;
// groups[data-fitting] while a fit is due, for tests and screenshots.
function scheduleFit() {
  clearTimeout(fitTimer);
  groupsEl.dataset.fitting = "1";
  fitTimer = setTimeout(fitNow, 150);
}
function fitNow() {
  clearTimeout(fitTimer);
  fitKiosk();
  delete groupsEl.dataset.fitting;
}
if (kiosk) {
  // Refit when the room changes: the window, or the totals above the racks
  // (filled in after the first fit) or the cards themselves growing.
  window.addEventListener("resize", scheduleFit);
  const resized = new ResizeObserver(scheduleFit);
  for (const el of document.querySelector("main").children) resized.observe(el);
}

attachTooltip(groupsEl);
attachClicks(groupsEl);

const chartEl = document.querySelector("[data-testid=chart]");
const hoursEl = document.querySelector("[name=hours]");
const chart = () => drawChart(chartEl, Number(hoursEl.value)).catch(() => {});
hoursEl.addEventListener("change", chart);

readURL();
applyDensity();
applyFilters();   // site, row and rack names need no live data
if (kiosk) fitNow();   // before the snapshot, so the grids are drawn once, at their size
live.start().then(async () => {
  applyFilters();
  renderGroups();
  if (kiosk) fitNow();
  flushPaints();
  if (!kiosk) chart();
  // The header and the cards' slices before "ready": tests and screenshots see them.
  await refreshTotals();
  renderGroups();
  if (form.sort.value === "slice") applyFilters(false);
  document.body.dataset.ready = "1";
});
