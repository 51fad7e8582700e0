// The Tenants page (operators): edit a tenant's quotas per node shape, and its
// fair-share weight and cohort. Everything goes through /api/tenants/ with the
// session and CSRF token (live.js api()), so the service's checks and audit
// apply as for any client; viewers and submitters get no forms and no script.
//
// 1. Quotas are one PUT of the whole list (the API replaces them): a shape with
//    any field filled in is sent, a blank limit as null (none). A blank nominal
//    quota with a limit is sent as null too, and the API's message says why.
// 2. The API names a quota field by its place in the list it was sent
//    ("quotas[1].nominal_gpus"). Before sending, each row's message slots are
//    named by the place that row takes, so every message lands next to its field.
//    Reserved racks are sent with the quotas (the API checks them together).
// 3. After a save every tenant's figures are redrawn from the page itself (the
//    server renders the bars: one renderer), since a weight or cohort changes
//    the others' shares too. article[data-saved] counts the saves, for tests.

import { api, showFieldErrors } from "./live.js";

const FIELDS = ["nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"];

function value(input) {
  // A number input holding text reads as "": send something the API refuses by name.
  if (input.validity.badInput) return "not a number";
  const raw = input.value.trim();
  if (raw === "") return null;
  const n = Number(raw);
  return Number.isFinite(n) ? n : raw;
}

function quotaBody(form) {
  const quotas = [];
  for (const row of form.querySelectorAll("tr[data-shape]")) {
    const inputs = FIELDS.map((f) => row.querySelector(`input[name=${f}]`));
    const filled = inputs.some((i) => i.value.trim() !== "" || i.validity.badInput);
    const at = quotas.length;
    for (const input of inputs) {
      const slot = input.parentElement.querySelector("[data-field-error]");
      slot.dataset.fieldError = filled ? `quotas[${at}].${input.name}` : "";
    }
    if (!filled) continue;
    const quota = { gpus_per_node: Number(row.dataset.shape) };
    for (const input of inputs) quota[input.name] = value(input);
    quotas.push(quota);
  }
  // Reserved racks: names, comma- or space-separated; the API names a bad one by its place.
  const racks = form.elements.reserved_racks;
  const reserved_racks = racks.value.split(/[\s,]+/).filter(Boolean);
  racks.parentElement.parentElement.querySelector("[data-field-error]").dataset.fieldError = [
    "reserved_racks",
    ...reserved_racks.map((_, i) => `reserved_racks[${i}]`),
  ].join(" ");
  return { quotas, reserved_racks };
}

function shareBody(form) {
  return { weight: value(form.elements.weight), cohort: form.elements.cohort.value.trim() };
}

async function redraw() {
  const res = await fetch(location.pathname, { credentials: "same-origin", headers: { Accept: "text/html" } });
  if (!res.ok) return;
  const doc = new DOMParser().parseFromString(await res.text(), "text/html");
  for (const article of document.querySelectorAll("article[data-tenant]")) {
    const fresh = doc.querySelector(`article[data-tenant="${CSS.escape(article.dataset.tenant)}"] [data-part=figures]`);
    if (fresh) article.querySelector("[data-part=figures]").replaceWith(document.importNode(fresh, true));
  }
}

document.addEventListener("submit", async (e) => {
  const form = e.target.closest("form[data-testid=quota-form], form[data-testid=share-form]");
  if (!form) return;
  e.preventDefault();
  const article = form.closest("article[data-tenant]");
  const name = encodeURIComponent(article.dataset.tenant);
  const quota = form.dataset.testid === "quota-form";
  const body = quota ? quotaBody(form) : shareBody(form);
  showFieldErrors(form, null);
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    await api(quota ? `/api/tenants/${name}/quotas/` : `/api/tenants/${name}/`, { method: quota ? "PUT" : "PATCH", body });
    await redraw();
    article.dataset.saved = String(Number(article.dataset.saved || 0) + 1);
  } catch (err) {
    showFieldErrors(form, err);
    article.dataset.failed = String(Number(article.dataset.failed || 0) + 1);
  } finally {
    button.disabled = false;
  }
});
document.body.dataset.ready = "1";
