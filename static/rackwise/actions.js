// The approval queue: each plan as before/after grids of the racks it touches,
// Approve/Reject for operators (the server refuses everyone else anyway), and a
// live progress bar and step log while it executes.

import { attachClicks, attachTooltip, cells, drawGrid } from "./grid.js";
import { api, messages, showFieldErrors, startLive } from "./live.js";

const live = startLive();
const plans = {}; // action id -> {steps, jobs, state, step_index}, from each card's data-plan
for (const el of document.querySelectorAll("[data-action-id][data-plan]")) plans[el.dataset.actionId] = JSON.parse(el.dataset.plan);
const touched = {}; // action id -> [rack ids], fixed at first paint
const filters = document.querySelector("[data-testid=action-filters]").dataset;
const decisions = document.querySelector("[data-testid=decisions]");
const OPEN = ["proposed", "approved", "executing"];
const escape = (text) => String(text ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
// op -> what a step of that kind does to the racks' picture, from the server's
// list of step kinds (GET /api/step-kinds/): allocate, swap, release, drain,
// undrain or none. Filled before the first paint.
let effects = new Map();

/** The step kinds the server knows, as op -> effect. */
export async function loadStepKinds() {
  const kinds = await api("/api/step-kinds/");
  effects = new Map(kinds.map((k) => [k.op, k.effect]));
  return effects;
}

/** The racks after the plan's steps, simulated on copies of the live racks;
 * ``kinds`` maps a step's op to its effect (default: the server's list). */
export function simulate(racks, steps, kinds = effects) {
  const copy = new Map([...racks].map(([id, r]) => [id, structuredClone(r)]));
  const nodeRack = new Map();
  for (const r of copy.values()) for (const n of r.nodes) nodeRack.set(String(n[0]), r);
  const clear = (job) => { for (const r of copy.values()) for (const n of r.nodes) for (const g of n[4]) if (g[1] === job) g[1] = null; };
  const nodeOf = (id) => { const r = nodeRack.get(String(id)); return r && r.nodes.find((x) => String(x[0]) === String(id)); };
  for (const step of steps) {
    const effect = kinds.get(step.op) || "none";
    if (effect === "allocate") {
      clear(step.job);
      for (const [node, gpus] of Object.entries(step.nodes || {})) {
        const r = nodeRack.get(node); if (!r) continue;
        const n = r.nodes.find((x) => String(x[0]) === node);
        for (const i of gpus) n[4][i][1] = step.job;
        r.jobs[String(step.job)] = r.jobs[String(step.job)] || { name: null, tenant: null, state: "placed" };
      }
    } else if (effect === "swap") {
      for (const [from, to] of Object.entries(step.swaps || {})) {
        const rf = nodeRack.get(String(from)), rt = nodeRack.get(String(to));
        if (!rf || !rt) continue;
        const nf = rf.nodes.find((x) => String(x[0]) === String(from)), nt = rt.nodes.find((x) => String(x[0]) === String(to));
        nf[4].forEach((g, i) => { if (g[1] === step.job) { g[1] = null; nt[4][i][1] = step.job; } });
      }
    } else if (effect === "release") {
      clear(step.job);
    } else if (effect === "drain") {
      // As the service does it: draining while jobs still run there, else drained.
      const n = nodeOf(step.node);
      if (n) n[3] = n[4].some((g) => g[1] !== null) ? "draining" : "drained";
    } else if (effect === "undrain") {
      const n = nodeOf(step.node);
      if (n) n[3] = "healthy";
    }
  }
  return copy;
}

function racksTouched(plan) {
  const ids = new Set();
  for (const step of plan.steps) {
    for (const node of Object.keys(step.nodes || {})) ids.add(live.nodeRack.get(Number(node)));
    for (const [a, b] of Object.entries(step.swaps || {})) { ids.add(live.nodeRack.get(Number(a))); ids.add(live.nodeRack.get(Number(b))); }
    if (step.node) ids.add(live.nodeRack.get(Number(step.node)));
  }
  const jobs = new Set(plan.jobs);
  for (const r of live.racks.values()) if (r.nodes.some((n) => n[4].some((g) => jobs.has(g[1])))) ids.add(r.rack);
  ids.delete(undefined);
  return [...ids].sort((a, b) => a - b);
}

function paint(id) {
  const el = document.querySelector(`[data-action-id="${id}"]`);
  const plan = plans[id];
  if (!el || !plan) return;
  if (!touched[id]) touched[id] = racksTouched(plan);
  const ids = touched[id];
  const box = el.querySelector("[data-testid=beforeafter]");
  const side = (name, racks) => `<div><h3>${name}</h3><div class="side">${ids.map((r) => racks.get(r)
    ? `<figure class="grid" data-rack-id="${r}" data-side="${name.toLowerCase()}" data-version="${live.versions.get(r)}" data-testid="grid-${name.toLowerCase()}"><figcaption>${escape(racks.get(r).name)}</figcaption></figure>` : "").join("")}</div></div>`;
  const draw = (name, racks, moved = () => null) => {
    for (const fig of box.querySelectorAll(`[data-side=${name}]`)) {
      const r = Number(fig.dataset.rackId);
      drawGrid(fig, racks.get(r), { cell: 11, moved: moved(r) });
    }
  };
  if (["proposed", "approved"].includes(plan.state)) {
    const after = simulate(live.racks, plan.steps);
    box.innerHTML = side("Before", live.racks) + side("After", after);
    draw("before", live.racks);
    draw("after", after, (r) => movedCells(live.racks.get(r), after.get(r)));
  } else if (plan.state === "executing") {
    // Where it is now, and where its remaining steps take the racks.
    const target = simulate(live.racks, plan.steps.slice(plan.step_index || 0));
    box.innerHTML = side("Now", live.racks) + side("Target", target);
    draw("now", live.racks);
    draw("target", target, (r) => movedCells(live.racks.get(r), target.get(r)));
  } else {
    box.innerHTML = side("Now", live.racks);
    draw("now", live.racks);
  }
  const now = el.querySelector("[data-testid=free-racks-now]");
  if (now) now.textContent = wholeFreeRacks();
}

/** The cells ("node:gpu") whose job the plan changes, outlined in the "after" grid. */
function movedCells(before, after) {
  const was = new Map(cells(before).map((c) => [`${c.node}:${c.gpu}`, c.job]));
  return new Set(cells(after).filter((c) => was.get(`${c.node}:${c.gpu}`) !== c.job).map((c) => `${c.node}:${c.gpu}`));
}

/** Racks whose healthy nodes are all idle, now (a defrag card's live figure). */
function wholeFreeRacks() {
  return [...live.racks.values()].filter((r) => r.nodes.every((n) => n[3] !== "healthy" || n[4].every((g) => g[1] === null))).length;
}

function paintAll() { for (const id of Object.keys(plans)) paint(id); }

async function refresh(id) {
  const a = await api(`/api/actions/${id}/`);
  show(a);
}

// States in which a plan ended without being carried out: its card says why
// (the event's ``error``, live) and never that it meets its target.
const ENDED_EARLY = ["expired", "rejected", "cancelled", "failed"];
const PREFIX = { expired: "Expired: ", failed: "Failed: " };

/** Why a card's plan ended, its target's outcome, its holds and what it cost,
 * from an action event (error, state) or the API (also holds, lost_gpu_hours). */
function showOutcome(el, a) {
  const error = el.querySelector("[data-testid=action-error]");
  if (error && a.error !== undefined) {
    error.textContent = a.error ? `${PREFIX[a.state] || ""}${a.error}` : "";
    error.hidden = !a.error;
  }
  const outcome = el.querySelector("[data-testid=target-outcome]");
  if (outcome && ENDED_EARLY.includes(a.state)) {
    outcome.innerHTML = `<span class="error" data-testid="target-not-met">not met: the plan ${escape(a.state)}</span>`;
  }
  const holds = el.querySelector("[data-testid=holds]");
  if (holds && Array.isArray(a.holds)) {
    holds.hidden = a.holds.length === 0;
    const racks = new Map();
    for (const h of a.holds) {
      const r = racks.get(h.rack_name) || { emptied: 0, filled: 0 };
      r[h.role === "fill" ? "filled" : "emptied"]++;
      racks.set(h.rack_name, r);
    }
    holds.querySelector("[data-testid=holds-list]").textContent = [...racks].sort(([x], [y]) => x.localeCompare(y))
      .map(([name, r]) => `${name}: ${[r.emptied ? `${r.emptied} it empties` : "", r.filled ? `${r.filled} it fills` : ""].filter(Boolean).join(", ")}`)
      .join("; ");
  }
  const lost = el.querySelector("[data-testid=lost]");
  if (lost && a.lost_gpu_hours !== undefined) {
    lost.hidden = a.lost_gpu_hours === null;
    if (a.lost_gpu_hours !== null) lost.querySelector("[data-testid=lost-gpu-hours]").textContent = Number(a.lost_gpu_hours).toFixed(1);
  }
}

/** An action's new state on its card or compact row (a row has no steps or log). */
function show(a) {
  const el = document.querySelector(`[data-action-id="${a.id}"]`);
  if (!el) return;
  const was = el.dataset.state;
  el.dataset.state = a.state;
  showOutcome(el, a);
  if (a.replaced_by && !el.dataset.replacedBy) replace(el, a.replaced_by).catch(() => {});
  const badge = el.querySelector("[data-testid=action-state]");
  badge.textContent = a.state;
  badge.className = `badge ${a.state}`;
  el.querySelector("[data-testid=progress]").value = a.progress;
  const total = Array.isArray(a.steps) ? a.steps.length : a.steps;
  el.querySelector("[data-testid=progress-text]").textContent = `${a.step_index} / ${total} steps`;
  const decide = el.querySelector(".decide");
  if (decide) decide.hidden = a.state !== "proposed";
  const steps = el.querySelector("[data-testid=steps]");
  if (steps && Array.isArray(a.steps)) {
    steps.innerHTML = a.steps.map((s) => `<li class="${s.done ? "done" : s.index === a.step_index && a.state === "executing" ? "current" : ""}">${escape(s.text)}</li>`).join("");
  }
  const steplog = el.querySelector("[data-testid=steplog]");
  if (steplog && Array.isArray(a.log)) {
    steplog.innerHTML = a.log.map((l) => `<div>${escape((l.at || "").slice(11, 19))} ${escape(l.message)}</div>`).join("");
  }
  const plan = plans[a.id];
  const moved = plan && plan.step_index !== a.step_index;
  if (plan) Object.assign(plan, { state: a.state, step_index: a.step_index });
  if (was !== a.state || (moved && a.state === "executing")) paint(a.id);
}

/** Whether the page's filters would list an action in this state and of this kind. */
function listed(a) {
  const state = filters.state || "open";
  const stateOk = state === "all" || (state === "open" ? OPEN.includes(a.state) : a.state === state);
  return stateOk && (!filters.kind || filters.kind === a.kind);
}

const adding = new Set();

/** The card of a plan that went stale gives way to the card of the plan made in
 * its place (same spot on the page), which says what changed and what it costs. */
async function replace(el, newId) {
  el.dataset.replacedBy = newId;
  const id = String(newId);
  if (document.querySelector(`[data-action-id="${id}"]`)) { el.remove(); counts(); return null; }
  const res = await fetch(`/actions/${id}/fragment/`, { credentials: "same-origin" });
  if (!res.ok) return null;
  const template = document.createElement("template");
  template.innerHTML = (await res.text()).trim();
  const card = template.content.firstElementChild;
  if (document.querySelector(`[data-action-id="${id}"]`)) { el.remove(); counts(); return null; }
  plans[id] = JSON.parse(card.dataset.plan);
  delete plans[el.dataset.actionId];
  delete touched[el.dataset.actionId];
  el.replaceWith(card);
  paint(id);
  counts();
  return card;
}

/** A new action the page lists: its card (or compact row) from the server, added on top. */
async function add(id) {
  if (adding.has(id)) return;
  adding.add(id);
  try {
    const res = await fetch(`/actions/${id}/fragment/`, { credentials: "same-origin" });
    if (!res.ok || document.querySelector(`[data-action-id="${id}"]`)) return;
    const template = document.createElement("template");
    template.innerHTML = (await res.text()).trim();
    const el = template.content.firstElementChild;
    if (res.headers.get("X-Rackwise-Compact") === "1") {
      document.querySelector("[data-testid=auto-actions] tbody").prepend(el);
    } else {
      plans[id] = JSON.parse(el.dataset.plan);
      document.querySelector("[data-testid=no-actions]")?.remove();
      // A plan made in place of a stale one takes that card's spot.
      const stale = el.dataset.replaces && document.querySelector(`[data-action-id="${el.dataset.replaces}"]`);
      if (stale) {
        stale.dataset.replacedBy = id;
        delete plans[stale.dataset.actionId];
        delete touched[stale.dataset.actionId];
        stale.replaceWith(el);
      } else {
        decisions.querySelector("h2").after(el);
      }
      paint(id);
    }
    counts();
  } finally {
    adding.delete(id);
  }
}

function counts() {
  document.querySelector("[data-testid=decisions-count]").textContent = decisions.querySelectorAll("article[data-action-id]").length;
  document.querySelector("[data-testid=automatic-count]").textContent = document.querySelectorAll("[data-testid=auto-action]").length;
}

live.on("action", (event) => {
  const a = event.action;
  if (!document.querySelector(`[data-action-id="${a.id}"]`)) {
    if (listed(a)) add(String(a.id)).catch(() => {});
    return;
  }
  show(a);
  if (plans[a.id]) refresh(a.id).catch(() => {});
});
live.on("rack", (rack) => {
  for (const [id, ids] of Object.entries(touched)) if (ids.includes(rack.rack)) paint(id);
});

/** The API's first message (its detail, or the first field's). */
const firstMessage = (err) => err.data?.detail || messages(err.data || {})[0] || err.message;

document.addEventListener("click", async (e) => {
  const button = e.target.closest("[data-decide]");
  if (!button) return;
  const el = button.closest("[data-action-id]");
  const id = el.dataset.actionId;
  const error = el.querySelector("[data-testid=decide-error]");
  error.textContent = "";
  // A costly approval takes a second click on the button, which says the cost.
  const limit = Number(decisions.dataset.confirmGpuHours);
  const cost = Number(el.dataset.cost);
  if (button.dataset.decide === "approve" && cost > limit && button.dataset.confirming !== "1") {
    button.dataset.confirming = "1";
    button.textContent = `Confirm: lose ${cost.toFixed(1)} GPU-hours`;
    return;
  }
  button.disabled = true;
  let replanned = null;
  try {
    show(await api(`/api/actions/${id}/${button.dataset.decide}/`, { method: "POST", body: { note: el.querySelector("[data-testid=note]").value } }));
  } catch (err) {
    if (err.status === 409 && err.data?.replanned && err.data.action) replanned = err.data;
    else error.textContent = firstMessage(err);
  } finally {
    button.disabled = false;
    if (button.dataset.confirming) { delete button.dataset.confirming; button.textContent = "Approve"; }
  }
  if (replanned) await confirmReplanned(el, replanned);
});

/** The plan went stale as it was approved and was made again: its card gives
 * way to the new plan's, whose Approve button asks to confirm the new cost (the
 * next click approves the new plan). */
async function confirmReplanned(el, answer) {
  const card = (await replace(el, answer.action.id)) || document.querySelector(`[data-action-id="${answer.action.id}"]`);
  if (!card) return;
  const note = card.querySelector("[data-testid=decide-error]");
  if (note) note.textContent = answer.detail;
  const approve = card.querySelector("[data-testid=approve]");
  if (approve) {
    approve.dataset.confirming = "1";
    approve.textContent = `Confirm the new plan: lose ${Number(answer.cost_gpu_hours).toFixed(1)} GPU-hours`;
  }
}

const defragForm = document.querySelector("[data-testid=defrag-form]");
defragForm?.addEventListener("submit", async (e) => {
  e.preventDefault();
  const result = defragForm.querySelector("[data-testid=defrag-result]");
  const body = {};
  for (const [name, value] of new FormData(defragForm)) if (value.trim() !== "") body[name] = Number(value);
  showFieldErrors(defragForm, null);
  result.textContent = "planning…";
  const button = defragForm.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const answer = await api("/api/actions/defrag/", { method: "POST", body });
    if (answer.proposed === false) {
      result.textContent = `No plan: ${answer.reason}`;
    } else {
      result.innerHTML = `Planned <a href="#action-${answer.id}">action #${answer.id}</a>: ${escape(answer.title)}. It waits below for approval.`;
      await add(String(answer.id));
      document.getElementById(`action-${answer.id}`)?.scrollIntoView({ block: "start" });
    }
  } catch (err) {
    result.textContent = "";
    showFieldErrors(defragForm, err);
  } finally {
    button.disabled = false;
  }
});

document.addEventListener("change", async (e) => {
  const select = e.target.closest("[data-policy-kind]");
  if (!select) return;
  const kind = select.dataset.policyKind;
  const status = document.querySelector(`[data-policy-status="${kind}"]`);
  status.className = "muted";
  status.textContent = "saving…";
  try {
    const policy = await api("/api/approval-policy/", { method: "PUT", body: { kind, mode: select.value } });
    select.value = policy[kind];
    status.textContent = "saved";
  } catch (err) {
    status.className = "error";
    status.textContent = firstMessage(err);
  }
});

const main = document.querySelector("main");
attachTooltip(main);
attachClicks(main);

Promise.all([live.start(), loadStepKinds()]).then(() => { paintAll(); document.body.dataset.ready = "1"; });

// The filters apply as soon as one changes (no inline handler: the page's
// Content-Security-Policy allows no inline script).
for (const select of document.querySelectorAll("[data-submit-on-change]")) {
  select.addEventListener("change", () => select.form.submit());
}
