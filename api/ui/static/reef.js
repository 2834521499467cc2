// Reef dashboard: fragments loaded after the page, live sections refreshed by polling, and
// a confirmation on destructive forms. No framework, no network but this server.
"use strict";

async function fetchPage(url) {
  const res = await fetch(url, { credentials: "same-origin", headers: { accept: "text/html" } });
  // a lapsed session redirects to the sign-in form: never paste that into a page
  if (!res.ok || res.redirected) throw new Error(`${res.status}`);
  return res.text();
}

// <td data-load="/ui/..."> : replaced by the fragment the URL renders
for (const el of document.querySelectorAll("[data-load]")) {
  fetchPage(el.dataset.load)
    .then((html) => { el.innerHTML = html; })
    .catch(() => { el.textContent = "unavailable"; });
}

// <section id=... data-refresh="N"> : re-read every N seconds while the tab is visible
for (const el of document.querySelectorAll("section[data-refresh][id]")) {
  const every = Math.max(1, Number(el.dataset.refresh)) * 1000;
  const tick = async () => {
    if (!document.hidden && !el.contains(document.activeElement)) {
      try {
        const doc = new DOMParser().parseFromString(await fetchPage(location.href), "text/html");
        const fresh = doc.getElementById(el.id);
        if (fresh && fresh.innerHTML !== el.innerHTML) el.innerHTML = fresh.innerHTML;
        if (fresh && fresh.dataset.refresh) el.dataset.refresh = fresh.dataset.refresh;
      } catch (e) { /* the next tick tries again */ }
    }
    setTimeout(tick, Math.max(1, Number(el.dataset.refresh)) * 1000);
  };
  setTimeout(tick, every);
}

// <form data-confirm="..."> : ask first
document.addEventListener("submit", (ev) => {
  const msg = ev.target.dataset && ev.target.dataset.confirm;
  if (msg && !window.confirm(msg)) ev.preventDefault();
});
