// The fleet page's live updates: rows from /ui/events/fleet, filtered and sorted here as
// the form says. Every value is set as text (never as HTML).
"use strict";

(function () {
  const body = document.getElementById("fleet-rows");
  const form = document.getElementById("fleet-filter");
  if (!body || !form || !window.EventSource) {
    return;
  }
  const rows = new Map();
  const liveStatus = document.getElementById("live-status");

  function age(iso) {
    if (!iso) {
      return "";
    }
    let seconds = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
    if (seconds < 60) { return seconds + "s"; }
    let minutes = Math.floor(seconds / 60); seconds %= 60;
    if (minutes < 60) { return minutes + "m " + seconds + "s"; }
    let hours = Math.floor(minutes / 60); minutes %= 60;
    if (hours < 48) { return hours + "h " + minutes + "m"; }
    const days = Math.floor(hours / 24); hours %= 24;
    return days + "d " + hours + "h";
  }

  function rate(value) {
    if (value === null || value === undefined) { return ""; }
    const units = ["B/s", "KiB/s", "MiB/s"];
    for (const unit of units) {
      if (value < 1024) { return value.toFixed(0) + " " + unit; }
      value /= 1024;
    }
    return value.toFixed(1) + " GiB/s";
  }

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    if (className) { node.className = className; }
    return node;
  }

  function badge(text, kind) {
    return el("span", text, "badge " + kind);
  }

  function render(row) {
    const tr = document.createElement("tr");
    tr.dataset.name = row.name;
    const head = el("th");
    head.scope = "row";
    const link = el("a", row.name);
    link.href = "/ui/clusters/" + encodeURIComponent(row.name);
    head.appendChild(link);
    tr.appendChild(head);

    const state = el("td", null, "state");
    state.appendChild(row.connected ? badge("connected", "ok") : badge("offline", "off"));
    if (row.since) {
      state.appendChild(document.createTextNode(" "));
      state.appendChild(el("span", "for " + age(row.since), "since"));
    } else if (!row.connected) {
      state.appendChild(document.createTextNode(" "));
      state.appendChild(el("span", "never connected", "since"));
    }
    tr.appendChild(state);

    const agent = el("td", row.agent_version || "");
    if (row.outdated) {
      agent.appendChild(document.createTextNode(" "));
      agent.appendChild(badge("out of date", "warn"));
    }
    tr.appendChild(agent);
    tr.appendChild(el("td", row.rbac + (row.namespaces.length ? ": " + row.namespaces.join(", ") : "")));
    tr.appendChild(el("td", row.rtt_ms === null ? "" : row.rtt_ms.toFixed(1) + " ms", "num"));
    tr.appendChild(el("td", row.streams === null ? "" : row.streams, "num"));
    tr.appendChild(el("td", rate(row.bytes_per_second), "num"));
    tr.appendChild(el("td", row.credit_wait_seconds === null ? "" : row.credit_wait_seconds.toFixed(1) + " s", "num"));
    tr.appendChild(el("td", row.running, "num"));
    tr.appendChild(el("td", row.pending, "num"));
    return tr;
  }

  function shown() {
    const text = form.elements.q.value.trim().toLowerCase();
    const state = form.elements.state.value;
    const key = form.elements.sort.value;
    const descending = form.elements.order.value === "desc";
    const kept = [];
    for (const row of rows.values()) {
      if (text && !row.name.includes(text)) { continue; }
      if (state === "connected" && !row.connected) { continue; }
      if (state === "disconnected" && row.connected) { continue; }
      if (state === "outdated" && !row.outdated) { continue; }
      kept.push(row);
    }
    const value = (row) => {
      const v = row[key];
      if (key === "since" && v) { return Date.parse(v); }
      if (typeof v === "boolean") { return v ? 1 : 0; }
      return v;
    };
    const known = kept.filter((row) => row[key] !== null && row[key] !== undefined);
    const unknown = kept.filter((row) => row[key] === null || row[key] === undefined);
    known.sort((a, b) => {
      const x = value(a), y = value(b);
      let order = x < y ? -1 : x > y ? 1 : 0;
      if (descending) { order = -order; }
      return order || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    });
    unknown.sort((a, b) => (a.name < b.name ? -1 : 1));
    return known.concat(unknown);
  }

  function redraw() {
    const fragment = document.createDocumentFragment();
    for (const row of shown()) { fragment.appendChild(render(row)); }
    body.replaceChildren(fragment);
    let connected = 0;
    for (const row of rows.values()) { if (row.connected) { connected += 1; } }
    document.getElementById("fleet-connected").textContent = String(connected);
    document.getElementById("fleet-total").textContent = String(rows.size);
    const empty = document.getElementById("fleet-empty");
    if (empty) { empty.hidden = rows.size > 0; }
  }

  const events = new EventSource("/ui/events/fleet");
  events.addEventListener("fleet", (message) => {
    const update = JSON.parse(message.data);
    if (update.full) { rows.clear(); }
    for (const row of update.rows) { rows.set(row.name, row); }
    for (const name of update.removed) { rows.delete(name); }
    redraw();
    liveStatus.textContent = "Updated live.";
    liveStatus.dataset.state = "live";
    body.dataset.updates = String(Number(body.dataset.updates || "0") + 1);
  });
  events.addEventListener("signed-out", () => {
    events.close();
    window.location.assign("/ui/sign-in");
  });
  events.addEventListener("error", () => {
    liveStatus.textContent = "Live updates paused; reconnecting.";
    liveStatus.dataset.state = "reconnecting";
  });

  form.addEventListener("input", redraw);
  form.addEventListener("change", redraw);
  window.setInterval(redraw, 5000);  // the ages ("for 3m 2s") move on
})();
