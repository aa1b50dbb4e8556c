// The page's two charts (Chart.js, vendored): acceptance by draft position, this request's
// beside the server's, and this request's acceptance over its verify steps. The page works
// without them. Exposed as window.TandemCharts.create(read), where read() returns
// {stats: RequestStats or null, server: serverTotals() or null}; update() redraws.
(function (root) {
  "use strict";

  function create(read) {
    if (typeof Chart === "undefined") return {update() {}};
    Chart.defaults.font.size = 11;
    const common = {animation: false, responsive: true, maintainAspectRatio: false};
    const percentAxis = {min: 0, max: 100, ticks: {callback: (v) => v + "%"}};
    const byPosition = new Chart(document.getElementById("chart-position"), {
      type: "bar",
      data: {labels: [], datasets: [
        {label: "this request", data: [], backgroundColor: "#3fa66b"},
        {label: "server total", data: [], backgroundColor: "#8c9bb5"},
      ]},
      options: Object.assign({}, common, {scales: {y: percentAxis,
        x: {title: {display: true, text: "draft position"}}}}),
    });
    const overTime = new Chart(document.getElementById("chart-time"), {
      type: "line",
      data: {labels: [], datasets: [
        {label: "cumulative", data: [], borderColor: "#2f6fd6", pointRadius: 0, borderWidth: 2},
        {label: "last 8 steps", data: [], borderColor: "#e08a2c", pointRadius: 0, borderWidth: 1.5},
      ]},
      options: Object.assign({}, common, {scales: {y: percentAxis,
        x: {title: {display: true, text: "verify step"}, ticks: {maxTicksLimit: 8}}}}),
    });
    let pending = false;
    function draw() {
      pending = false;
      const {stats, server} = read();
      const theirs = server && server.hasSpec ? server.positionRates : [];
      const mine = stats ? stats.positionRates() : [];
      const n = Math.max(theirs.length, mine.length);
      byPosition.data.labels = Array.from({length: n}, (_, i) => String(i + 1));
      byPosition.data.datasets[0].data = Array.from({length: n}, (_, i) => pct(mine[i]));
      byPosition.data.datasets[1].data = Array.from({length: n}, (_, i) => pct(theirs[i]));
      byPosition.update();
      const steps = stats ? stats.timeline : [];
      overTime.data.labels = steps.map((t) => t.step);
      overTime.data.datasets[0].data = steps.map((t) => pct(t.rate));
      overTime.data.datasets[1].data = steps.map((t) => pct(t.windowRate));
      overTime.update();
    }
    function pct(x) { return x === null || x === undefined ? null : 100 * x; }
    // At most one redraw per frame however many tokens arrive.
    return {update() { if (!pending) { pending = true; requestAnimationFrame(draw); } }};
  }

  root.TandemCharts = {create};
})(window);
