// pg_tide-console: confirmation of destructive actions, and live pages. A page whose <body>
// has data-live listens to /events (server-sent events relayed from PostgreSQL's
// LISTEN/NOTIFY) and, when told something changed, fetches itself again and swaps its <main>:
// at most once a second, and not while a form field of it has the focus or rows are ticked.
(function () {
  "use strict";
  document.addEventListener("submit", function (e) {
    var msg = e.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) { e.preventDefault(); }
  });
  var live = document.body.getAttribute("data-live");
  if (live === null || !window.EventSource) { return; }
  var busy = false, again = false, last = 0;
  // Typing in a field of the page, or rows picked for an action on many: no swap meanwhile.
  function typing() {
    var a = document.activeElement;
    if (document.querySelector("main input[type=checkbox]:checked")) { return true; }
    return a && a.closest && a.closest("main") && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName);
  }
  function refresh() {
    if (busy || typing()) { again = true; return; }
    busy = true; again = false; last = Date.now();
    fetch(location.href, { credentials: "same-origin", headers: { "X-Tide-Live": "1" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        if (typing()) { again = true; return; }  // the person started typing meanwhile
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.querySelector("main");
        if (fresh) {
          document.querySelector("main").innerHTML = fresh.innerHTML;
          document.body.setAttribute("data-refreshed", String(Number(document.body.getAttribute("data-refreshed") || 0) + 1));
        }
      })
      .catch(function () {})
      .then(function () { busy = false; if (again) { schedule(); } });
  }
  function schedule() { setTimeout(refresh, Math.max(0, 1000 - (Date.now() - last))); }
  var es = new EventSource("/events" + (live ? "?task=" + encodeURIComponent(live) : ""));
  es.addEventListener("changed", schedule);
  es.addEventListener("open", function () { document.body.setAttribute("data-listening", "1"); });
  // Leaving the page closes its stream at once: browsers allow only a few connections per
  // host, and a stream kept open by a page in the back-forward cache would hold one.
  window.addEventListener("pagehide", function () { es.close(); });
  window.addEventListener("pageshow", function (e) { if (e.persisted) { location.reload(); } });
})();
