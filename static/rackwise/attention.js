// What needs a person: the nav badge ("N awaiting approval · oldest 32 min"),
// the Fleet page's banner and its attention totals, from GET /api/attention/.
// Refreshed when the live feed reports an action or a job (live.js dispatches
// them on the document) and once a minute, so the ages keep counting.

import { api } from "./live.js";

const REFRESH_MS = 60000;
let pending = null;

function render(data) {
  const a = data.awaiting_approval;
  const badge = document.querySelector("[data-testid=nav-badge]");
  if (badge) {
    badge.dataset.count = a.count;
    badge.hidden = !a.count;
    badge.textContent = a.count ? `${a.count} awaiting approval · oldest ${a.oldest_age}` : "";
  }
  const banner = document.querySelector("[data-testid=attention-banner]");
  if (banner) {
    banner.hidden = !data.items.length;
    const list = banner.querySelector("ul");
    list.replaceChildren(...data.items.map((item) => {
      const li = document.createElement("li");
      li.dataset.attention = item.key;
      const link = document.createElement("a");
      link.href = item.url;
      link.textContent = item.text;
      li.append(link);
      return li;
    }));
  }
  const totals = { approval: a.count, recovering: data.jobs_recovering, waiting: data.jobs_waiting_long, ...Object.fromEntries(Object.entries(data.nodes).map(([k, v]) => [`nodes_${k}`, v])) };
  for (const [key, value] of Object.entries(totals)) {
    for (const el of document.querySelectorAll(`[data-attention-total="${key}"]`)) el.textContent = value;
  }
  document.body.dataset.attention = a.count;
}

export async function refresh() {
  try {
    render(await api("/api/attention/"));
  } catch (err) {
    // The badge keeps its last figures; the next event or minute tries again.
  }
}

/** Coalesce a burst of events (a placement pass proposes many) into one request. */
function soon() {
  if (pending) return;
  pending = setTimeout(() => { pending = null; refresh(); }, 300);
}

document.addEventListener("rackwise:action", soon);
document.addEventListener("rackwise:job", soon);
setInterval(refresh, REFRESH_MS);
