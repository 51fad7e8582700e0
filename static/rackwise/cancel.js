// Cancel buttons for jobs (the job page, the jobs list): confirm, then
// POST /api/jobs/<id>/cancel/. The API decides who may (its 403 and 409
// messages are shown beside the button, in [data-testid=cancel-error]).

import { api } from "./live.js";

/** Handle clicks on every button[data-cancel-job] inside ``root``;
 * ``onCancelled(job)`` gets the API's answer (the job, now cancelled). */
export function cancelButtons(root, onCancelled) {
  root.addEventListener("click", async (e) => {
    const button = e.target.closest("button[data-cancel-job]");
    if (!button) return;
    const id = button.dataset.cancelJob;
    const slot = button.parentElement.querySelector("[data-testid=cancel-error]");
    if (!confirm(`Cancel job #${id} ${button.dataset.jobName || ""}? It stops, and its GPUs go back to the pool.`)) return;
    slot.textContent = "";
    button.disabled = true;
    try {
      onCancelled(await api(`/api/jobs/${id}/cancel/`, { method: "POST" }));
    } catch (err) {
      slot.textContent = err.message;
    } finally {
      button.disabled = false;
    }
  });
}
