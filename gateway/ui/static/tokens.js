// Token tooltip: id, text, logprob (and probability), policy version, from data-*.
(function () {
  const tip = document.getElementById("tip");
  if (!tip) return;
  document.addEventListener("mouseover", (e) => {
    const t = e.target.closest(".tok[data-id]");
    if (!t) { tip.hidden = true; return; }
    const lp = t.dataset.lp;
    const lines = [
      "id       " + t.dataset.id,
      "text     " + JSON.stringify(t.textContent),
      "logprob  " + (lp === undefined ? "—" : lp + "  (p=" + Math.exp(+lp).toFixed(3) + ")"),
      "version  " + (t.dataset.v === undefined ? "—" : t.dataset.v),
      t.classList.contains("trained") ? "trained" : "masked (no loss)",
    ];
    if (t.classList.contains("partial")) lines.push("bytes of a character the next token completes");
    if (t.classList.contains("drift")) lines.push("drift: first token not extending the parent");
    tip.textContent = lines.join("\n");
    const r = t.getBoundingClientRect();
    tip.style.left = Math.min(r.left, window.innerWidth - 320) + "px";
    tip.style.top = (r.bottom + 6) + "px";
    tip.hidden = false;
  });
})();
