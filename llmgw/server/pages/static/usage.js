// The Usage page's chart: tokens per day over the range asked for, one line per model,
// from /admin/usage.json (the URL in the section's data-usage), drawn by uPlot. The
// table below it has the same figures without JavaScript.
(function () {
  "use strict";

  var COLOURS = ["#2b59c3", "#b42318", "#1a7f37", "#9a6700", "#7a3fb8", "#0b7a8a", "#c2410c", "#4b5563"];

  function draw(box, u) {
    box.textContent = "";
    var el = document.createElement("div");
    el.className = "chart";
    var h = document.createElement("h3");
    h.textContent = box.getAttribute("data-title") || "Tokens per day";
    el.appendChild(h);
    box.appendChild(el);
    var series = u.series.length ? u.series : [{ label: box.getAttribute("data-total") || "All models", data: u.t.map(function () { return 0; }) }];
    var width = Math.max(280, box.clientWidth - 24);
    var opts = {
      width: width, height: 220,
      series: [{ label: box.getAttribute("data-day") || "Day",
                 value: function (_, v) { return v == null ? "—" : new Date(v * 1000).toISOString().slice(0, 10); } }].concat(series.map(function (s, i) {
        return { label: s.label, stroke: COLOURS[i % COLOURS.length], width: 2,
                 points: { show: u.t.length <= 62 },
                 value: function (_, v) { return v == null ? "—" : String(v); } };
      })),
      axes: [{}, { size: 60 }],
      scales: { x: { time: true } },
      legend: { show: true },
    };
    var plot = new uPlot(opts, [u.t].concat(series.map(function (s) { return s.data; })), el);
    window.addEventListener("resize", function () {
      plot.setSize({ width: Math.max(280, box.clientWidth - 24), height: 220 });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll(".usage-chart[data-usage]").forEach(function (box) {
      if (typeof uPlot === "undefined") { return; }
      fetch(box.getAttribute("data-usage"), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (u) { if (u) { draw(box, u); } });
    });
  });
})();
