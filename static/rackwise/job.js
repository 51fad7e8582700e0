// The job page, live: its state and reason from the feed's job events, and one
// grid per rack the job holds now (racks.js draws them).
//
// Which racks it holds is read from rack events, each carrying the rack's whole
// state: a rack not on the page whose jobs include this one gets a section; a
// rack on the page that no longer holds it loses its section. Rack events can be
// lost, so on a reconnect and when the job starts holding GPUs the page asks the
// API where the job is, and looks at every rack once if that names one it lacks.
//
// The "Hand to the cluster" panel is re-read from the export API whenever the
// job's racks or state change, so it never shows nodes the job has left.
//
// The times (submitted, started, run time, expected end, waited) are drawn
// from the job's timestamps and tick while it waits or runs; the timestamps are
// re-read from the API when the state changes. The open actions that hold the
// job ("waiting on action #N since ...") are re-read when an action event names
// the job, and on a reconnect. Cancel (for those the server says may) goes
// through the API (cancel.js).
//
// Tests read the [data-live-rack] sections (data-rack-id, data-version),
// [data-testid=no-racks], the badge's text, the export panel's texts,
// [data-time] cells and [data-testid=held-by].

import { cancelButtons } from "./cancel.js";
import { api } from "./live.js";
import { live } from "./racks.js";
import { when } from "./time.js";

const HOLDING = ["placed", "running", "recovering"];
const box = document.querySelector("[data-live-job]");
const jobId = Number(box.dataset.liveJob);
const badge = document.querySelector("[data-testid=job-state]");
let state = badge.textContent.trim();
let jobEvents = 0; // this job's events so far

const sections = () => [...box.querySelectorAll("[data-live-rack]")];
const holds = (rack) => String(jobId) in rack.jobs;

function showEmpty() {
  document.querySelector("[data-testid=no-racks]").hidden = sections().length > 0;
  refreshExport();
}

const exportPanel = document.querySelector("[data-testid=export-panel]");
const exportPart = (id) => exportPanel.querySelector(`[data-testid=${id}]`);
let exportTimer = null;
let exportAsked = 0; // requests made; only the newest answer is shown

/** Re-read the export soon (changes come in bursts: one request per burst). */
function refreshExport() {
  clearTimeout(exportTimer);
  exportTimer = setTimeout(async () => {
    const asked = ++exportAsked;
    let data = null;
    try {
      data = await api(`/api/jobs/${jobId}/export/`);
    } catch (e) {
      if (e.status !== 409) return; // a network blip: keep what is shown
    }
    if (asked !== exportAsked) return;
    exportPanel.hidden = data === null; // 409: the job holds no placement now
    if (data === null) return;
    const k8s = data.kubernetes;
    exportPart("export-slurm").textContent = data.slurm.sbatch;
    exportPart("export-kueue").textContent = Object.entries(k8s.annotations).map(([k, v]) => `${k}: "${v}"\n`).join("");
    exportPart("export-kueue-box").hidden = Object.keys(k8s.annotations).length === 0;
    exportPart("export-notes").replaceChildren(...k8s.notes.map((note) => Object.assign(document.createElement("p"), { className: "muted", textContent: note })));
    exportPart("export-kubernetes").textContent = k8s.manifest_yaml;
  }, 300);
}

const timesBox = document.querySelector("[data-testid=job-times]");
const FINISHED = timesBox.dataset.finishedStates.split(" ");
const ms = (iso) => (iso ? Date.parse(iso) : null);
// The server's clock less this browser's: durations agree with the server's.
const skew = ms(timesBox.dataset.now) - Date.now();
const times = {
  submitted: ms(timesBox.dataset.submitted),
  started: ms(timesBox.dataset.started),
  finished: ms(timesBox.dataset.finished),
  expectedS: Number(timesBox.dataset.expectedS) || null,
};
// In the viewer's zone, named, as the server-written times become (time.js).
const stamp = (t) => when(t, { seconds: true });

/** A duration in words: the rule of fleet.views.span_text. */
function spanText(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  let m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  let h = Math.floor(m / 60);
  m %= 60;
  if (h < 24) return m ? `${h} h ${m} min` : `${h} h`;
  const d = Math.floor(h / 24);
  h %= 24;
  return h ? `${d} d ${h} h` : `${d} d`;
}

/** The times as fleet.views.job_times computes them. */
function showTimes() {
  const now = Date.now() + skew;
  const { submitted, started, finished, expectedS } = times;
  const cell = (name) => timesBox.querySelector(`[data-time="${name}"]`);
  cell("submitted").textContent = stamp(submitted);
  cell("started").textContent = started ? stamp(started) : "not yet";
  cell("run").textContent = started ? spanText(((finished ?? now) - started) / 1000) : "–";
  cell("expected-end").textContent = !expectedS ? "no expected duration"
    : started ? stamp(started + expectedS * 1000) : `${spanText(expectedS)} after it starts`;
  cell("waited").textContent = spanText(((started ?? finished ?? now) - submitted) / 1000);
}

function setTimes(job) {
  Object.assign(times, {
    submitted: ms(job.submitted_at), started: ms(job.started_at), finished: ms(job.finished_at),
    expectedS: job.expected_duration_s || null,
  });
  showTimes();
}

let timesTimer = null;
/** Re-read the timestamps soon (one request per burst of events). */
function refreshTimes() {
  clearTimeout(timesTimer);
  timesTimer = setTimeout(() => api(`/api/jobs/${jobId}/`).then(setTimes, () => {}), 300);
}

const heldBy = document.querySelector("[data-testid=held-by]");
const heldUrl = `/api/actions/?job=${jobId}&${heldBy.dataset.openStates.split(" ").map((st) => `state=${st}`).join("&")}`;
let heldTimer = null;

function heldItem(a) {
  const li = document.createElement("li");
  li.dataset.actionId = a.id;
  const link = Object.assign(document.createElement("a"), { href: `${heldBy.dataset.actionsUrl}?state=all#action-${a.id}`, textContent: `action #${a.id}` });
  li.append("waiting on ", link, ` (${a.kind}, ${a.state}) since ${stamp(ms(a.created_at))}`);
  return li;
}

/** Re-read the open actions that hold the job, oldest first, as the server lists them. */
function refreshHeldBy() {
  clearTimeout(heldTimer);
  heldTimer = setTimeout(async () => {
    const page = await api(heldUrl).catch(() => null);
    if (!page) return;
    const open = page.results.sort((a, b) => ms(a.created_at) - ms(b.created_at));
    heldBy.replaceChildren(...open.map(heldItem));
    heldBy.hidden = open.length === 0;
  }, 300);
}

const cancelButton = document.querySelector("[data-testid=job-cancel]");

/** A section for a rack the job now holds, in rack id order like the server's. */
function addRack(rack) {
  const el = document.createElement("section");
  Object.assign(el.dataset, { rackId: rack.rack, rackName: rack.name, version: -1, highlightJob: jobId, cell: 16 });
  el.setAttribute("data-live-rack", "");
  el.innerHTML = `<h3 class="rack-title"><a href="/racks/${Number(rack.rack)}/" data-testid="job-rack-name"></a></h3><div class="grid" tabindex="0"></div>`;
  el.querySelector("a").textContent = rack.name;
  el.querySelector(".grid").setAttribute("aria-label", `GPU grid of rack ${rack.name}`);
  box.insertBefore(el, sections().find((s) => Number(s.dataset.rackId) > rack.rack) || null);
  showEmpty();
  live.follow(rack.rack);
  // Now followed: applied and painted by racks.js. An event is the rack's whole
  // state, so a jump from the version seen before it was followed is no gap.
  live.apply(rack, true);
}

function removeRack(rackId) {
  for (const el of sections()) if (Number(el.dataset.rackId) === rackId) el.remove();
  live.unfollow(rackId);
  showEmpty();
}

live.on("other", (rack) => { if (holds(rack)) addRack(rack); });
live.on("rack", (rack) => { if (!holds(rack)) removeRack(rack.rack); });

/** State and reason; the badge itself is kept by racks.js for every page. */
function showJob(job) {
  const was = state;
  state = job.state;
  badge.textContent = job.state;
  badge.className = `badge ${job.state}`;
  const waiting = document.querySelector("[data-testid=waiting]");
  const reason = document.querySelector("[data-testid=state-reason]");
  const words = job.state_reason || "";
  if (job.state === "pending") {
    // The server's words name the fleet's largest free slice, which the page
    // cannot recompute: keep them while the job waits for the same reason.
    const text = waiting.querySelector("[data-testid=waiting-text]");
    if (waiting.hidden || was !== "pending" || !text.textContent.includes(words)) text.textContent = words || "for room";
    waiting.hidden = false;
    reason.hidden = true;
  } else {
    waiting.hidden = true;
    reason.textContent = words;
    reason.hidden = !words;
  }
  if (HOLDING.includes(job.state) && !HOLDING.includes(was)) resync().catch(() => {});
  if (job.state !== was) refreshExport();
  if (cancelButton) cancelButton.hidden = FINISHED.includes(job.state);
  // The API's job carries the timestamps; an event does not.
  if ("submitted_at" in job) setTimes(job);
  else if (job.state !== was) refreshTimes();
}

/** Where the API says the job is; a rack the page lacks means lost rack events,
 * so look at every rack once (the "other" listener picks out the job's). */
async function resync({ withState = false } = {}) {
  const seen = jobEvents;
  const job = await api(`/api/jobs/${jobId}/`);
  // A job event that came in meanwhile may be newer than this answer: it wins.
  if (withState && jobEvents === seen) showJob(job);
  const shown = new Set(sections().map((el) => el.dataset.rackName));
  if (job.allocated.some((a) => !shown.has(a.rack))) await live.snapshot(null);
}

live.on("job", (event) => {
  if (event.job.id !== jobId) return;
  jobEvents++;
  showJob(event.job);
});
live.on("action", (event) => {
  if (String(jobId) in (event.action.job_tenants || {})) refreshHeldBy();
});
// The first open may come after a change made since the page was rendered; a
// reconnect, after lost events.
live.on("hello", () => {
  resync({ withState: true }).catch(() => {});
  refreshHeldBy();
});
if (cancelButton) cancelButtons(cancelButton.parentElement, showJob);
showTimes();
setInterval(showTimes, 10000);
