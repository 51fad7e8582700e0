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

/** A stable colour for a job: a hash of its id to a hue. */
export function jobColor(jobId) {
  // Job ids are sequential: the golden angle spreads neighbours far apart.
  if (Number.isInteger(Number(jobId))) {
    const n = Number(jobId);
    return `hsl(${(n * 137.508) % 360} 62% ${44 + (n % 3) * 8}%)`;
  }
  let h = 2166136261;
  const s = String(jobId);
  for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
  const hue = (h >>> 0) % 360;
  const light = 42 + ((h >>> 9) % 3) * 8;
  return `hsl(${hue} 62% ${light}%)`;
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

const esc = (s) => String(s).replace(/[&<>"]/g, (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[ch]);

/**
 * SVG markup for one rack.
 * opts: cell (px), highlight (job id to emphasise; others dimmed), match (Set of
 * node ids or job ids to outline), labels (slot numbers).
 */
export function rackSvg(rack, opts = {}) {
  const size = opts.cell || 9;
  const gap = size >= 16 ? 2 : 1;
  const left = opts.labels ? 22 : 0;
  const gpn = Math.max(1, ...rack.nodes.map((n) => n[4].length));
  const width = left + gpn * (size + gap);
  const height = rack.nodes.length * (size + gap);
  const parts = [];
  const all = cells(rack);
  let used = 0, bad = 0;
  for (const c of all) {
    const row = rack.nodes.findIndex((n) => n[0] === c.node);
    const x = left + c.gpu * (size + gap);
    const y = row * (size + gap);
    if (c.job !== null) used++;
    if (c.mark && c.mark !== "spare") bad++;
    const dim = opts.highlight != null && c.job !== opts.highlight;
    const fill = c.job === null ? "var(--free)" : jobColor(c.job);
    const matched = opts.match && (opts.match.has(c.node) || (c.job !== null && opts.match.has(`j${c.job}`)));
    const cls = ["cell", c.mark ? `m-${c.mark}` : "", dim ? "dim" : "", matched ? "match" : ""].join(" ").trim();
    const label = esc(describeCell(rack, c));
    parts.push(
      `<g class="${cls}" data-node="${c.node}" data-gpu="${c.gpu}"${c.job !== null ? ` data-job="${c.job}"` : ""} data-state="${c.mark || (c.job === null ? "free" : "busy")}">` +
      `<title>${label}</title>` +
      `<rect x="${x}" y="${y}" width="${size}" height="${size}" fill="${fill}"/>` +
      (c.mark && MARKS[c.mark].pattern ? `<rect x="${x}" y="${y}" width="${size}" height="${size}" fill="url(#${MARKS[c.mark].pattern})"/>` : "") +
      (c.mark && size >= 14 ? `<text x="${x + size / 2}" y="${y + size * 0.7}" text-anchor="middle" font-size="${Math.round(size * 0.55)}">${MARKS[c.mark].letter}</text>` : "") +
      `</g>`
    );
  }
  if (opts.labels) {
    rack.nodes.forEach((n, row) => {
      parts.push(`<text class="slot" x="0" y="${row * (size + gap) + size * 0.75}" font-size="${Math.round(size * 0.5)}">${n[1]}</text>`);
    });
  }
  const summary = `rack ${esc(rack.name)}: ${used} of ${all.length} GPUs used, ${bad} marked failed, draining or in repair`;
  return `<svg class="grid-svg" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="${summary}">${parts.join("")}</svg>`;
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
