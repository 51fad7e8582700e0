// Drawing a rack's GPU grid as SVG: one row per node, one cell per GPU.
// Used by every page that shows racks (fleet, rack, job, actions), so there is
// one code path for the picture. No state here: a rack event in, markup out.

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

/** What one GPU cell shows: {node, slot, host, gpu, nodeState, health, job, mark}. */
export function cells(rack) {
  const spares = spareNodes(rack);
  const out = [];
  for (const [nodeId, slot, host, nodeState, gpus] of rack.nodes) {
    gpus.forEach(([health, job], gpu) => {
      let mark = null;
      if (MARKS[nodeState]) mark = nodeState;
      else if (health === "failed") mark = "gpu_failed";
      else if (spares.has(nodeId)) mark = "spare";
      out.push({ node: nodeId, slot, host, gpu, nodeState, health, job, mark });
    });
  }
  return out;
}

export function describeCell(rack, c) {
  const job = c.job === null ? "free" : jobLabel(rack, c.job);
  const mark = c.mark ? `, ${MARKS[c.mark].label}` : "";
  return `${c.host} GPU ${c.gpu}: ${job}; node ${c.nodeState}, GPU ${c.health}${mark}`;
}

export function jobLabel(rack, jobId) {
  const j = rack.jobs[String(jobId)];
  if (!j || !j.name) return `job #${jobId}`;
  return `job #${jobId} ${j.name} (${j.tenant}, ${j.state})`;
}

/** Per-rack counts for a rack card. ``freeSlice``: idle healthy nodes without a
 * failed GPU, spares left out (what a big gang is offered); ``failed``: failed or
 * in repair; ``draining``: draining or drained; ``suspect``; ``spares`` (as
 * marked S); ``problems``: any failed, draining, suspect or in-repair node, or a
 * failed GPU. */
export function rackStats(rack) {
  const spares = spareNodes(rack);
  const out = { freeSlice: 0, failed: 0, draining: 0, suspect: 0, spares: spares.size, gpuFailed: 0, problems: false };
  for (const [nodeId, , , state, gpus] of rack.nodes) {
    const gpuFailed = gpus.some((g) => g[0] === "failed");
    if (state === "healthy" && !gpuFailed && !spares.has(nodeId) && gpus.every((g) => g[1] === null)) out.freeSlice++;
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

/**
 * SVG markup for one rack.
 * opts: cell (px), highlight (job id to emphasise; others dimmed), match (Set of
 * node ids or job ids to outline), labels (slot numbers), jobLabels (big jobs'
 * id and name on their cells).
 *
 * Every state mark carries its letter at every cell size, not only its colour
 * and pattern. A job is drawn as one block: the gaps between its own cells take
 * its colour, and a light outline runs where it meets another job or a free cell.
 */
export function rackSvg(rack, opts = {}) {
  const size = opts.cell || 9;
  const gap = size >= 16 ? 2 : 1;
  const step = size + gap;
  const left = opts.labels ? 22 : 0;
  const gpn = Math.max(1, ...rack.nodes.map((n) => n[4].length));
  const rows = rack.nodes.length;
  const width = left + gpn * step;
  const height = rows * step;
  const parts = [];
  const all = cells(rack);
  const rowOf = new Map(rack.nodes.map((n, i) => [n[0], i]));
  const jobAt = (row, gpu) => { const n = rack.nodes[row]; const g = n && n[4][gpu]; return g ? g[1] : null; };
  const dimmed = (job) => opts.highlight != null && job !== opts.highlight;
  const font = size >= 14 ? Math.round(size * 0.55) : Math.max(6, Math.round(size * 0.8));
  let used = 0, bad = 0;
  for (const c of all) {
    const x = left + c.gpu * step;
    const y = rowOf.get(c.node) * step;
    if (c.job !== null) used++;
    if (c.mark && c.mark !== "spare") bad++;
    const fill = c.job === null ? "var(--free)" : jobColor(c.job, rack);
    const matched = opts.match && (opts.match.has(c.node) || (c.job !== null && opts.match.has(`j${c.job}`)));
    const cls = ["cell", c.mark ? `m-${c.mark}` : "", dimmed(c.job) ? "dim" : "", matched ? "match" : ""].join(" ").trim();
    const label = esc(describeCell(rack, c));
    parts.push(
      `<g class="${cls}" data-node="${c.node}" data-gpu="${c.gpu}"${c.job !== null ? ` data-job="${c.job}"` : ""} data-state="${c.mark || (c.job === null ? "free" : "busy")}">` +
      `<title>${label}</title>` +
      `<rect x="${x}" y="${y}" width="${size}" height="${size}" fill="${fill}"/>` +
      (c.mark && MARKS[c.mark].pattern ? `<rect x="${x}" y="${y}" width="${size}" height="${size}" fill="url(#${MARKS[c.mark].pattern})"/>` : "") +
      (c.mark ? `<text class="mark" x="${x + size / 2}" y="${y + size / 2}" dy="0.36em" text-anchor="middle" font-size="${font}">${MARKS[c.mark].letter}</text>` : "") +
      `</g>`
    );
  }
  parts.push(jobBlocks(rack, jobAt, { size, gap, left, gpn, rows, dimmed }));
  if (opts.jobLabels) parts.push(jobNames(rack, jobAt, { size, step, left, gpn, rows }));
  if (opts.labels) {
    rack.nodes.forEach((n, row) => {
      parts.push(`<text class="slot" x="0" y="${row * step + size * 0.75}" font-size="${Math.round(size * 0.5)}">${n[1]}</text>`);
    });
  }
  const summary = `rack ${esc(rack.name)}: ${used} of ${all.length} GPUs used, ${bad} marked failed, draining or in repair`;
  return `<svg class="grid-svg" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="${summary}">${parts.join("")}</svg>`;
}

/** The gaps inside each job in its colour, and each job's outline (half a gap
 * outside its cells, where the neighbour is not the same job; none on the
 * grid's own border). */
function jobBlocks(rack, jobAt, { size, gap, left, gpn, rows, dimmed }) {
  const step = size + gap;
  const h = gap / 2;
  const bridges = [];
  const outlines = new Map(); // job -> path segments
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < gpn; g++) {
      const job = jobAt(r, g);
      if (job === null) continue;
      const x = left + g * step, y = r * step;
      const dim = dimmed(job) ? " dim" : "";
      const fill = jobColor(job, rack);
      const right = jobAt(r, g + 1) === job, down = jobAt(r + 1, g) === job;
      if (right) bridges.push(`<rect class="bridge${dim}" x="${x + size}" y="${y}" width="${gap}" height="${size}" fill="${fill}"/>`);
      if (down) bridges.push(`<rect class="bridge${dim}" x="${x}" y="${y + size}" width="${size}" height="${gap}" fill="${fill}"/>`);
      if (right && down && jobAt(r + 1, g + 1) === job) bridges.push(`<rect class="bridge${dim}" x="${x + size}" y="${y + size}" width="${gap}" height="${gap}" fill="${fill}"/>`);
      const segs = outlines.get(job) || [];
      const x0 = x - h, x1 = x + size + h, y0 = y - h, y1 = y + size + h;
      if (r > 0 && jobAt(r - 1, g) !== job) segs.push(`M${x0} ${y0}H${x1}`);
      if (r < rows - 1 && !down) segs.push(`M${x0} ${y1}H${x1}`);
      if (g > 0 && jobAt(r, g - 1) !== job) segs.push(`M${x0} ${y0}V${y1}`);
      if (g < gpn - 1 && !right) segs.push(`M${x1} ${y0}V${y1}`);
      outlines.set(job, segs);
    }
  }
  const paths = [...outlines].filter(([, segs]) => segs.length).map(([job, segs]) =>
    `<path class="job-outline${dimmed(job) ? " dim" : ""}" data-job-outline="${job}" d="${segs.join("")}" stroke-width="${gap === 1 ? 1 : 1.5}"/>`);
  return bridges.join("") + paths.join("");
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
  const font = Math.max(7, Math.min(12, Math.round(size * 0.46)));
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

/** Size of the grid drawn by rackSvg, for placeholders that keep the layout still. */
export function gridSize(nodes, gpn, size, labels = false) {
  const gap = size >= 16 ? 2 : 1;
  return { width: (labels ? 22 : 0) + gpn * (size + gap), height: nodes * (size + gap) };
}

/** After a repaint, put the keyboard cursor back on the cell it was on. */
export function restoreCursor(grid) {
  if (!grid.dataset.cursor) return;
  const [node, gpu] = grid.dataset.cursor.split(":");
  const cell = grid.querySelector(`g.cell[data-node="${node}"][data-gpu="${gpu}"]`);
  if (cell) cell.classList.add("cursor");
}

/** Tooltip for hover and keyboard focus on any grid inside ``root``. */
export function attachTooltip(root, lookup) {
  const tip = document.createElement("div");
  tip.className = "tooltip";
  tip.setAttribute("role", "tooltip");
  tip.dataset.testid = "tooltip";
  tip.hidden = true;
  document.body.appendChild(tip);
  // Who opened the tooltip: the mouse, or the keyboard cursor. A grid repainted
  // (or shifted) under a resting mouse must not hide what the keyboard shows.
  let source = null;
  const show = (target, x, y, by) => {
    const g = target.closest && target.closest("g.cell");
    if (!g) { if (source !== "key") tip.hidden = true; return; }
    const text = lookup(Number(g.dataset.node), Number(g.dataset.gpu));
    if (!text) return;
    tip.textContent = text;
    tip.style.left = `${x + 12}px`;
    tip.style.top = `${y + 12}px`;
    tip.hidden = false;
    source = by;
  };
  root.addEventListener("mouseover", (e) => { if (source !== "key") show(e.target, e.pageX, e.pageY, "mouse"); });
  root.addEventListener("mouseleave", () => { if (source !== "key") tip.hidden = true; });
  // Keyboard: a focused grid has a cursor cell; arrows move it, Enter opens it.
  const cursorAt = (grid, cell) => {
    for (const old of grid.querySelectorAll("g.cell.cursor")) old.classList.remove("cursor");
    if (!cell) return;
    cell.classList.add("cursor");
    grid.dataset.cursor = `${cell.dataset.node}:${cell.dataset.gpu}`;
    const r = cell.getBoundingClientRect();
    show(cell, r.right + window.scrollX, r.top + window.scrollY, "key");
  };
  root.addEventListener("focusin", (e) => {
    const grid = e.target.closest && e.target.closest(".grid");
    if (!grid) return;
    cursorAt(grid, grid.querySelector("g.cell.cursor") || grid.querySelector("g.cell[data-job]") || grid.querySelector("g.cell"));
  });
  root.addEventListener("keydown", (e) => {
    const grid = e.target.closest && e.target.closest(".grid");
    const cell = grid && grid.querySelector("g.cell.cursor");
    if (!cell) return;
    if (e.key === "Enter") { cell.dispatchEvent(new MouseEvent("click", { bubbles: true })); return; }
    const all = [...grid.querySelectorAll("g.cell")];
    const gpn = all.filter((c) => c.dataset.node === all[0].dataset.node).length;
    const step = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: gpn, ArrowUp: -gpn }[e.key];
    if (!step) return;
    e.preventDefault();
    const next = all[all.indexOf(cell) + step];
    if (next) cursorAt(grid, next);
  });
  root.addEventListener("focusout", () => { tip.hidden = true; source = null; });
}

/** Click on a cell: open its job, else its rack. */
export function attachClicks(root, rackOf) {
  root.addEventListener("click", (e) => {
    const g = e.target.closest && e.target.closest("g.cell");
    if (!g) return;
    if (g.dataset.job) window.location.href = `/jobs/${g.dataset.job}/`;
    else { const rack = rackOf(Number(g.dataset.node)); if (rack != null) window.location.href = `/racks/${rack}/`; }
  });
}
