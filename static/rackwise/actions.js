// The approval queue: each plan as before/after grids of the racks it touches,
// Approve/Reject for operators (the server refuses everyone else anyway), and a
// live progress bar and step log while it executes.

import { attachClicks, attachTooltip, cells, describeCell, rackSvg } from "./grid.js";
import { api, startLive } from "./live.js";

const live = startLive();
const plans = JSON.parse(document.getElementById("plans").textContent);
const touched = {}; // action id -> [rack ids], fixed at first paint
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
    ? `<figure class="grid" data-rack-id="${r}" data-side="${name.toLowerCase()}" data-version="${live.versions.get(r)}" data-testid="grid-${name.toLowerCase()}"><figcaption>${racks.get(r).name}</figcaption>${rackSvg(racks.get(r), { cell: 11 })}</figure>` : "").join("")}</div></div>`;
  if (["proposed", "approved"].includes(plan.state)) {
    box.innerHTML = side("Before", live.racks) + side("After", simulate(live.racks, plan.steps));
  } else {
    box.innerHTML = side("Now", live.racks);
  }
}

function paintAll() { for (const id of Object.keys(plans)) paint(id); }

async function refresh(id) {
  const a = await api(`/api/actions/${id}/`);
  show(a);
}

function show(a) {
  const el = document.querySelector(`[data-action-id="${a.id}"]`);
  if (!el) return;
  const was = el.dataset.state;
  el.dataset.state = a.state;
  el.querySelector("[data-testid=action-state]").textContent = a.state;
  el.querySelector("[data-testid=action-state]").className = `badge ${a.state}`;
  el.querySelector("[data-testid=progress]").value = a.progress;
  const total = Array.isArray(a.steps) ? a.steps.length : a.steps;
  el.querySelector("[data-testid=progress-text]").textContent = `${a.step_index} / ${total} steps`;
  const decide = el.querySelector(".decide");
  if (decide) decide.hidden = a.state !== "proposed";
  if (Array.isArray(a.steps)) {
    el.querySelector("[data-testid=steps]").innerHTML = a.steps.map((s) => `<li class="${s.done ? "done" : s.index === a.step_index && a.state === "executing" ? "current" : ""}">${s.text}</li>`).join("");
  }
  if (Array.isArray(a.log)) {
    el.querySelector("[data-testid=steplog]").innerHTML = a.log.map((l) => `<div>${(l.at || "").slice(11, 19)} ${l.message || ""}</div>`).join("");
  }
  if (plans[a.id]) plans[a.id].state = a.state;
  if (was !== a.state) paint(a.id);
}

live.on("action", (event) => {
  const a = event.action;
  if (!plans[a.id]) return;
  show(a);
  refresh(a.id).catch(() => {});
});
live.on("rack", (rack) => {
  for (const [id, ids] of Object.entries(touched)) if (ids.includes(rack.rack)) paint(id);
});

document.addEventListener("click", async (e) => {
  const button = e.target.closest("[data-decide]");
  if (!button) return;
  const el = button.closest("[data-action-id]");
  const id = el.dataset.actionId;
  const error = el.querySelector("[data-testid=decide-error]");
  error.textContent = "";
  button.disabled = true;
  try {
    show(await api(`/api/actions/${id}/${button.dataset.decide}/`, { method: "POST", body: { note: el.querySelector("[data-testid=note]").value } }));
  } catch (err) {
    error.textContent = err.message;
  } finally {
    button.disabled = false;
  }
});

const main = document.querySelector("main");
attachTooltip(main, (node, gpu) => {
  const rack = live.racks.get(live.nodeRack.get(node));
  const c = rack && cells(rack).find((x) => x.node === node && x.gpu === gpu);
  return c ? `${rack.name} · ${describeCell(rack, c)}` : "";
});
attachClicks(main, (node) => live.nodeRack.get(node));

Promise.all([live.start(), loadStepKinds()]).then(() => { paintAll(); document.body.dataset.ready = "1"; });
