// A command's page, live while the command runs: its log lines and state from
// /ui/events/commands/ID. Every value is set as text (never as HTML).
"use strict";

(function () {
  const root = document.getElementById("command");
  const log = document.getElementById("command-log");
  if (!root || !log || !window.EventSource || root.dataset.finished === "yes") {
    return;
  }
  const status = document.getElementById("log-status");
  let after = Number(root.dataset.after || "0");

  function set(id, text) {
    const node = document.getElementById(id);
    if (node) { node.textContent = text; }
  }

  function utc(iso) {
    return iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", " UTC") : "";
  }

  function connect() {
    const events = new EventSource(
      "/ui/events/commands/" + encodeURIComponent(root.dataset.id) + "?after=" + after
    );
    status.textContent = "Streaming the log live.";
    events.addEventListener("log", (message) => {
      const line = JSON.parse(message.data);
      if (line.seq <= after) { return; }
      after = line.seq;
      const item = document.createElement("li");
      item.dataset.seq = String(line.seq);
      const attempt = document.createElement("span");
      attempt.className = "attempt";
      attempt.textContent = "#" + line.attempt;
      item.appendChild(attempt);
      item.appendChild(document.createTextNode(" " + line.text));
      log.appendChild(item);
      log.scrollTop = log.scrollHeight;
    });
    events.addEventListener("state", (message) => {
      const view = JSON.parse(message.data);
      const state = document.getElementById("command-state");
      state.textContent = view.state.replace("_", " ");
      state.className = "badge state-" + view.state;
      set("command-attempt", view.attempt + " of " + view.max_attempts);
      set("command-started", utc(view.started_at));
      set("command-finished", utc(view.finished_at));
      set("command-error", view.error || "");
      const outputs = view.result && Array.isArray(view.result.outputs) ? view.result.outputs : [];
      set("command-outputs", outputs.join(", "));
    });
    events.addEventListener("end", () => {
      events.close();
      status.textContent = "The command has finished.";
      root.dataset.finished = "yes";
      const cancel = document.getElementById("cancel");
      if (cancel) { cancel.hidden = true; }
    });
    events.addEventListener("signed-out", () => {
      events.close();
      window.location.assign("/ui/sign-in");
    });
    events.addEventListener("error", () => {
      // The browser reconnects by itself, from the start: close, and go on after the last line.
      events.close();
      status.textContent = "Live log paused; reconnecting.";
      window.setTimeout(connect, 2000);
    });
  }
  connect();
})();
