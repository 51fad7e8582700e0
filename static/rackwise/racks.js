// Pages that show a few racks large (a rack, a job's placement): every
// [data-live-rack] element gets its rack's grid, kept live. data-highlight-job
// on the element dims every other job's cells. An element added later is drawn
// from its rack's next applied state (job.js follows the job's racks this way).

import { attachClicks, attachTooltip, cells, describeCell, rackSvg, restoreCursor } from "./grid.js";
import { startLive } from "./live.js";

const els = [...document.querySelectorAll("[data-live-rack]")];
const ids = [...new Set(els.map((el) => Number(el.dataset.rackId)))];
export const live = startLive(ids);

function paint(rack) {
  for (const el of document.querySelectorAll(`[data-live-rack][data-rack-id="${rack.rack}"]`)) {
    const highlight = el.dataset.highlightJob ? Number(el.dataset.highlightJob) : null;
    const grid = el.querySelector(".grid");
    grid.innerHTML = rackSvg(rack, { cell: Number(el.dataset.cell || 22), labels: true, highlight });
    restoreCursor(grid);
  }
}
live.on("rack", paint);
live.on("job", (event) => {
  for (const el of document.querySelectorAll(`[data-job-state="${event.job.id}"]`)) {
    el.textContent = event.job.state;
    el.className = `badge ${event.job.state}`;
  }
});
attachTooltip(document.querySelector("main"), (node, gpu) => {
  const rack = live.racks.get(live.nodeRack.get(node));
  const c = rack && cells(rack).find((x) => x.node === node && x.gpu === gpu);
  return c ? `${rack.name} · ${describeCell(rack, c)}` : "";
});
attachClicks(document.querySelector("main"), (node) => live.nodeRack.get(node));
live.start().then(() => { document.body.dataset.ready = "1"; });
