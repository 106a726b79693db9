// Run dashboard: charts of metrics.jsonl (one row per training step), refreshed while
// the run goes on. Each chart lists the columns it shows; absent columns are skipped.
(function () {
  const CHARTS = [
    ["Reward", ["reward_mean", "reward_max", "eval_accuracy"]],
    ["Loss", ["loss"]],
    ["Gradient norm (before clipping)", ["grad_norm"]],
    ["KL and clip fraction", ["approx_kl", "clip_frac"]],
    ["Staleness (policy versions)", ["staleness_mean", "staleness_max"]],
    ["Tokens per second (update)", ["packed_tokens_per_s", "trained_tokens_per_s"]],
    ["Step times (s)", ["step_s", "rollout_wait_s", "weight_sync_s", "checkpoint_s"]],
  ];
  const COLORS = ["#2f6fd6", "#d6572f", "#2a9d4b", "#9b4dd6"];
  const box = document.getElementById("charts");
  const status = document.getElementById("status");
  const plots = {};

  function columns(data) {
    const rows = data.rows;
    const steps = rows.map((r) => r.step);
    const byStep = {};
    (data.evals || []).forEach((e) => { byStep[e.step] = e.accuracy; });
    const col = (k) => k === "eval_accuracy"
      ? steps.map((s) => (s in byStep ? byStep[s] : null))
      : rows.map((r) => (typeof r[k] === "number" ? r[k] : null));
    return { steps, col };
  }

  function draw(data) {
    const { steps, col } = columns(data);
    for (const [title, keys] of CHARTS) {
      const present = keys.filter((k) => col(k).some((v) => v !== null));
      if (!present.length) continue;
      const series = [steps, ...present.map(col)];
      const id = title.replace(/\W+/g, "-").toLowerCase();
      if (plots[id] && plots[id].keys.join() === present.join()) {
        plots[id].plot.setData(series);
        continue;
      }
      let div = document.getElementById("chart-" + id);
      if (!div) {
        div = document.createElement("div");
        div.className = "chart"; div.id = "chart-" + id;
        div.innerHTML = "<h2></h2>"; div.firstChild.textContent = title;
        box.appendChild(div);
      } else if (plots[id]) { plots[id].plot.destroy(); }
      const opts = {
        width: 440, height: 220,
        scales: { x: { time: false } },
        axes: [{ label: "step" }, {}],
        series: [{ label: "step" }, ...present.map((k, i) => ({
          label: k, stroke: COLORS[i % COLORS.length], width: 1.8,
          points: { show: true, size: 5 }, spanGaps: true,
        }))],
      };
      plots[id] = { keys: present, plot: new uPlot(opts, series, div) };
    }
    status.textContent = steps.length + " steps · updated " + new Date().toLocaleTimeString();
    status.dataset.steps = steps.length;
  }

  async function refresh() {
    try {
      const r = await fetch(box.dataset.src, { credentials: "same-origin" });
      if (r.ok) draw(await r.json());
      else status.textContent = "could not read the metrics (" + r.status + ")";
    } catch (e) { status.textContent = "gateway unreachable: " + e; }
  }
  refresh();
  setInterval(refresh, 3000);
})();
