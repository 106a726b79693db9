// Unix seconds -> readable UTC time in the sessions list.
document.querySelectorAll(".time[data-t]").forEach((el) => {
  el.textContent = new Date(+el.dataset.t * 1000).toISOString().replace("T", " ").slice(0, 19);
});
