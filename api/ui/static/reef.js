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

// A transcript's review forms, keyboard first: j/k the next/previous turn, 1-5 its score
// (y/n: 5/1, or the first yes/no metric when the scenario declares one), e its correction,
// Ctrl+Enter save. Keys typed into a field stay the field's (Escape leaves it).
(() => {
  const turns = [...document.querySelectorAll("li.turn")].filter((t) => t.querySelector("form.review"));
  if (!turns.length) return;
  let at = Math.max(0, turns.findIndex((t) => t.classList.contains("current") || "#" + t.id === location.hash));
  const show = (i) => {
    at = Math.min(turns.length - 1, Math.max(0, i));
    turns.forEach((t, j) => t.classList.toggle("active", j === at));
    turns[at].focus({ preventScroll: true });
    turns[at].scrollIntoView({ block: "nearest" });
  };
  show(at);
  const pick = (form, selector) => {
    const input = form.querySelector(selector);
    if (input) { input.checked = true; input.dispatchEvent(new Event("change", { bubbles: true })); }
  };
  document.addEventListener("keydown", (ev) => {
    const field = ev.target.closest && ev.target.closest("textarea, input[type=number], select");
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {  // save the turn's review
      const own = ev.target.form && ev.target.form.matches("form.review") ? ev.target.form : null;
      ev.preventDefault();
      (own || turns[at].querySelector("form.review")).requestSubmit();
      return;
    }
    if (field) {
      if (ev.key === "Escape") { field.blur(); turns[at].focus({ preventScroll: true }); }
      return;
    }
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const form = turns[at].querySelector("form.review");
    const yesNo = form.querySelector('fieldset.metric input[value="true"]');
    if (ev.key === "j") show(at + 1);
    else if (ev.key === "k") show(at - 1);
    else if (/^[1-5]$/.test(ev.key)) pick(form, `input[name=score][data-key="${ev.key}"]`);
    else if (ev.key === "y" || ev.key === "n") {
      if (yesNo) pick(form, `input[name="${CSS.escape(yesNo.name)}"][value="${ev.key === "y"}"]`);
      else pick(form, `input[name=score][data-key="${ev.key === "y" ? 5 : 1}"]`);
    } else if (ev.key === "e") form.querySelector("textarea[data-role=correction]").focus();
    else return;
    ev.preventDefault();
  });
})();
