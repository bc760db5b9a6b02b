// Live updates for the console: the server says when runs change (server-sent
// events) and the page swaps in a fresh copy of its <main>. Pages work without
// this file; it only saves a reload. No inline scripts: the CSP forbids them.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main || !window.EventSource || !window.fetch || !window.DOMParser) return;
  var scope = main.getAttribute("data-live");
  var note = document.getElementById("live-note");
  var inflight = false, again = false;

  function typing() {
    // Never throw away a reason someone is writing.
    var active = document.activeElement;
    if (active && main.contains(active) && /^(TEXTAREA|INPUT|SELECT)$/.test(active.tagName)) return true;
    var boxes = main.querySelectorAll("textarea");
    for (var i = 0; i < boxes.length; i++) if (boxes[i].value) return true;
    return false;
  }

  function refresh() {
    if (typing()) { if (note) note.hidden = false; return; }
    if (inflight) { again = true; return; }
    inflight = true;
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { if (r.redirected || !r.ok) { location.reload(); return null; } return r.text(); })
      .then(function (html) {
        if (html === null) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
        if (fresh && !typing()) main.innerHTML = fresh.innerHTML;
        else if (note) note.hidden = false;
      })
      .catch(function () {})
      .then(function () { inflight = false; if (again) { again = false; refresh(); } });
  }

  var source = new EventSource("/console/events");
  source.addEventListener("run", function (event) {
    var change;
    try { change = JSON.parse(event.data); } catch (e) { return; }
    if (scope === "all" || scope === change.run_id) refresh();
  });
})();
