// The Webhooks page (operators): register an endpoint, and per endpoint send a
// test ping, rotate its secret, (de)activate or delete it, and redeliver dead
// deliveries. Everything goes through /api/webhooks/ with the session and CSRF
// token (live.js api()), so the server's checks and audit apply as for any client.
//
// 1. The cards are drawn here only: from the page's JSON (the API's serializers)
//    at load, then from the API after every action, so there is one renderer.
// 2. A signing secret is in the answer to a create or a rotation only: it is
//    shown once in a marked box and never stored anywhere else by the page.
// 3. While an endpoint has deliveries about to be attempted (pending, or a retry
//    due within a minute), its history is re-fetched with a growing interval,
//    so a test ping is seen going from pending to succeeded or retrying.
//
// Tests wait on body[data-ready] and the data-state of each delivery row.

import { api, showFieldErrors } from "./live.js";
import { when } from "./time.js";

const list = document.querySelector("[data-testid=webhooks]");
const empty = document.querySelector("[data-testid=no-webhooks]");
const form = document.querySelector("[data-testid=register-form]");
const ROWS = Number(list.dataset.deliveryRows || 10);
const OPEN = ["pending", "retrying"];
const POLL_FIRST_MS = 1000, POLL_MAX_MS = 5000, POLL_FOR_MS = 120000, DUE_SOON_MS = 60000;
const polls = new Map(); // endpoint id -> { timer, delay, until }

const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
// The API gives ISO times in the server's zone (UTC): show them as the other pages do.
const day = (iso) => when(iso);
const stamp = (iso) => when(iso, { seconds: true });
const clock = (iso) => (iso ? iso.slice(11, 19) : "");
// Delivery states in the badge colours the rest of the console uses.
const BADGE = { dead: "dead failed", retrying: "retrying pending" };

/** Every message in a DRF error body (lists, nested objects, strings). */
function deliveryRows(deliveries) {
  if (!deliveries.length) return `<tr><td colspan="10" class="muted">No deliveries yet.</td></tr>`;
  return deliveries.map((d) => `<tr data-testid="delivery-row" data-delivery-id="${d.id}" data-state="${esc(d.state)}" data-event="${esc(d.event_type)}">
    <td>#${d.id}</td><td>${esc(d.event_type)}</td>
    <td><span class="badge ${BADGE[d.state] || esc(d.state)}" data-testid="delivery-state">${esc(d.state)}</span></td>
    <td>${d.attempts}</td><td>${d.last_status_code ?? "–"}</td>
    <td>${d.last_duration_ms != null ? `${d.last_duration_ms} ms` : "–"}</td>
    <td>${esc(stamp(d.created_at))}</td>
    <td>${esc(clock(d.delivered_at || d.next_attempt_at))}</td>
    <td class="muted">${esc(d.last_error.length > 120 ? `${d.last_error.slice(0, 119)}…` : d.last_error)}</td>
    <td>${d.state === "dead" ? `<button type="button" data-op="redeliver" data-delivery-id="${d.id}" data-testid="redeliver">Redeliver</button>` : ""}</td>
  </tr>`).join("");
}

function head(e) {
  const by = e.created_by ? ` by ${esc(e.created_by)}` : "";
  return `<h2>#${e.id} <code data-testid="webhook-url">${esc(e.url)}</code>
      <span class="badge ${e.active ? "succeeded" : ""}" data-testid="webhook-active">${e.active ? "active" : "inactive"}</span></h2>
    <p class="muted">${e.description ? `${esc(e.description)} · ` : ""}events: ${e.event_types.map(esc).join(", ")} · created ${esc(day(e.created_at))}${by}</p>
    <div class="webhook-buttons">
      <button type="button" data-op="test" data-testid="webhook-test" ${e.active ? "" : 'disabled title="Activate the endpoint before testing it"'}>Send test ping</button>
      <button type="button" data-op="rotate" data-testid="webhook-rotate">Rotate secret</button>
      <button type="button" data-op="toggle" data-testid="webhook-toggle">${e.active ? "Deactivate" : "Activate"}</button>
      <button type="button" data-op="delete" class="reject" data-testid="webhook-delete">Delete</button>
      <span class="error" data-testid="webhook-error" aria-live="polite"></span>
    </div>`;
}

function card(e) {
  const el = document.createElement("article");
  el.className = "action webhook";
  el.dataset.testid = "webhook";
  el.dataset.webhookId = e.id;
  el.innerHTML = `<div data-part="head"></div><div data-testid="webhook-secret"></div>
    <table class="list" data-testid="webhook-deliveries">
      <thead><tr><th>Delivery</th><th>Event</th><th>State</th><th>Attempts</th><th>HTTP</th><th>Took</th><th>Created</th><th>Next attempt / delivered</th><th>Last error</th><th></th></tr></thead>
      <tbody></tbody>
    </table>`;
  return el;
}

const cardOf = (id) => list.querySelector(`article[data-webhook-id="${id}"]`);

function showEndpoint(e) {
  let el = cardOf(e.id);
  if (!el) { el = card(e); list.append(el); }
  el.dataset.active = e.active ? "1" : "0";
  el.querySelector("[data-part=head]").innerHTML = head(e);
  empty.hidden = true;
  return el;
}

function showDeliveries(id, deliveries) {
  const el = cardOf(id);
  if (!el) return;
  el.querySelector("tbody").innerHTML = deliveryRows(deliveries);
  schedulePoll(id, deliveries);
}

/** A secret in a box of its own, with the warning; Done removes it for good.
 * An earlier secret of the same endpoint no longer works: it goes. */
function showSecret(box, endpoint, what) {
  for (const old of document.querySelectorAll(`[data-secret-of="${endpoint.id}"]`)) old.remove();
  box.innerHTML = `<div class="secret-once" data-testid="secret-once" data-secret-of="${endpoint.id}" role="alert">
    <p><b>${what} of #${endpoint.id}: copy it now; it will not be shown again.</b>
      Receivers verify <code>X-Rackwise-Signature</code> with it.</p>
    <code class="secret" data-testid="secret">${esc(endpoint.secret)}</code>
    <button type="button" data-op="copy" data-testid="secret-copy">Copy</button>
    <button type="button" data-op="dismiss" data-testid="secret-dismiss">Done</button>
  </div>`;
}

async function refresh(id) {
  const page = await api(`/api/webhooks/${id}/deliveries/?limit=${ROWS}`);
  showDeliveries(id, page.results);
}

function schedulePoll(id, deliveries) {
  const now = Date.now();
  const busy = deliveries.some((d) => d.state === "pending"
    || (d.state === "retrying" && Date.parse(d.next_attempt_at) - now < DUE_SOON_MS));
  const poll = polls.get(id);
  if (poll) clearTimeout(poll.timer);
  if (!busy || !cardOf(id) || (poll && now > poll.until)) { polls.delete(id); return; }
  const delay = poll ? Math.min(poll.delay * 1.5, POLL_MAX_MS) : POLL_FIRST_MS;
  const next = { delay, until: poll ? poll.until : now + POLL_FOR_MS };
  next.timer = setTimeout(() => refresh(id).catch(() => polls.delete(id)), delay);
  polls.set(id, next);
}

/** An action asks for a fresh look: start polling over from the first interval. */
function restartPoll(id) {
  const poll = polls.get(id);
  if (poll) clearTimeout(poll.timer);
  polls.delete(id);
}

async function act(op, el, button) {
  const id = el.dataset.webhookId;
  switch (op) {
    case "test":
      await api(`/api/webhooks/${id}/test/`, { method: "POST" });
      break;
    case "rotate": {
      if (!confirm(`Rotate the signing secret of webhook #${id}? The current secret stops working at once.`)) return;
      const rotated = await api(`/api/webhooks/${id}/rotate-secret/`, { method: "POST" });
      showEndpoint(rotated);
      showSecret(el.querySelector("[data-testid=webhook-secret]"), rotated, "New signing secret");
      break;
    }
    case "toggle":
      showEndpoint(await api(`/api/webhooks/${id}/`, { method: "PATCH", body: { active: el.dataset.active !== "1" } }));
      break;
    case "delete":
      if (!confirm(`Delete webhook #${id} and its delivery history?`)) return;
      await api(`/api/webhooks/${id}/`, { method: "DELETE" });
      restartPoll(id);
      el.remove();
      empty.hidden = list.children.length > 0;
      return;
    case "redeliver":
      await api(`/api/webhook-deliveries/${button.dataset.deliveryId}/redeliver/`, { method: "POST" });
      break;
    default:
      return;
  }
  restartPoll(id);
  await refresh(id);
}

list.addEventListener("click", async (e) => {
  const button = e.target.closest("button[data-op]");
  if (!button) return;
  const el = button.closest("[data-webhook-id]");
  if (button.dataset.op === "copy" || button.dataset.op === "dismiss") { secretButton(button); return; }
  const error = el.querySelector("[data-testid=webhook-error]");
  error.textContent = "";
  button.disabled = true;
  try {
    await act(button.dataset.op, el, button);
  } catch (err) {
    // The card may have been redrawn meanwhile: look the error slot up again.
    const slot = cardOf(el.dataset.webhookId)?.querySelector("[data-testid=webhook-error]");
    if (slot) slot.textContent = err.message;
  } finally {
    if (button.isConnected) button.disabled = false;
  }
});

function secretButton(button) {
  const box = button.closest("[data-testid=secret-once]");
  if (button.dataset.op === "dismiss") { box.remove(); return; }
  const code = box.querySelector("[data-testid=secret]");
  // The clipboard API needs a secure context (https or localhost); otherwise
  // select the secret so Ctrl-C copies it.
  const selectIt = () => { getSelection().selectAllChildren(code); button.textContent = "Selected: press Ctrl-C"; };
  if (navigator.clipboard) {
    navigator.clipboard.writeText(code.textContent).then(() => { button.textContent = "Copied"; }, selectIt);
  } else {
    selectIt();
  }
}

document.querySelector("[data-testid=register-secret]").addEventListener("click", (e) => {
  const button = e.target.closest("button[data-op]");
  if (button) secretButton(button);
});

form.addEventListener("submit", async (e) => {
  e.preventDefault();
  showFieldErrors(form, null);
  const submit = form.querySelector("[data-testid=register-submit]");
  const body = {
    url: form.elements.url.value.trim(),
    description: form.elements.description.value.trim(),
    event_types: [...form.querySelectorAll("input[name=event_types]:checked")].map((c) => c.value),
  };
  submit.disabled = true;
  try {
    const created = await api("/api/webhooks/", { method: "POST", body });
    showEndpoint(created);
    showDeliveries(created.id, []);
    showSecret(document.querySelector("[data-testid=register-secret]"), created, "Signing secret");
    form.reset();
  } catch (err) {
    showFieldErrors(form, err);
  } finally {
    submit.disabled = false;
  }
});

for (const e of JSON.parse(document.getElementById("webhooks-data").textContent)) {
  showEndpoint(e);
  showDeliveries(e.id, e.deliveries);
}
document.body.dataset.ready = "1";
