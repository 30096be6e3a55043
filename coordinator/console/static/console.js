// Progressive enhancement only: every page works without it.
"use strict";

// Live claims: refresh the table in place, and count each span on between refreshes. A span
// starts from the coordinator's reading (data-seconds) and moves with this page's own clock
// since the table arrived: the browser's clock is never compared with the server's.
let countedFrom = performance.now();

function tickCounts() {
  const elapsed = (performance.now() - countedFrom) / 1000;
  for (const el of document.querySelectorAll(".count[data-seconds]")) {
    const start = Number(el.dataset.seconds);
    const value = el.dataset.count === "down" ? start - elapsed : start + elapsed;
    el.textContent = Math.max(0, Math.floor(value)) + " s" + (el.dataset.suffix || "");
  }
}

function refreshLive(live) {
  const every = Number(live.dataset.refresh) || 2000;
  setInterval(async () => {
    try {
      const reply = await fetch(location.href, { credentials: "same-origin" });
      if (!reply.ok) return;
      const doc = new DOMParser().parseFromString(await reply.text(), "text/html");
      const fresh = doc.getElementById("live");
      if (fresh) {
        live.innerHTML = fresh.innerHTML;
        countedFrom = performance.now();
        tickCounts();
      }
    } catch (e) { /* the next tick tries again */ }
  }, every);
  setInterval(tickCounts, 500);
  tickCounts();
}

// Events (newest first): follow the live stream and put each new event on top; the browser
// resumes after the last id on reconnect.
const MAX_ROWS = 500;

function cell(label, text, href) {
  const td = document.createElement("td");
  td.dataset.label = label;
  if (href) {
    const a = document.createElement("a");
    a.href = href;
    a.textContent = text;
    td.appendChild(a);
  } else {
    td.textContent = text;
  }
  return td;
}

function followEvents(status) {
  const rows = document.getElementById("event-rows");
  const source = new EventSource(status.dataset.stream);
  source.addEventListener("open", () => { status.textContent = "Live: new events appear on top."; });
  source.addEventListener("task", (msg) => {
    const e = JSON.parse(msg.data);
    const tr = document.createElement("tr");
    tr.dataset.position = e.position;
    tr.append(
      cell("at", e.at), cell("task", e.task_id, "/tasks/" + encodeURIComponent(e.task_id)),
      cell("transition", e.from + " → " + e.to), cell("op", e.op), cell("by", e.by),
      cell("gen / epoch", e.generation + " / " + e.epoch), cell("detail", e.detail));
    tr.lastElementChild.className = "detail";
    rows.insertBefore(tr, rows.firstElementChild);
    while (rows.children.length > MAX_ROWS) rows.removeChild(rows.lastElementChild);
  });
  source.addEventListener("refused", (msg) => {
    status.textContent = JSON.parse(msg.data);
    status.className = "flash refused";
    source.close();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("live");
  if (live) refreshLive(live);
  const status = document.getElementById("live-status");
  if (status && status.dataset.stream) followEvents(status);
});
