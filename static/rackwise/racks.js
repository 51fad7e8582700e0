// Pages that show a few racks large (a rack, a job's placement): every
// [data-live-rack] element gets its rack's grid, kept live. data-highlight-job
// on the element dims every other job's cells; data-job-labels names its big
// jobs. An element added later is drawn from its rack's next applied state
// (job.js follows the job's racks this way).
//
// The rack page also has, per node row, the node's state badge (kept live from
// the rack events) and, for operators, the moves the node's state allows (the
// table in #node-moves; the buttons follow the live state): each a POST to
// /api/nodes/<id>/<move>/, whose answer fills the row and whose refusal (400
// field messages, 403/409 detail) is shown next to it. Drain and mark failed
// need a reason; on a node that holds jobs the API answers 409 with what the
// move would interrupt, shown in a dialog, and the move is sent again with
// confirm: true only if the operator says so. The grid changes when the rack
// event of that change arrives.
//
// Its node health table (the agents' latest readings, verdicts in force) is
// drawn by the server, from the page's own template (/racks/<id>/signals/):
// fetched again every minute (readings are stored about once a minute), and
// at once when a rack event's fabric state or verdict counts differ from the
// table's.

import { attachClicks, attachTooltip, drawGrid, paintSwatches } from "./grid.js";
import { api, showFieldErrors, startLive } from "./live.js";
import { when } from "./time.js";

const els = [...document.querySelectorAll("[data-live-rack]")];
const ids = [...new Set(els.map((el) => Number(el.dataset.rackId)))];
export const live = startLive(ids);

const stateLabel = (state) => state.charAt(0).toUpperCase() + state.slice(1).replace("_", " ");
const movesEl = document.getElementById("node-moves");
const MOVES = movesEl ? JSON.parse(movesEl.textContent) : [];

/** Show a node row's buttons for the moves its state allows. */
function showMoves(nodeId, state) {
  const form = document.querySelector(`[data-node-actions="${nodeId}"]`);
  if (!form) return;
  for (const m of MOVES) {
    const button = form.querySelector(`[data-node-action="${m.name}"]`);
    if (button) button.hidden = !m.from.includes(state);
  }
}

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
      showMoves(nodeId, state);
    }
  }
  paintSwatches(document, live.racks);
}
live.on("rack", paint);

const HEALTH_EVERY_MS = 60000;
let healthBusy = false;
async function refreshHealth() {
  const el = document.querySelector("[data-rack-signals]");
  if (!el || healthBusy) return;
  healthBusy = true;
  try {
    const res = await fetch(`/racks/${el.dataset.rackSignals}/signals/`, { credentials: "same-origin" });
    if (res.ok) {
      const fresh = new DOMParser().parseFromString(await res.text(), "text/html").querySelector("[data-rack-signals]");
      if (fresh) el.replaceWith(document.adoptNode(fresh));
    }
  } catch (e) { /* tried again next minute */ } finally { healthBusy = false; }
}
/** "drain:1 suspect:2 " (the table's data-verdicts) as a map. */
const verdictMap = (text) => new Map(text.trim().split(/\s+/).filter(Boolean).map((p) => p.split(":")).map(([v, n]) => [v, Number(n)]));
function healthDiffers(rack) {
  const el = document.querySelector(`[data-rack-signals="${rack.rack}"]`);
  if (!el || rack.fabric_degraded === undefined) return false;
  const shown = verdictMap(el.dataset.verdicts);
  const now = Object.entries(rack.verdicts || {});
  return el.dataset.fabric !== rack.fabric_degraded || shown.size !== now.length || now.some(([v, n]) => shown.get(v) !== n);
}
live.on("rack", (rack) => { if (healthDiffers(rack)) refreshHealth(); });
setInterval(refreshHealth, HEALTH_EVERY_MS);
live.on("job", (event) => {
  for (const el of document.querySelectorAll(`[data-job-state="${event.job.id}"]`)) {
    el.textContent = event.job.state;
    el.className = `badge ${event.job.state}`;
  }
});

/** Ask the operator to confirm a move the API says would affect jobs
 * (its 409's impact); resolves true to go ahead. */
function confirmMove(form, button, err) {
  const dialog = document.querySelector("[data-testid=node-confirm]");
  const impact = err.data.impact;
  dialog.querySelector("[data-confirm-title]").textContent = `${button.textContent} ${form.dataset.hostname}?`;
  dialog.querySelector("[data-confirm-detail]").textContent = err.message;
  const table = dialog.querySelector("[data-confirm-jobs]");
  for (const row of [...table.rows].slice(1)) row.remove();
  for (const job of impact.jobs) {
    const row = table.insertRow();
    const link = Object.assign(document.createElement("a"), { href: `/jobs/${job.id}/`, textContent: `#${job.id} ${job.name}` });
    row.insertCell().append(link);
    for (const value of [job.gpus_here, job.gpus, job.gpu_hours_lost.toFixed(1)]) row.insertCell().textContent = value;
  }
  dialog.querySelector("[data-testid=node-confirm-go]").textContent = `${button.textContent} anyway`;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => dialog.addEventListener("close", () => resolve(dialog.returnValue === "go"), { once: true }));
}

/** One node move from its row's form; the answer (the node) fills the row. */
async function act(form, button, confirm = false) {
  const row = form.closest("[data-node-id]");
  showFieldErrors(form, null);
  for (const b of form.querySelectorAll("button")) b.disabled = true;
  let again = false;
  try {
    const node = await api(`/api/nodes/${form.dataset.nodeActions}/${button.dataset.nodeAction}/`, {
      method: "POST",
      body: { reason: form.reason.value, confirm },
    });
    form.reason.value = "";
    const badge = row.querySelector("[data-node-state]");
    badge.className = `badge ${node.state}`;
    badge.textContent = stateLabel(node.state);
    showMoves(node.id, node.state);
    row.querySelector("[data-node-since]").textContent = when(node.state_changed_at);
    row.querySelector("[data-node-reason]").textContent = node.state_reason;
  } catch (err) {
    if (err.status === 409 && err.data && err.data.confirm_required) again = await confirmMove(form, button, err);
    else showFieldErrors(form, err);
  } finally {
    for (const b of form.querySelectorAll("button")) b.disabled = false;
  }
  if (again) await act(form, button, true);
}
document.addEventListener("submit", (e) => { if (e.target.matches("[data-node-actions]")) e.preventDefault(); });
document.addEventListener("click", (e) => {
  const button = e.target.closest && e.target.closest("[data-node-actions] [data-node-action]");
  if (button) act(button.form, button);
});

attachTooltip(document.querySelector("main"));
attachClicks(document.querySelector("main"));
live.start().then(() => { document.body.dataset.ready = "1"; });
