// A small hand-written SVG line chart of utilization and fragmentation (0..1)
// over time, read from /api/console/samples/.

import { api } from "./live.js";

const W = 640, H = 140, PAD = 28;

export async function drawChart(el, hours) {
  const { samples } = await api(`/api/console/samples/?hours=${hours}`);
  if (!samples.length) {
    el.innerHTML = `<p class="muted">No samples yet: the "fleet sample" task writes one a minute.</p>`;
    return;
  }
  const t = samples.map((s) => Date.parse(s.at));
  const t0 = Math.min(...t), t1 = Math.max(...t, t0 + 1);
  const x = (v) => PAD + ((v - t0) / (t1 - t0)) * (W - 2 * PAD);
  const y = (v) => H - PAD / 2 - v * (H - PAD);
  const line = (key) => samples.map((s, i) => `${x(t[i]).toFixed(1)},${y(s[key]).toFixed(1)}`).join(" ");
  const fmt = (ms) => new Date(ms).toISOString().slice(hours > 48 ? 5 : 11, 16).replace("T", " ");
  el.innerHTML = `<svg viewBox="0 0 ${W} ${H}" class="chart" role="img" aria-label="utilization and fragmentation over the last ${hours} hours">
    ${[0, 0.5, 1].map((v) => `<line x1="${PAD}" x2="${W - PAD}" y1="${y(v)}" y2="${y(v)}" class="gridline"/><text x="2" y="${y(v) + 4}" class="axis">${v * 100}%</text>`).join("")}
    <polyline points="${line("utilization")}" class="util"/>
    <polyline points="${line("fragmentation")}" class="frag"/>
    <text x="${PAD}" y="${H - 1}" class="axis">${fmt(t0)}</text><text x="${W - PAD}" y="${H - 1}" text-anchor="end" class="axis">${fmt(t1)}</text>
  </svg>
  <div class="chart-legend"><span class="k util">utilization ${(samples.at(-1).utilization * 100).toFixed(0)}%</span>
  <span class="k frag">fragmentation ${(samples.at(-1).fragmentation * 100).toFixed(0)}%</span></div>`;
}
