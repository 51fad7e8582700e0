// Times in the viewer's zone with the zone named, and ages where a person scans.
// The server writes <time datetime="..." data-when> (UTC, named) and
// <time data-ago> (fleet/templatetags/rackwise_time.py); this module rewrites
// them on every page and keeps ages current. Other modules format with when()
// and ago() too, so every time on a page reads the same way.

const pad = (n) => String(n).padStart(2, "0");
const zoneName = (d) =>
  new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(d).find((p) => p.type === "timeZoneName")?.value ?? "";

/** "2026-12-05 03:12 CET" (with seconds: "03:12:40"), in the viewer's zone. */
export function when(t, { seconds = false } = {}) {
  if (t === null || t === undefined || t === "") return "";
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return "";
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}${seconds ? `:${pad(d.getSeconds())}` : ""}`;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time} ${zoneName(d)}`;
}

/** "just now", "12 min ago", "3 h ago", "2 d ago". */
export function ago(t, now = Date.now()) {
  const s = Math.max(0, Math.round((now - new Date(t).getTime()) / 1000));
  if (s < 45) return "just now";
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** Rewrite every server-written time under ``root``. */
export function localizeTimes(root = document) {
  for (const el of root.querySelectorAll("time[data-when]")) {
    el.textContent = when(el.dateTime, { seconds: "seconds" in el.dataset });
    el.title = `${el.dateTime} (UTC)`;
  }
  for (const el of root.querySelectorAll("time[data-ago]")) {
    el.textContent = ago(el.dateTime);
    el.title = when(el.dateTime, { seconds: true });
  }
}

localizeTimes();
setInterval(() => localizeTimes(), 30_000);
