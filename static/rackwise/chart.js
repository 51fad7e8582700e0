// The Fleet page's charts, small hand-written SVG read from
// /api/console/samples/: utilization and fragmentation (0..1), queue depth,
// and the pending jobs' wait p50/p95. Node failures and defrags are marked on
// each; hovering (or the arrow keys on a focused chart) shows the values at
// that moment.

import { api } from "./live.js";
import { when } from "./time.js";

const W = 640, H = 120, PAD = 34;

const pct = (v) => `${(v * 100).toFixed(0)}%`;
const count = (v) => `${Math.round(v)}`;
function duration(s) {
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(s < 36000 ? 1 : 0)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

const CHARTS = [
  { name: "use", title: "utilization and fragmentation", fixedMax: 1, format: pct,
    series: [["utilization", "util", "utilization"], ["fragmentation", "frag", "fragmentation"]] },
  { name: "queue", title: "queue depth", format: count, whole: true, series: [["jobs_pending", "queue", "pending jobs"]] },
  { name: "wait", title: "waits of pending jobs", format: duration, whole: true,
    series: [["wait_p50_s", "p50", "wait p50"], ["wait_p95_s", "p95", "wait p95"]] },
];

const esc = (text) => String(text ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

export async function drawChart(el, hours) {
  const { samples, markers = [] } = await api(`/api/console/samples/?hours=${hours}`);
  if (!samples.length) {
    el.innerHTML = `<p class="muted">No samples yet: the "fleet sample" task writes one a minute.</p>`;
    return;
  }
  const t = samples.map((s) => Date.parse(s.at));
  const t0 = Math.min(...t), t1 = Math.max(...t, t0 + 1);
  const x = (v) => PAD + ((v - t0) / (t1 - t0)) * (W - 2 * PAD);
  // The viewer's zone, named: "2026-12-05 14:05 EST", or "14:05 EST" within two days.
  const fmt = (ms) => (hours > 48 ? when(ms) : when(ms).slice(11));
  const shown = markers.filter((m) => Date.parse(m.at) >= t0 && Date.parse(m.at) <= t1);
  el.innerHTML = CHARTS.map((chart) => {
    const top = Math.max(1, ...samples.flatMap((s) => chart.series.map(([key]) => s[key] || 0)));
    // A whole-number axis tops at an even number, so its half-way line is whole
    // too: a top of 1 read "1, 1, 0" (0.5 rounded up).
    const max = chart.fixedMax || (chart.whole ? 2 * Math.ceil(top / 2) : top);
    // And no label repeats the one below it (durations round: 90 s and 120 s read "2 min").
    const ticks = [0, 0.5, 1].filter((f, i, all) => i === 0 || chart.format(f * max) !== chart.format(all[i - 1] * max));
    const y = (v) => H - PAD / 2 - (v / max) * (H - PAD);
    const line = (key) => samples.map((s, i) => `${x(t[i]).toFixed(1)},${y(s[key] || 0).toFixed(1)}`).join(" ");
    const marks = shown.map((m) => `<line class="marker ${m.kind}" x1="${x(Date.parse(m.at)).toFixed(1)}" x2="${x(Date.parse(m.at)).toFixed(1)}" y1="${PAD / 2}" y2="${H - PAD / 2}"><title>${esc(fmt(Date.parse(m.at)))} ${esc(m.text)}</title></line>`).join("");
    return `<figure class="chart-box" data-chart="${chart.name}">
      <svg viewBox="0 0 ${W} ${H}" class="chart" tabindex="0" role="img" aria-label="${chart.title} over the last ${hours} hours; arrow keys read the values">
        ${ticks.map((f) => `<line x1="${PAD}" x2="${W - PAD}" y1="${y(f * max)}" y2="${y(f * max)}" class="gridline"/><text x="2" y="${y(f * max) + 4}" class="axis">${chart.format(f * max)}</text>`).join("")}
        ${marks}
        ${chart.series.map(([key, cls]) => `<polyline points="${line(key)}" class="${cls}"/>`).join("")}
        <line class="cursor" x1="0" x2="0" y1="${PAD / 2}" y2="${H - PAD / 2}" visibility="hidden"/>
        <text x="${PAD}" y="${H - 1}" class="axis">${fmt(t0)}</text><text x="${W - PAD}" y="${H - 1}" text-anchor="end" class="axis">${fmt(t1)}</text>
      </svg>
      <figcaption class="chart-legend" data-testid="chart-readout-${chart.name}" aria-live="polite"></figcaption>
    </figure>`;
  }).join("") + `<p class="chart-legend muted">${shown.length ? `<span class="k failure">│ node failure</span><span class="k defrag">│ defrag</span>` : "no node failures or defrags in this window"}</p>`;

  // One readout per chart: the latest values, or those under the cursor.
  const readout = (i) => {
    const s = samples[i];
    const near = shown.filter((m) => Math.abs(Date.parse(m.at) - t[i]) <= (t1 - t0) / 100).map((m) => m.text);
    for (const chart of CHARTS) {
      const fig = el.querySelector(`[data-chart="${chart.name}"]`);
      const values = chart.series.map(([key, cls, label]) => `<span class="k ${cls}">${label} ${chart.format(s[key] || 0)}</span>`).join("");
      fig.querySelector("figcaption").innerHTML = `<span class="k muted">${fmt(t[i])}</span>${values}${near.length && chart.name === "use" ? `<span class="k">${esc(near.join("; "))}</span>` : ""}`;
      const cursor = fig.querySelector(".cursor");
      cursor.setAttribute("x1", x(t[i])); cursor.setAttribute("x2", x(t[i]));
      cursor.setAttribute("visibility", i === samples.length - 1 ? "hidden" : "visible");
    }
    el.dataset.index = i;
  };
  const nearest = (ms) => {
    let best = 0;
    for (let i = 1; i < t.length; i++) if (Math.abs(t[i] - ms) < Math.abs(t[best] - ms)) best = i;
    return best;
  };
  for (const svg of el.querySelectorAll("svg")) {
    svg.addEventListener("pointermove", (e) => {
      const box = svg.getBoundingClientRect();
      const vx = ((e.clientX - box.left) / box.width) * W;
      readout(nearest(t0 + ((vx - PAD) / (W - 2 * PAD)) * (t1 - t0)));
    });
    svg.addEventListener("pointerleave", () => readout(samples.length - 1));
    svg.addEventListener("keydown", (e) => {
      const step = { ArrowLeft: -1, ArrowRight: 1, Home: -Infinity, End: Infinity }[e.key];
      if (step === undefined) return;
      e.preventDefault();
      readout(Math.max(0, Math.min(samples.length - 1, Number(el.dataset.index) + step)));
    });
  }
  readout(samples.length - 1);
}
