// Drawing a rack's GPU grid as SVG: one row per node, one cell per GPU. Used by
// every page that shows racks (fleet, rack, job, actions), so there is one code
// path for the picture.
//
// 1. A rack is a constant number of elements whatever its GPU count: one <path>
//    per fill (free cells; each job, its cells and the gaps between them as one
//    block), one per state pattern (failed, in repair, draining), one per cell
//    edge (free cells' 3:1 edge, spares, in repair, held for a plan, a search
//    match, a plan's moved cells), one for the job outlines, and one <text>
//    holding every state letter (a character per marked cell, each placed by
//    the x/y lists). Big jobs' names and the slot numbers are the only other
//    text.
// 2. What each drawn grid shows is kept beside it (a WeakMap from its <svg>):
//    hover, keyboard and clicks map a position to its (node, gpu) through the
//    same layout, and the tooltip describes the rack as it was drawn (the
//    "after" grid of a plan describes the plan's result).
// 3. window.rackwiseGrid, for tests and the benchmark: the cells of a drawn
//    grid, with what its elements paint at each cell read back from the SVG
//    geometry, and where a cell is on screen.

const MARKS = {
  failed: { letter: "F", label: "failed", pattern: "p-failed" },
  in_repair: { letter: "R", label: "in repair", pattern: "p-repair" },
  draining: { letter: "D", label: "draining", pattern: "p-drain" },
  drained: { letter: "D", label: "drained", pattern: "p-drain" },
  suspect: { letter: "?", label: "suspect", pattern: "p-drain" },
  gpu_failed: { letter: "F", label: "GPU failed", pattern: "p-failed" },
  spare: { letter: "S", label: "spare", pattern: null },
};

const esc = (s) => String(s).replace(/[&<>"]/g, (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[ch]);

// Job colours: a categorical palette, one hue bucket per slot and none a state's
// (a copy of fleet/palette.py PALETTE, checked equal by tests/test_palette.py).
// The server picks each job's slot per rack so that touching jobs differ
// (rack.jobs[id].color); a job it did not colour (a simulated plan's) takes its
// stable slot, the one the server prefers for it too.
export const PALETTE = [[200, 50], [135, 40], [315, 56], [75, 42], [165, 38], [225, 60], [105, 48]];

/** A job's palette slot in ``rack`` (its stable slot without one). */
export function jobSlot(jobId, rack = null) {
  const j = rack && rack.jobs && rack.jobs[String(jobId)];
  if (j && Number.isInteger(j.color)) return j.color % PALETTE.length;
  const n = Math.abs(Math.trunc(Number(jobId))) || 0;
  return n % PALETTE.length;
}

/** A job's colour in ``rack`` (where it is drawn), else its stable colour. */
export function jobColor(jobId, rack = null) {
  const [hue, light] = PALETTE[jobSlot(jobId, rack)];
  return `hsl(${hue} 62% ${light}%)`;
}

/** Markup of a job's swatch, for a table cell: ``swatch(42, rack)``. A page that
 * renders the element itself (``<i class="sw job" data-job-swatch="42"
 * data-rack-id="3"></i>``) has it filled by paintSwatches. */
export function swatch(jobId, rack = null) {
  return `<i class="sw job" data-job-swatch="${esc(jobId)}" style="background:${jobColor(jobId, rack)}" aria-hidden="true"></i>`;
}

/** Colour every ``[data-job-swatch]`` under ``root`` from ``racks`` (a Map of rack
 * events, as live.racks): the job's colour in the element's ``data-rack-id`` rack,
 * else in the first rack that holds it, else its stable colour. Call it again on
 * every rack event to follow a job's colour as its rack changes. */
export function paintSwatches(root, racks = new Map()) {
  for (const el of root.querySelectorAll("[data-job-swatch]")) {
    const id = el.dataset.jobSwatch;
    let rack = el.dataset.rackId ? racks.get(Number(el.dataset.rackId)) : null;
    if (!rack || !(id in rack.jobs)) rack = [...racks.values()].find((r) => id in r.jobs) || null;
    el.style.background = jobColor(id, rack);
    el.dataset.slot = jobSlot(id, rack);
  }
}

/** Spare nodes: idle healthy nodes, the rack's last ``spare_nodes`` of them
 * (the same rule as the rack page and the legend). */
export function spareNodes(rack) {
  const idle = rack.nodes.filter((n) => n[3] === "healthy" && n[4].every((g) => g[1] === null)).map((n) => n[0]);
  const k = rack.spare_nodes || 0;
  return new Set(k ? idle.slice(-k) : []);
}

/** What one GPU cell shows: {node, slot, host, gpu, nodeState, health, job, mark,
 * held}. ``held``: the action its node is held for (a plan that empties or fills
 * it, from approval to end; the rack event's ``held``), else null. */
export function cells(rack) {
  const spares = spareNodes(rack);
  const held = rack.held || {};
  const out = [];
  for (const [nodeId, slot, host, nodeState, gpus] of rack.nodes) {
    const heldFor = held[String(nodeId)] ?? null;
    gpus.forEach(([health, job], gpu) => {
      let mark = null;
      if (MARKS[nodeState]) mark = nodeState;
      else if (health === "failed") mark = "gpu_failed";
      else if (spares.has(nodeId)) mark = "spare";
      out.push({ node: nodeId, slot, host, gpu, nodeState, health, job, mark, held: heldFor });
    });
  }
  return out;
}

export function describeCell(rack, c) {
  const job = c.job === null ? "free" : jobLabel(rack, c.job);
  const mark = c.mark ? `, ${MARKS[c.mark].label}` : "";
  const held = c.held != null ? `, held for action #${c.held}` : "";
  return `${c.host} GPU ${c.gpu}: ${job}; node ${c.nodeState}, GPU ${c.health}${mark}${held}`;
}

export function jobLabel(rack, jobId) {
  const j = rack.jobs[String(jobId)];
  if (!j || !j.name) return `job #${jobId}`;
  return `job #${jobId} ${j.name} (${j.tenant}, ${j.state})`;
}

/** Per-rack counts for a rack card. ``failed``: failed or in repair;
 * ``draining``: draining or drained; ``suspect``; ``spares`` (as marked S);
 * ``problems``: any failed, draining, suspect or in-repair node, or a failed
 * GPU. The card's free slice is not counted here: it is the engine's figure,
 * from the fragmentation report (fleet.js), which knows the borrowed spares. */
export function rackStats(rack) {
  const spares = spareNodes(rack);
  const out = { failed: 0, draining: 0, suspect: 0, spares: spares.size, gpuFailed: 0, problems: false };
  for (const [, , , state, gpus] of rack.nodes) {
    const gpuFailed = gpus.some((g) => g[0] === "failed");
    if (state === "failed" || state === "in_repair") out.failed++;
    if (state === "draining" || state === "drained") out.draining++;
    if (state === "suspect") out.suspect++;
    if (gpuFailed) out.gpuFailed++;
  }
  out.problems = out.failed + out.draining + out.suspect + out.gpuFailed > 0;
  return out;
}

// A job holding at least this many nodes of a rack is labelled on it (opts.jobLabels).
export const BIG_JOB_NODES = 4;

// Cell edges, bottom to top, and the cells each outlines.
const EDGES = [
  ["free", (c) => c.state === "free"],
  ["spare", (c) => c.mark === "spare"],
  ["repair", (c) => c.mark === "in_repair"],
  ["held", (c) => c.held != null],
  ["match", (c) => c.matched],
  ["moved", (c) => c.moved],
];

const drawn = new WeakMap();   // svg.grid-svg -> {rack, L, cells, rows}: what it shows

function layout(rack, opts) {
  const size = opts.cell || 9;
  const gap = size >= 16 ? 2 : 1;
  const step = size + gap;
  const left = opts.labels ? 22 : 0;
  const gpn = Math.max(1, ...rack.nodes.map((n) => n[4].length));
  const rows = rack.nodes.length;
  return { size, gap, step, left, gpn, rows, width: left + gpn * step, height: rows * step };
}

const num = (v) => String(Math.round(v * 100) / 100);
const rect = (x, y, w, h) => `M${num(x)} ${num(y)}h${num(w)}v${num(h)}h${num(-w)}z`;

/**
 * Draw one rack's grid into ``el`` (replacing the grid it holds), and keep what
 * it shows for hover, keyboard, clicks and tests. Returns the <svg>.
 * opts: cell (px), highlight (job id to emphasise; others dimmed), match (Set of
 * node ids or "j<job id>" to outline), moved (Set of "node:gpu" to outline as a
 * plan's moves), labels (slot numbers), jobLabels (big jobs' id and name).
 *
 * Every state mark carries its letter at every cell size, not only its colour
 * and pattern. A job is drawn as one block: the gaps between its own cells take
 * its colour, and a light outline runs where it meets another job or a free cell.
 */
export function drawGrid(el, rack, opts = {}) {
  const { markup, model } = build(rack, opts);
  el.querySelector(":scope > svg.grid-svg")?.remove();
  el.insertAdjacentHTML("beforeend", markup);
  const svg = el.lastElementChild;
  drawn.set(svg, model);
  const host = el.closest(".grid") || el;
  if (host.dataset.cursor) {
    const [node, gpu] = host.dataset.cursor.split(":").map(Number);
    const c = model.cells.find((x) => x.node === node && x.gpu === gpu);
    if (c) showCursor(svg, model, c);
  }
  return svg;
}

function build(rack, opts) {
  const L = layout(rack, opts);
  const { size, gap, step, left, gpn, rows } = L;
  const rowOf = new Map(rack.nodes.map((n, i) => [n[0], i]));
  const jobAt = (row, gpu) => { const n = rack.nodes[row]; const g = n && n[4][gpu]; return g ? g[1] : null; };
  const dimmed = (job) => opts.highlight != null && job !== opts.highlight;
  const all = cells(rack).map((c) => {
    const state = c.mark || (c.job === null ? "free" : "busy");
    const matched = Boolean(opts.match && (opts.match.has(c.node) || (c.job !== null && opts.match.has(`j${c.job}`))));
    const moved = Boolean(opts.moved && opts.moved.has(`${c.node}:${c.gpu}`));
    return { ...c, row: rowOf.get(c.node), state, dim: dimmed(c.job), matched, moved };
  });
  const grid = rack.nodes.map(() => []);
  for (const c of all) grid[c.row][c.gpu] = c;

  // Paths by key, in the order first met; each a list of subpaths.
  const paths = new Map();
  const add = (key, d) => { if (!paths.has(key)) paths.set(key, []); paths.get(key).push(d); };
  const xOf = (gpu) => left + gpu * step;
  // 1. Fills: free cells one by one; a job by runs, a row's run and the run of
  //    the gap under it that the job holds on both sides (its block).
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < gpn; g++) {
      const job = jobAt(r, g);
      if (job === null) { if (grid[r][g]) add("free", rect(xOf(g), r * step, size, size)); continue; }
      if (g > 0 && jobAt(r, g - 1) === job) continue;
      let end = g;
      while (end + 1 < gpn && jobAt(r, end + 1) === job) end++;
      add(`j${job}`, rect(xOf(g), r * step, (end - g) * step + size, size));
    }
    if (r === rows - 1) continue;
    for (let g = 0; g < gpn; g++) {
      const job = jobAt(r, g);
      if (job === null || jobAt(r + 1, g) !== job) continue;
      if (g > 0 && jobAt(r, g - 1) === job && jobAt(r + 1, g - 1) === job) continue;
      let end = g;
      while (end + 1 < gpn && jobAt(r, end + 1) === job && jobAt(r + 1, end + 1) === job) end++;
      add(`j${job}`, rect(xOf(g), r * step + size, (end - g) * step + size, gap));
    }
  }
  // 2. Patterns, 3. edges, 4. letters, per cell.
  const font = size >= 14 ? Math.round(size * 0.55) : Math.max(6, Math.round(size * 0.8));
  const letters = { text: "", x: [], y: [] };
  let used = 0, bad = 0;
  for (const c of all) {
    const x = xOf(c.gpu), y = c.row * step, cell = rect(x, y, size, size);
    if (c.job !== null) used++;
    if (c.mark && c.mark !== "spare") bad++;
    if (c.mark && MARKS[c.mark].pattern) add(`p:${MARKS[c.mark].pattern}`, cell);
    for (const [name, test] of EDGES) if (test(c)) add(`e:${name}${c.dim ? " dim" : ""}`, cell);
    if (c.mark) {
      letters.text += MARKS[c.mark].letter;
      letters.x.push(num(x + size / 2));
      letters.y.push(num(y + size / 2 + 0.36 * font));
    }
  }
  const out = [];
  for (const [key, d] of paths) {
    if (key === "free") out.push(`<path class="fill free${opts.highlight != null ? " dim" : ""}" d="${d.join("")}"/>`);
    else if (key.startsWith("j")) {
      const job = Number(key.slice(1));
      out.push(`<path class="fill job${dimmed(job) ? " dim" : ""}" data-job="${job}" fill="${jobColor(job, rack)}" d="${d.join("")}"/>`);
    }
  }
  for (const [key, d] of paths) {
    if (key.startsWith("p:")) out.push(`<path class="pattern" data-pattern="${key.slice(4)}" fill="url(#${key.slice(2)})" d="${d.join("")}"/>`);
  }
  for (const [name] of EDGES) {
    for (const key of [`e:${name}`, `e:${name} dim`]) {
      if (paths.has(key)) out.push(`<path class="edge edge-${key.slice(2)}" data-edge="${name}" d="${paths.get(key).join("")}"/>`);
    }
  }
  if (letters.text) {
    out.push(`<text class="mark" text-anchor="middle" font-size="${font}" x="${letters.x.join(" ")}" y="${letters.y.join(" ")}">${esc(letters.text)}</text>`);
  }
  out.push(jobOutlines(jobAt, { size, gap, left, gpn, rows, dimmed }));
  if (opts.jobLabels) out.push(jobNames(rack, jobAt, { size, step, left, gpn, rows }));
  if (opts.labels) {
    const spans = rack.nodes.map((n, row) => `<tspan x="0" y="${num(row * step + size * 0.75)}">${esc(n[1])}</tspan>`);
    out.push(`<text class="slot" font-size="${Math.round(size * 0.5)}">${spans.join("")}</text>`);
  }
  const summary = `rack ${esc(rack.name)}: ${used} of ${all.length} GPUs used, ${bad} marked failed, draining or in repair`;
  const markup = `<svg class="grid-svg" viewBox="0 0 ${L.width} ${L.height}" width="${L.width}" height="${L.height}" role="img" aria-label="${summary}">${out.join("")}</svg>`;
  return { markup, model: { rack, L, cells: all, grid } };
}

/** Each job's outline, half a gap outside its cells where the neighbour is
 * not the same job (none on the grid's own border): one path for the jobs
 * shown, one for the dimmed. */
function jobOutlines(jobAt, { size, gap, left, gpn, rows, dimmed }) {
  const step = size + gap;
  const h = gap / 2;
  const segs = { shown: [], dim: [] };
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < gpn; g++) {
      const job = jobAt(r, g);
      if (job === null) continue;
      const out = segs[dimmed(job) ? "dim" : "shown"];
      const x = left + g * step, y = r * step;
      const x0 = num(x - h), x1 = num(x + size + h), y0 = num(y - h), y1 = num(y + size + h);
      if (r > 0 && jobAt(r - 1, g) !== job) out.push(`M${x0} ${y0}H${x1}`);
      if (r < rows - 1 && jobAt(r + 1, g) !== job) out.push(`M${x0} ${y1}H${x1}`);
      if (g > 0 && jobAt(r, g - 1) !== job) out.push(`M${x0} ${y0}V${y1}`);
      if (g < gpn - 1 && jobAt(r, g + 1) !== job) out.push(`M${x1} ${y0}V${y1}`);
    }
  }
  const width = gap === 1 ? 1 : 1.5;
  return Object.entries(segs).filter(([, s]) => s.length).map(([k, s]) =>
    `<path class="job-outline${k === "dim" ? " dim" : ""}" d="${s.join("")}" stroke-width="${width}"/>`).join("");
}

/** Big jobs' id and name, on the longest run of consecutive rows each holds,
 * rows with a state letter left out where the job has others (the name must
 * not hide a letter). */
function jobNames(rack, jobAt, { size, step, left, gpn, rows }) {
  const marked = (r, job) => MARKS[rack.nodes[r][3]] || rack.nodes[r][4].some((g) => g[1] === job && g[0] === "failed");
  const runs = new Map(); // job -> {nodes, clean, any}: row counts and [from, to] runs
  const extend = (run, key, r) => {
    const cur = `${key}Cur`;
    run[cur] = run[cur] && run[cur][1] === r - 1 ? [run[cur][0], r] : [r, r];
    if (!run[key] || run[cur][1] - run[cur][0] > run[key][1] - run[key][0]) run[key] = run[cur];
  };
  for (let r = 0; r < rows; r++) {
    const here = new Set();
    for (let g = 0; g < gpn; g++) { const job = jobAt(r, g); if (job !== null) here.add(job); }
    for (const job of here) {
      const run = runs.get(job) || { nodes: 0 };
      run.nodes++;
      extend(run, "any", r);
      if (!marked(r, job)) extend(run, "clean", r);
      runs.set(job, run);
    }
  }
  // Grows with the cell: 10 px on a rack page, about 17 on a 4K wall.
  const font = Math.max(7, Math.min(32, Math.round(size * 0.46)));
  const out = [];
  for (const [job, run] of runs) {
    if (run.nodes < BIG_JOB_NODES) continue;
    const [from, to] = run.clean || run.any;
    let lo = gpn, hi = -1;
    for (let r = from; r <= to; r++) for (let g = 0; g < gpn; g++) if (jobAt(r, g) === job) { lo = Math.min(lo, g); hi = Math.max(hi, g); }
    const span = (hi - lo) * step + size;
    const j = rack.jobs[String(job)];
    let text = `#${job}${j && j.name ? ` ${j.name}` : ""}`;
    const fits = Math.max(3, Math.floor(span / (font * 0.62)));
    if (text.length > fits) text = `${text.slice(0, fits - 1)}…`;
    const x = left + lo * step + span / 2;
    const y = (from * step + to * step + size) / 2;
    out.push(`<text class="job-label" data-job-label="${job}" x="${x}" y="${y}" dy="0.36em" text-anchor="middle" font-size="${font}">${esc(text)}</text>`);
  }
  return out.join("");
}

/** Fraction of a rack's GPUs held by jobs. */
export function utilisation(rack) {
  let total = 0, used = 0;
  for (const n of rack.nodes) for (const g of n[4]) { total++; if (g[1] !== null) used++; }
  return total ? used / total : 0;
}

/** Size of the grid drawn by drawGrid, for placeholders that keep the layout still. */
export function gridSize(nodes, gpn, size, labels = false) {
  const gap = size >= 16 ? 2 : 1;
  return { width: (labels ? 22 : 0) + gpn * (size + gap), height: nodes * (size + gap) };
}

/** The cell under a point of the grid's own (viewBox) coordinates; a gap
 * belongs to the cell left of it and above it. */
function hit(m, x, y) {
  const col = Math.floor((x - m.L.left) / m.L.step), row = Math.floor(y / m.L.step);
  return col >= 0 && row >= 0 ? (m.grid[row] && m.grid[row][col]) || null : null;
}

/** The cell under a pointer (client coordinates) in a drawn grid, or null. */
function cellAtPoint(svg, clientX, clientY) {
  const m = drawn.get(svg);
  const r = svg.getBoundingClientRect();
  if (!m || !r.width || !r.height) return null;
  return hit(m, ((clientX - r.left) * m.L.width) / r.width, ((clientY - r.top) * m.L.height) / r.height);
}

/** Where a cell is on screen (client coordinates). */
function cellRect(svg, c) {
  const m = drawn.get(svg);
  const r = svg.getBoundingClientRect();
  const sx = r.width / m.L.width, sy = r.height / m.L.height;
  const x = m.L.left + c.gpu * m.L.step, y = c.row * m.L.step;
  return { left: r.left + x * sx, top: r.top + y * sy, width: m.L.size * sx, height: m.L.size * sy };
}

function showCursor(svg, m, c) {
  let path = svg.querySelector(":scope > path.cursor");
  if (!path) {
    path = document.createElementNS("http://www.w3.org/2000/svg", "path");
    path.setAttribute("class", "cursor");
    svg.append(path);
  }
  path.setAttribute("d", rect(m.L.left + c.gpu * m.L.step, c.row * m.L.step, m.L.size, m.L.size));
}

/** The grids drawn in ``el``: an <svg>, an element holding grids, or a CSS
 * selector (the grids in every element it matches). */
function gridsIn(el) {
  if (typeof el === "string") return [...new Set([...document.querySelectorAll(el)].flatMap(gridsIn))];
  if (!el) return [];
  if (drawn.has(el)) return [el];
  return [...el.querySelectorAll("svg.grid-svg")].filter((svg) => drawn.has(svg));
}

/** Every cell of the grids in ``el`` (see gridsIn): what the grid was drawn from (rack,
 * version, node, gpu, host, job, state, mark, dim, matched, moved) and what its
 * elements paint there, read back from the SVG: ``fill`` (a job id, "free" or
 * null), ``pattern`` ("p-failed"...), ``edges`` (["free", "spare", "moved"...])
 * and ``letter``. */
function paintedCells(el) {
  return gridsIn(el).flatMap((svg) => {
    const m = drawn.get(svg);
    const { size, step, left } = m.L;
    const fills = [...svg.querySelectorAll(":scope > path.fill")];
    const patterns = [...svg.querySelectorAll(":scope > path.pattern")];
    const edges = [...svg.querySelectorAll(":scope > path.edge")];
    const letters = new Map();
    const text = svg.querySelector(":scope > text.mark");
    for (let i = 0; text && i < text.getNumberOfChars(); i++) {
      const e = text.getExtentOfChar(i);
      const c = hit(m, e.x + e.width / 2, e.y + e.height / 2);
      if (c) letters.set(c, (letters.get(c) || "") + text.textContent[i]);
    }
    return m.cells.map((c) => {
      const x = left + c.gpu * step, y = c.row * step;
      const mid = new DOMPoint(x + size / 2, y + size / 2);
      const fill = fills.find((p) => p.isPointInFill(mid));
      const pattern = patterns.find((p) => p.isPointInFill(mid));
      // A point of the cell's top edge, inside the first dash of a dashed edge.
      const edge = new DOMPoint(x + Math.min(0.5, size / 4), y);
      return {
        rack: m.rack.rack, version: m.rack.version, node: c.node, gpu: c.gpu, host: c.host, job: c.job,
        state: c.state, mark: c.mark, dim: c.dim, matched: c.matched, moved: c.moved, held: c.held,
        fill: fill ? (fill.dataset.job ? Number(fill.dataset.job) : "free") : null,
        pattern: pattern ? pattern.getAttribute("fill").slice(5, -1) : null,
        edges: edges.filter((p) => p.isPointInStroke(edge)).map((p) => p.dataset.edge),
        letter: letters.get(c) || null,
      };
    });
  });
}

window.rackwiseGrid = {
  cells: paintedCells,
  /** A cell's box on screen (client coordinates), {x, y, width, height}, or null. */
  box(el, node, gpu) {
    const svg = gridsIn(el).find((s) => drawn.get(s).cells.some((c) => c.node === node && c.gpu === gpu));
    if (!svg) return null;
    const r = cellRect(svg, drawn.get(svg).cells.find((c) => c.node === node && c.gpu === gpu));
    return { x: r.left, y: r.top, width: r.width, height: r.height };
  },
};

/** The tooltip's words for a cell: the rack, the GPU, its job and health. */
function describe(svg, c) {
  const rack = drawn.get(svg).rack;
  return `${rack.name} · ${describeCell(rack, c)}`;
}

/** Tooltip for hover and keyboard focus on any grid inside ``root``; one
 * pointer handler maps the position to its cell. A focused grid has a cursor
 * cell: arrows move it, Enter opens it (as a click). */
export function attachTooltip(root) {
  const tip = document.createElement("div");
  tip.className = "tooltip";
  tip.setAttribute("role", "tooltip");
  tip.dataset.testid = "tooltip";
  tip.hidden = true;
  document.body.appendChild(tip);
  // Who opened the tooltip: the mouse, or the keyboard cursor. A grid repainted
  // (or shifted) under a resting mouse must not hide what the keyboard shows.
  let source = null;
  let shown = null;   // the cell the mouse shows
  const hide = () => { tip.hidden = true; shown = null; };
  const show = (svg, c, x, y, by) => {
    tip.textContent = describe(svg, c);
    tip.style.left = `${x + 12}px`;
    tip.style.top = `${y + 12}px`;
    tip.hidden = false;
    // Read out what the keyboard moves to, not what the mouse passes over.
    if (by === "key") tip.setAttribute("aria-live", "polite"); else tip.removeAttribute("aria-live");
    source = by;
  };
  root.addEventListener("pointermove", (e) => {
    if (source === "key") return;
    const svg = e.target.closest && e.target.closest("svg.grid-svg");
    const c = svg && cellAtPoint(svg, e.clientX, e.clientY);
    if (!c) { hide(); return; }
    if (c === shown && !tip.hidden) { tip.style.left = `${e.pageX + 12}px`; tip.style.top = `${e.pageY + 12}px`; return; }
    shown = c;
    show(svg, c, e.pageX, e.pageY, "mouse");
  });
  root.addEventListener("mouseleave", () => { if (source !== "key") hide(); });
  const gridOf = (target) => {
    const host = target.closest && target.closest(".grid");
    const svg = host && host.querySelector("svg.grid-svg");
    return svg && drawn.has(svg) ? { host, svg, m: drawn.get(svg) } : null;
  };
  const cursorAt = ({ host, svg, m }, c) => {
    if (!c) return;
    host.dataset.cursor = `${c.node}:${c.gpu}`;
    showCursor(svg, m, c);
    const r = cellRect(svg, c);
    show(svg, c, r.left + r.width + window.scrollX, r.top + window.scrollY, "key");
  };
  const cursorCell = ({ host, m }) => {
    if (!host.dataset.cursor) return null;
    const [node, gpu] = host.dataset.cursor.split(":").map(Number);
    return m.cells.find((c) => c.node === node && c.gpu === gpu) || null;
  };
  root.addEventListener("focusin", (e) => {
    const g = gridOf(e.target);
    if (g) cursorAt(g, cursorCell(g) || g.m.cells.find((c) => c.job !== null) || g.m.cells[0]);
  });
  root.addEventListener("keydown", (e) => {
    const g = gridOf(e.target);
    const c = g && cursorCell(g);
    if (!c) return;
    if (e.key === "Enter") {
      const r = cellRect(g.svg, c);
      g.svg.dispatchEvent(new MouseEvent("click", { bubbles: true, clientX: r.left + r.width / 2, clientY: r.top + r.height / 2 }));
      return;
    }
    // Right and left run on through the rows; up and down keep the GPU.
    const move = { ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0] }[e.key];
    if (!move) return;
    e.preventDefault();
    const row = g.m.grid[c.row + move[0]];
    const next = move[0] ? row && row[Math.min(c.gpu, row.length - 1)] : g.m.cells[g.m.cells.indexOf(c) + move[1]];
    if (next) cursorAt(g, next);
  });
  root.addEventListener("focusout", () => { tip.hidden = true; source = null; shown = null; });
}

/** Click on a cell: open its job, else its rack. */
export function attachClicks(root) {
  root.addEventListener("click", (e) => {
    const svg = e.target.closest && e.target.closest("svg.grid-svg");
    const c = svg && cellAtPoint(svg, e.clientX, e.clientY);
    if (!c) return;
    window.location.href = c.job !== null ? `/jobs/${c.job}/` : `/racks/${drawn.get(svg).rack.rack}/`;
  });
}
