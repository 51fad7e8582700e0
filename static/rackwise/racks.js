// Pages that show a few racks large (a rack, a job's placement): every
// [data-live-rack] element gets its rack's grid, kept live. data-highlight-job
// on the element dims every other job's cells; data-job-labels names its big
// jobs. An element added later is drawn from its rack's next applied state
// (job.js follows the job's racks this way).
//
// The rack page also has, per node row, the node's state badge (kept live from
// the rack events) and, for operators, drain / undrain / mark failed / return to
// service with a reason: each a POST to /api/nodes/<id>/<action>/, whose answer
// fills the row and whose refusal (400 field messages, 403/409 detail) is shown
// next to it. The grid changes when the rack event of that change arrives.

import { attachClicks, attachTooltip, drawGrid, paintSwatches } from "./grid.js";
import { api, showFieldErrors, startLive } from "./live.js";

const els = [...document.querySelectorAll("[data-live-rack]")];
const ids = [...new Set(els.map((el) => Number(el.dataset.rackId)))];
export const live = startLive(ids);

const stateLabel = (state) => state.charAt(0).toUpperCase() + state.slice(1).replace("_", " ");

function paint(rack) {
  for (const el of document.querySelectorAll(`[data-live-rack][data-rack-id="${rack.rack}"]`)) {
    const highlight = el.dataset.highlightJob ? Number(el.dataset.highlightJob) : null;
    drawGrid(el.querySelector(".grid"), rack, { cell: Number(el.dataset.cell || 22), labels: true, highlight, jobLabels: "jobLabels" in el.dataset });
  }
  for (const [nodeId, , , state] of rack.nodes) {
    const badge = document.querySelector(`[data-node-state="${nodeId}"]`);
    if (badge && !badge.classList.contains(state)) {
      badge.className = `badge ${state}`;
      badge.textContent = stateLabel(state);
    }
  }
  paintSwatches(document, live.racks);
}
live.on("rack", paint);
live.on("job", (event) => {
  for (const el of document.querySelectorAll(`[data-job-state="${event.job.id}"]`)) {
    el.textContent = event.job.state;
    el.className = `badge ${event.job.state}`;
  }
});

/** One node action from its row's form; the answer (the node) fills the row. */
async function act(form, button) {
  const row = form.closest("[data-node-id]");
  showFieldErrors(form, null);
  for (const b of form.querySelectorAll("button")) b.disabled = true;
  try {
    const node = await api(`/api/nodes/${form.dataset.nodeActions}/${button.dataset.nodeAction}/`, {
      method: "POST",
      body: { reason: form.reason.value },
    });
    form.reason.value = "";
    const badge = row.querySelector("[data-node-state]");
    badge.className = `badge ${node.state}`;
    badge.textContent = stateLabel(node.state);
    row.querySelector("[data-node-since]").textContent = (node.state_changed_at || "").slice(0, 16).replace("T", " ");
    row.querySelector("[data-node-reason]").textContent = node.state_reason;
  } catch (err) {
    showFieldErrors(form, err);
  } finally {
    for (const b of form.querySelectorAll("button")) b.disabled = false;
  }
}
document.addEventListener("submit", (e) => { if (e.target.matches("[data-node-actions]")) e.preventDefault(); });
document.addEventListener("click", (e) => {
  const button = e.target.closest && e.target.closest("[data-node-actions] [data-node-action]");
  if (button) act(button.form, button);
});

attachTooltip(document.querySelector("main"));
attachClicks(document.querySelector("main"));
live.start().then(() => { document.body.dataset.ready = "1"; });
