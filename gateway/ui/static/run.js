// Run dashboard: charts of metrics.jsonl (one row per training step) and eval.jsonl (one
// row per held-out evaluation), refreshed while the run goes on. Each chart lists the
// columns it shows; absent columns are skipped. Options: `right` columns get their own
// y scale on the right (values of another order of magnitude), `evals` charts eval.jsonl
// rows against their own steps, `band` shades between two columns (lo, hi), `dash`
// draws those columns dashed, `range` fixes the y range.
(function () {
  const CHARTS = [
    ["Reward", ["reward_mean", "reward_max", "eval_accuracy"]],
    ["Held-out accuracy", ["accuracy", "accuracy_ci_lo", "accuracy_ci_hi"],
      { evals: true, band: ["accuracy_ci_hi", "accuracy_ci_lo"],
        dash: ["accuracy_ci_lo", "accuracy_ci_hi"], range: [0, 1] }],
    ["Loss", ["loss"]],
    ["Gradient norm (before clipping)", ["grad_norm"]],
    ["KL and clip fraction", ["approx_kl", "clip_frac"]],
    ["Entropy and KL to the start", ["entropy", "kl_ref"], { right: ["kl_ref"] }],
    ["Sampler vs trainer logprob mismatch", ["logprob_mismatch"]],
    ["Answers: cut off, repeated, groups with no spread",
      ["truncated_frac", "repetition", "zero_spread_frac"]],
    ["Answer length (tokens)", ["answer_tokens_mean"]],
    ["Learning rate", ["lr"]],
    ["Staleness (policy versions)", ["staleness_mean", "staleness_max"]],
    ["Tokens per second (update)", ["packed_tokens_per_s", "trained_tokens_per_s"]],
    ["Step times (s)", ["step_s", "rollout_wait_s", "weight_sync_s", "checkpoint_s"]],
  ];
  const COLORS = ["#2f6fd6", "#d6572f", "#2a9d4b", "#9b4dd6"];
  const box = document.getElementById("charts");
  const status = document.getElementById("status");
  const plots = {};
  window.runPlots = plots; // for the browser tests: title id -> {keys, plot}

  // Digits after the point that show a multiple of `incr` exactly (uPlot's ticks step by
  // 1, 2, 2.5 or 5 times a power of ten), counted from the power of ten `exp`.
  function digits(incr, exp) {
    let d = Math.max(0, exp - Math.floor(Math.log10(incr) + 1e-9));
    while (d < 15 && Math.abs(Math.round(incr * 10 ** (d - exp)) - incr * 10 ** (d - exp)) > 1e-6) d++;
    return d;
  }

  // Y tick labels with as many digits as the tick spacing needs, so that no two ticks
  // share a label: 0.25, 0.30; 2.0e-4, 2.5e-4 for steps below 1e-3 (and from 1e6 on).
  function ticks(u, splits, axisIdx, space, incr) {
    const big = Math.max(...splits.map((v) => Math.abs(v || 0)));
    const exponential = incr < 1e-3 || big >= 1e6;
    return splits.map((v) => {
      if (v == null) return "";
      if (!exponential) return v.toFixed(digits(incr, 0));
      if (v === 0) return "0";
      const exp = Math.floor(Math.log10(Math.abs(v)) + 1e-9);
      return v.toExponential(digits(incr, exp)).replace("e+", "e");
    });
  }

  // Wide enough for the longest label (12px font: ~7px a character, plus tick and gap).
  function width(u, values) {
    return values ? Math.max(40, 20 + 7 * Math.max(...values.map((v) => v.length))) : 40;
  }

  function columns(data) {
    const rows = data.rows, evals = data.evals || [];
    const steps = rows.map((r) => r.step);
    const byStep = {};
    evals.forEach((e) => { byStep[e.step] = e.accuracy; });
    const num = (v) => (typeof v === "number" ? v : null);
    const ci = (e, i) => (Array.isArray(e.accuracy_ci) ? num(e.accuracy_ci[i]) : null);
    const col = (k) => k === "eval_accuracy"
      ? steps.map((s) => (s in byStep ? byStep[s] : null))
      : rows.map((r) => num(r[k]));
    const evalCol = (k) => evals.map((e) =>
      k === "accuracy_ci_lo" ? ci(e, 0) : k === "accuracy_ci_hi" ? ci(e, 1) : num(e[k]));
    return { steps, col, evalSteps: evals.map((e) => e.step), evalCol };
  }

  function options(keys, opt) {
    const dash = opt.dash || [];
    // a scale of its own on the right only beside other series on the left
    const right = keys.every((k) => (opt.right || []).includes(k)) ? [] : opt.right || [];
    const color = (i) => COLORS[i % COLORS.length];
    const yAxis = (scale, side) => ({
      scale, side, values: ticks, size: width, grid: { show: side === 3 },
    });
    const axes = [{ label: "step" }, yAxis("y", 3)];
    const r = keys.findIndex((k) => right.includes(k));
    if (r >= 0) { // each y axis in the colour of its first series
      axes[1].stroke = color(0);
      axes.push({ ...yAxis("right", 1), stroke: color(r) });
    }
    const scales = { x: { time: false } };
    if (opt.range) scales.y = { auto: false, range: opt.range };
    const series = [{ label: "step" }, ...keys.map((k, i) => {
      const s = { label: k, scale: right.includes(k) ? "right" : "y", spanGaps: true,
        stroke: color(i), width: 1.8, points: { show: true, size: 5 } };
      return dash.includes(k)
        ? { ...s, stroke: color(0), width: 1, dash: [5, 4], points: { show: false } } : s;
    })];
    const o = { width: 440, height: 220, scales, axes, series };
    if (opt.band && opt.band.every((k) => keys.includes(k))) { // shade between lo and hi
      o.bands = [{ series: opt.band.map((k) => keys.indexOf(k) + 1), fill: "rgba(47,111,214,.12)" }];
    }
    return o;
  }

  function draw(data) {
    const { steps, col, evalSteps, evalCol } = columns(data);
    for (const [title, keys, opt = {}] of CHARTS) {
      const get = opt.evals ? evalCol : col;
      const present = keys.filter((k) => get(k).some((v) => v !== null));
      if (!present.length) continue;
      const series = [opt.evals ? evalSteps : steps, ...present.map(get)];
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
      plots[id] = { keys: present, plot: new uPlot(options(present, opt), series, div) };
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
