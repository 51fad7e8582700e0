// The console's live picture of the fleet.
//
// 1. Fetch the snapshot (/api/console/racks/): every rack's cells at a version.
// 2. Connect /ws/fleet/ and apply rack events whose version is newer than the
//    one applied. A rack event carries the rack's whole state, so applying it is
//    always right; a gap (version > applied + 1) still triggers a re-fetch of that
//    rack, in case the missed messages were followed by nothing.
// 3. On every reconnect, fetch what changed while the socket was down (messages
//    sent meanwhile are lost for good): ?since=<the cursor of the last answer>
//    answers only the racks changed since that answer, and rack_ids, every rack
//    there is now, so a rack removed meanwhile is dropped. The first load is the
//    whole snapshot, and so is a reconnect of a page that began following a rack
//    after its last answer (that cursor says nothing of the new rack).
//    Disconnected: body[data-ws=closed], a banner, and a reconnect with backoff.
//
// A page may follow only some racks (rackIds), none at all (rackIds = []: no
// snapshot is fetched, for pages that only want job events), or change the set it
// follows as it goes (follow/unfollow); rack events of the racks it does not
// follow are emitted as "other", so such a page can notice a rack it should show.
//
// Tests and the benchmark read window.rackwise (appliedVersion, cellState) and the
// data-version attribute of each [data-rack-id] element.

import { cells } from "./grid.js";

export function csrfToken() {
  const m = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
  return m ? decodeURIComponent(m[1]) : "";
}

export async function api(path, { method = "GET", body } = {}) {
  const res = await fetch(path, {
    method,
    credentials: "same-origin",
    // Every unsafe method needs the CSRF token, a body-less DELETE too.
    headers: {
      Accept: "application/json",
      ...(method !== "GET" ? { "X-CSRFToken": csrfToken() } : {}),
      ...(body !== undefined ? { "Content-Type": "application/json" } : {}),
    },
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(data.detail || `HTTP ${res.status}`), { status: res.status, data });
  return data;
}

/** Every message in an API error body, whatever its field. */
export function messages(value) {
  if (Array.isArray(value)) return value.flatMap(messages);
  if (value && typeof value === "object") return Object.values(value).flatMap(messages);
  return [String(value)];
}

/** [path, messages] for every field of a 400's body: the API keys a nested
 * field by its path ("slurm.script", "quotas[1].nominal_gpus"). */
export function errorPaths(data) {
  return Object.entries(data).map(([path, v]) => [path, Array.isArray(v) ? v.map(String) : [String(v)]]);
}

/** Show an API error on a form: a 400's messages next to their fields (the
 * slot whose ``data-field-error`` lists the field's path), the rest, named, in
 * the ``detail`` slot, as are fields whose slot is hidden; any other error's
 * message there. ``err`` null clears them. ``skip(slot)`` leaves a field's slot
 * unmarked (a form checked as it is typed marks only what was touched).
 * Returns how many messages were shown. */
export function showFieldErrors(form, err, { skip = () => false } = {}) {
  for (const slot of form.querySelectorAll("[data-field-error]")) slot.textContent = "";
  if (!err) return 0;
  const detail = form.querySelector("[data-field-error~=detail]");
  if (err.status !== 400 || !err.data || typeof err.data !== "object") {
    detail.textContent = err.message;
    return 1;
  }
  let shown = 0;
  for (const [path, texts] of errorPaths(err.data)) {
    let slot = form.querySelector(`[data-field-error~="${CSS.escape(path)}"]`);
    let text = texts.join(" ");
    if (!slot || slot.closest("[hidden]")) {
      slot = detail;
      if (path !== "detail" && path !== "non_field_errors") text = `${path}: ${text}`;
    } else if (slot !== detail && skip(slot)) {
      continue;
    }
    slot.textContent = [slot.textContent, text].filter(Boolean).join(" ");
    shown++;
  }
  return shown;
}

export class FleetLive {
  /** rackIds: only these racks (null: all; []: none, and no snapshot). */
  constructor(rackIds = null) {
    this.rackIds = rackIds;
    this.racks = new Map();      // id -> rack event
    this.versions = new Map();   // id -> last applied version
    this.nodeRack = new Map();   // node id -> rack id
    this.listeners = { rack: [], other: [], job: [], action: [], status: [], hello: [], removed: [] };
    this.gaps = 0;
    this.snapshots = 0;
    this.cursor = null;          // the last refresh's cursor, for ?since=
    this.covered = null;         // the racks that cursor covers (null: all)
    this.backoff = 500;
    this.socket = null;
    this.stopped = false;
    this.onFirstSnapshot = null;
  }

  on(kind, fn) { this.listeners[kind].push(fn); return this; }
  emit(kind, payload) { for (const fn of this.listeners[kind]) { try { fn(payload); } catch (e) { console.error(e); } } }

  /** Connect, and resolve once the first snapshot is applied: the one taken when
   * the socket opens (so nothing falls between the two), or after 3 s without
   * a socket, so the page shows something while it keeps trying. */
  start() {
    setStatus("connecting");
    return new Promise((resolve) => {
      let done = false;
      const finish = () => { if (!done) { done = true; resolve(); } };
      this.onFirstSnapshot = finish;
      setTimeout(() => { if (!done) this.refresh().then(finish, finish); }, 3000);
      this.connect();
    });
  }

  /** The whole state of ``ids`` (null: every rack), applied where newer: a gap's
   * re-fetch of one rack, or a page looking for racks it does not follow. */
  async snapshot(ids = this.rackIds) {
    return (await this.fetchRacks(ids, null)).racks.length;
  }

  /** What a (re)connect fetches: the racks changed since the last refresh's
   * cursor if it covers every rack followed, else the whole snapshot of them.
   * Racks followed that the server no longer has are dropped. */
  async refresh() {
    const ids = this.rackIds ? [...this.rackIds] : null;
    if (ids && !ids.length) return 0;
    const covered = this.cursor !== null
      && (this.covered === null || (ids !== null && ids.every((id) => this.covered.has(id))));
    const data = await this.fetchRacks(ids, covered ? this.cursor : null);
    const present = new Set(data.rack_ids);
    for (const id of [...this.racks.keys()]) if (!present.has(id) && (ids === null || ids.includes(id))) this.drop(id);
    this.cursor = data.cursor;
    this.covered = ids ? new Set(ids) : null;
    return data.racks.length;
  }

  async fetchRacks(ids, since) {
    // An empty ?ids= means every rack to the server: a page following no rack asks nothing.
    if (ids && !ids.length) return { racks: [] };
    const q = [ids ? `ids=${ids.join(",")}` : "", since !== null ? `since=${since}` : ""].filter(Boolean).join("&");
    const data = await api(`/api/console/racks/${q ? `?${q}` : ""}`);
    this.snapshots++;
    for (const rack of data.racks) this.apply(rack, true);
    return data;
  }

  /** Forget a rack the server no longer has (a topology import removed it). Its
   * version is kept, as by unfollow. */
  drop(rackId) {
    const rack = this.racks.get(rackId);
    this.racks.delete(rackId);
    if (rack) for (const n of rack.nodes) if (this.nodeRack.get(n[0]) === rackId) this.nodeRack.delete(n[0]);
    this.emit("removed", rackId);
  }

  /** Follow one more rack from now on (its state is applied from the next event or snapshot). */
  follow(rackId) {
    if (this.rackIds && !this.rackIds.includes(rackId)) this.rackIds.push(rackId);
  }

  /** Stop following a rack. Its version is kept, so a late, older event of it
   * is not mistaken for news. */
  unfollow(rackId) {
    if (this.rackIds) this.rackIds = this.rackIds.filter((id) => id !== rackId);
    this.racks.delete(rackId);
  }

  /** Apply a rack state if it is newer than what is shown. */
  apply(rack, fromSnapshot = false) {
    const current = this.versions.has(rack.rack) ? this.versions.get(rack.rack) : -1;
    if (this.rackIds && !this.rackIds.includes(rack.rack)) {
      if (rack.version > current) this.emit("other", rack);
      return false;
    }
    if (rack.version <= current) return false;
    if (!fromSnapshot && current >= 0 && rack.version > current + 1) {
      this.gaps++;
      this.snapshot([rack.rack]).catch(() => {});
    }
    this.racks.set(rack.rack, rack);
    this.versions.set(rack.rack, rack.version);
    for (const n of rack.nodes) this.nodeRack.set(n[0], rack.rack);
    for (const el of document.querySelectorAll(`[data-rack-id="${rack.rack}"]`)) el.dataset.version = rack.version;
    this.emit("rack", rack);
    return true;
  }

  connect() {
    if (this.stopped) return;
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/fleet/`;
    const ws = new WebSocket(url);
    this.socket = ws;
    ws.onopen = () => {
      this.backoff = 500;
      setStatus("open");
      // Anything sent while we were away is lost: fetch what changed meanwhile.
      this.refresh().then(() => this.onFirstSnapshot && this.onFirstSnapshot(), () => {});
      this.ping = setInterval(() => ws.readyState === 1 && ws.send(JSON.stringify({ type: "ping" })), 25000);
    };
    ws.onmessage = (msg) => {
      const event = JSON.parse(msg.data);
      if (event.type === "rack") this.apply(event);
      else if (event.type in this.listeners) this.emit(event.type, event);
      // For the nav badge and the attention banner (attention.js), on any page.
      if (event.type === "action" || event.type === "job") document.dispatchEvent(new CustomEvent(`rackwise:${event.type}`, { detail: event }));
    };
    ws.onclose = (e) => {
      clearInterval(this.ping);
      if (this.socket !== ws) return;
      setStatus("closed");
      if (e.code === 4401) { window.location.href = `/login/?next=${encodeURIComponent(location.pathname)}`; return; }
      if (e.code === 4403) return;
      setTimeout(() => this.connect(), this.backoff);
      this.backoff = Math.min(this.backoff * 2, 8000);
    };
  }

  /** Cell state of one GPU, for tests and tooltips. */
  cellState(nodeId, gpu) {
    const rack = this.racks.get(this.nodeRack.get(nodeId));
    if (!rack) return null;
    const c = cells(rack).find((x) => x.node === nodeId && x.gpu === gpu);
    return c ? { ...c, rack: rack.rack, version: rack.version } : null;
  }
}

function setStatus(status) {
  document.body.dataset.ws = status;
  const banner = document.querySelector("[data-testid=ws-status]");
  if (banner) {
    banner.textContent = status === "open" ? "live" : status === "closed" ? "disconnected, reconnecting…" : "connecting…";
    banner.className = `ws-status ws-${status}`;
  }
}

/** Start the live picture and expose it for tests as window.rackwise. */
export function startLive(rackIds = null) {
  const live = new FleetLive(rackIds);
  window.rackwise = {
    live,
    appliedVersion: (rackId) => (live.versions.has(rackId) ? live.versions.get(rackId) : -1),
    cellState: (nodeId, gpu) => live.cellState(nodeId, gpu),
    jobCells: (jobId) => [...live.racks.values()].flatMap((r) => cells(r).filter((c) => c.job === jobId).map((c) => ({ rack: r.rack, node: c.node, gpu: c.gpu }))),
    get gaps() { return live.gaps; },
    get snapshots() { return live.snapshots; },
    get cursor() { return live.cursor; },
  };
  return live;
}
