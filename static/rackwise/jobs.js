// The jobs list, kept live by the feed's job events (no rack snapshot: this page
// shows no grid).
//
// The server owns the rows, their order and the page: a job already in the table
// is updated in place (badge, "Why waiting", a brief highlight), and dimmed
// rather than removed when it stops matching the page's state filter, so nothing
// moves under the operator's cursor. A job not in the table that now matches the
// filters only counts towards a "N new jobs match — show" banner that reloads.
//
// Rows of unfinished jobs carry a Cancel button for submitters and operators
// (cancel.js); it goes when the job finishes.
//
// Tests read window.rackwise.jobsApplied (job events handled) and the banner.

import { cancelButtons } from "./cancel.js";
import { paintSwatches } from "./grid.js";
import { startLive } from "./live.js";

const table = document.querySelector("[data-testid=jobs]");
// Each job's swatch in its stable colour (this page follows no rack).
paintSwatches(table);
const filters = {
  state: table.dataset.filterState,
  tenant: table.dataset.filterTenant,
  q: table.dataset.filterQ.trim(),
  active: table.dataset.activeStates.split(" "),
};
const finished = table.dataset.finishedStates.split(" ");
// On a full page, a job older than the last row would land past the end: not "new".
const oldestShown = table.hasAttribute("data-page-full")
  ? Math.min(...[...table.querySelectorAll("[data-job-id]")].map((tr) => Number(tr.dataset.jobId)))
  : 0;
const banner = document.querySelector("[data-testid=new-jobs]");
const matching = new Map(); // job id not in the table -> whether it matches now
let applied = 0;
let hellos = 0;
let reconnected = false;

// The states the server filters on one by one (the form's options, less "active" and "all").
const oneStates = [...document.querySelector("[data-testid=job-filters] [name=state]").options]
  .map((o) => o.value).filter((v) => v !== "active" && v !== "all");

function stateMatches(state) {
  if (filters.state === "active") return filters.active.includes(state);
  // "all", or a value the server does not know, shows every state.
  return oneStates.includes(filters.state) ? state === filters.state : true;
}

/** The server's filter, in the browser: state, tenant, and q as a name
 * substring or, when it is a number, the job's id. */
function matches(job) {
  // Another tenant's job arrives without a name: this user's list never shows it.
  if (job.name === null || job.name === undefined) return false;
  if (!stateMatches(job.state)) return false;
  if (filters.tenant && job.tenant !== filters.tenant) return false;
  const q = filters.q;
  if (q && !job.name.toLowerCase().includes(q.toLowerCase()) && !(/^\d+$/.test(q) && Number(q) === job.id)) return false;
  return true;
}

function updateRow(tr, job) {
  const badge = tr.querySelector("[data-job-state]");
  badge.textContent = job.state;
  badge.className = `badge ${job.state}`;
  // A redacted event carries no reason; keep what the server rendered.
  if (job.state_reason !== undefined) tr.querySelector("[data-testid=job-reason]").textContent = job.state_reason || "";
  tr.dataset.state = job.state;
  const cancel = tr.querySelector("[data-cancel-job]");
  if (cancel) cancel.hidden = finished.includes(job.state);
  tr.classList.toggle("stale", !stateMatches(job.state));
  // Restart the highlight when two events come close together.
  tr.classList.remove("flash");
  void tr.offsetWidth;
  tr.classList.add("flash");
}

function showBanner() {
  const n = [...matching.values()].filter(Boolean).length;
  banner.dataset.count = n;
  banner.hidden = n === 0 && !reconnected;
  // After a reconnect the count may be short (events were lost): say so instead.
  banner.querySelector("[data-testid=new-jobs-text]").textContent = reconnected
    ? "Reconnected: the list may have changed —"
    : n === 1 ? "1 new job matches —" : `${n} new jobs match —`;
}

function onJob(event) {
  const job = event.job;
  const tr = table.querySelector(`tr[data-job-id="${job.id}"]`);
  if (tr) updateRow(tr, job);
  else if (job.id > oldestShown) { matching.set(job.id, matches(job)); showBanner(); }
  applied++;
}

const live = startLive([]);
live.on("job", onJob);
// Events sent while the socket was down are lost: after a reconnect the rows may
// be stale, so offer the reload.
live.on("hello", () => {
  if (++hellos > 1) { reconnected = true; showBanner(); }
});
// The API's answer to a cancel, shown at once (its job event follows).
cancelButtons(table, (job) => {
  const tr = table.querySelector(`tr[data-job-id="${job.id}"]`);
  if (tr) updateRow(tr, job);
});
banner.querySelector("a").addEventListener("click", (e) => { e.preventDefault(); location.reload(); });
Object.defineProperty(window.rackwise, "jobsApplied", { get: () => applied });
live.start().then(() => { document.body.dataset.ready = "1"; });
