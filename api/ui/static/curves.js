// The learning curve: mean reported score per release with its 95% band, and the gate's
// held-out mean, drawn with uPlot (vendored: see api/ui/package.json and `make ui`).
"use strict";

(function () {
  const el = document.getElementById("curve");
  const data = JSON.parse(document.getElementById("curve-data").textContent);
  if (!el || !window.uPlot) return;
  const width = () => Math.max(280, el.clientWidth - 16);
  // The gate's held-out means are on the recipe's own scale (a log-likelihood, a reward):
  // their own axis on the right, so they never squash the reported scores.
  const opts = {
    width: width(),
    height: 320,
    scales: { x: { time: false }, gate: { auto: true } },
    axes: [
      { label: "release", values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? "#" + t : "")) },
      { label: "mean reported score" },
      { label: "gate held-out", scale: "gate", side: 1, grid: { show: false } },
    ],
    series: [
      { label: "release" },
      { label: "95% low", stroke: "#9cc8f0", dash: [4, 4], width: 1, spanGaps: true },
      { label: "mean reported score", stroke: "#0b5cad", width: 2, points: { size: 8 }, spanGaps: true },
      { label: "95% high", stroke: "#9cc8f0", dash: [4, 4], width: 1, spanGaps: true },
      { label: "gate held-out (candidate)", scale: "gate", stroke: "#116329", width: 2, dash: [8, 4], points: { size: 8 }, spanGaps: true },
    ],
    bands: [{ series: [3, 1], fill: "rgba(11,92,173,0.12)" }],
  };
  // The headline's figures (held-out pass rates) and the gate guards' held-out means, on the
  // score's axis: they are shares in [0, 1] (the page leaves others to the chart below).
  const colours = ["#8a3ffc", "#d12771", "#b28600", "#007d79", "#6f6f6f"];
  (data.lines || []).forEach((line, i) => {
    opts.series.push({ label: line.name, stroke: colours[i % colours.length], width: 2.5, points: { size: 9 }, spanGaps: true });
  });
  if ((data.lines || []).length) opts.axes[1].label = "share / mean score";
  const columns = [data.seq, data.low, data.mean, data.high, data.gate, ...(data.lines || []).map((l) => l.values)];
  const plot = new uPlot(opts, columns, el);
  window.addEventListener("resize", () => plot.setSize({ width: width(), height: 320 }));
})();

// Other figures per release: one series at a time, chosen in the select (demo and bench
// figures first, then the metrics releases recorded).
(function () {
  const el = document.getElementById("extra");
  const select = document.getElementById("extra-select");
  const source = document.getElementById("extra-data");
  if (!el || !select || !source || !window.uPlot) return;
  const data = JSON.parse(source.textContent);
  const width = () => Math.max(280, el.clientWidth - 16);
  let plot = null;
  function draw() {
    const chosen = data.series[Number(select.value)];
    if (plot) plot.destroy();
    plot = new uPlot(
      {
        width: width(),
        height: 280,
        scales: { x: { time: false } },
        axes: [
          { label: "release", values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? "#" + t : "")) },
          { label: chosen.name },
        ],
        series: [
          { label: "release" },
          { label: chosen.name, stroke: "#8a3ffc", width: 2, points: { size: 8 }, spanGaps: true },
        ],
      },
      [data.seq, chosen.values],
      el,
    );
  }
  select.addEventListener("change", draw);
  window.addEventListener("resize", () => plot && plot.setSize({ width: width(), height: 280 }));
  draw();
})();
