// The job submission form (submitters and operators). Everything is the API's:
//
// 1. As fields change (debounced) and on "Check", the form's values go to
//    POST /api/jobs/what-if/, which validates them as a submission would and
//    answers what would happen now; its one-line summary is shown.
// 2. Submit posts the same values to POST /api/jobs/ (with an Idempotency-Key
//    made once per page, so a retry after a lost answer cannot queue a second
//    job) and opens the new job's page.
// 3. A 400's messages are shown exactly as the API gives them, each next to its
//    field (nested ones by path, "slurm.script"); a message for a field the form
//    does not show, and non-field errors, go to the top. An automatic check does
//    not mark fields the user has not touched yet; "Check" and Submit mark all.
// 4. Only the newest request's answer is shown, so a slow check cannot
//    overwrite a later one or a submission's errors.
//
// Tests wait on [data-testid=what-if][data-state] (idle, checking, answered,
// refused) and read the [data-field-error] slots.

import { api, errorPaths, showFieldErrors } from "./live.js";

const form = document.querySelector("[data-testid=submit-form]");
const panel = form.querySelector("[data-testid=what-if]");
const summary = panel.querySelector("[data-testid=what-if-summary]");
const reason = panel.querySelector("[data-testid=what-if-reason]");
const submit = form.querySelector("[data-testid=submit]");
const CHECK_AFTER_MS = 400;
const newKey = () => globalThis.crypto?.randomUUID?.() ?? `${Date.now()}-${Math.random().toString(36).slice(2)}`;
let key = newKey();
const touched = new Set(); // error slots next to fields the user has changed
let asked = 0; // requests made; only the newest one's answer is shown
let timer = null;

const shape = () => form.elements.shape.value;
const value = (name) => form.elements[name]?.value.trim() ?? "";

/** The request body: the fields that have a value, as typed (the API parses
 * and bounds them, so its message is about what the user wrote). */
function body() {
  const data = { name: value("name"), locality: value("locality"), preemptible: form.elements.preemptible.checked };
  const fields = ["tenant", "priority", "expected_duration_s",
    ...(shape() === "gpus" ? ["num_gpus"] : ["num_nodes", "gpus_per_node", "segment_nodes"])];
  for (const name of fields) if (value(name) !== "") data[name] = value(name);
  if (form.elements.script) {
    // Sent as written (leading spaces matter in a script); empty: the API says what it needs.
    const script = form.elements.script.value;
    data.slurm = script.trim() ? { script } : {};
  }
  return data;
}

/** The error's messages next to their fields; an automatic check (``all``
 * false) leaves fields the user has not touched unmarked. */
const showErrors = (err, { all }) => showFieldErrors(form, err, { skip: (slot) => !all && !touched.has(slot) });

function showAnswer(state, text, why = "") {
  panel.dataset.state = state;
  summary.textContent = text;
  reason.textContent = why;
}

/** 1. What would happen now. ``all``: mark every field the API refuses. */
async function check({ all = false } = {}) {
  clearTimeout(timer);
  const mine = ++asked;
  panel.dataset.state = "checking";
  let answer;
  try {
    answer = await api("/api/jobs/what-if/", { method: "POST", body: body() });
  } catch (err) {
    if (mine !== asked) return;
    if (err.status === 400 && err.data && typeof err.data === "object") {
      const shown = showErrors(err, { all });
      // A refusal about a field the user has not touched (a 40-node required job
      // is refused on locality) is still the answer: shown here, unless it is
      // about a field still empty (not filled in yet, not refused).
      const empty = (path) => { const input = form.elements.namedItem(path); return !input || input.value === ""; };
      const unmarked = all ? [] : errorPaths(err.data)
        .filter(([path]) => !touched.has(form.querySelector(`[data-field-error~="${CSS.escape(path)}"]`)))
        .filter(([path]) => path === "non_field_errors" || !empty(path))
        .flatMap(([, texts]) => texts)
        .filter((text) => text !== "This field is required.");
      if (unmarked.length) showAnswer("refused", `would be refused: ${unmarked.join(" ")}`);
      else showAnswer("refused", shown ? "not checked: the API refused the values marked." : "fill in the form to see what would happen.");
    } else {
      showFieldErrors(form, null);
      showAnswer("refused", `not checked: ${err.message}`);
    }
    return;
  }
  if (mine !== asked) return;
  showFieldErrors(form, null);
  showAnswer("answered", answer.summary, answer.reason && answer.reason !== answer.summary ? `(${answer.reason})` : "");
}

function checkSoon() {
  clearTimeout(timer);
  timer = setTimeout(() => check().catch(() => {}), CHECK_AFTER_MS);
}

/** The expected duration in words beside the seconds. */
function durationWords() {
  const s = Number(value("expected_duration_s"));
  const words = form.querySelector("[data-testid=duration-words]");
  words.textContent = Number.isFinite(s) && s >= 60
    ? `about ${s >= 3600 ? `${Math.round(s / 360) / 10} h` : `${Math.round(s / 60)} min`}` : "";
}

function showShape() {
  for (const el of form.querySelectorAll("[data-shape]")) el.hidden = el.dataset.shape !== shape();
}

form.addEventListener("input", (e) => {
  const slot = e.target.closest(".field")?.querySelector("[data-field-error]");
  if (slot) touched.add(slot);
  if (e.target.name === "shape") showShape();
  if (e.target.name === "expected_duration_s") durationWords();
  checkSoon();
});
form.querySelector("[data-testid=what-if-check]").addEventListener("click", () => check({ all: true }).catch(() => {}));

// 2. Submit, and open the job.
form.addEventListener("submit", async (e) => {
  e.preventDefault();
  clearTimeout(timer);
  const mine = ++asked; // drops any check in flight
  submit.disabled = true;
  try {
    const job = await api("/api/jobs/", { method: "POST", body: { ...body(), idempotency_key: key } });
    location.assign(`/jobs/${job.id}/`);
  } catch (err) {
    if (mine !== asked) return;
    showErrors(err, { all: true });
    showAnswer("refused", "not submitted: see the messages by the fields.");
    submit.disabled = false;
  }
});

// Back from the new job's page: this is a new submission.
addEventListener("pageshow", (e) => {
  if (!e.persisted) return;
  key = newKey();
  submit.disabled = false;
});

showShape();
durationWords();
document.body.dataset.ready = "1";
