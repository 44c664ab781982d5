// llmgw admin pages: the little they do in the browser, from this file only (the CSP
// allows no inline script). Pages work for reading without it.
(function () {
  "use strict";

  function pad(n) { return String(n).padStart(2, "0"); }
  function clock(seconds) {
    var d = new Date(seconds * 1000);
    return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
  }

  // A refresh that failed: say since when the control plane has not answered.
  function markStale() {
    var text = document.body.getAttribute("data-stale") || "";
    document.querySelectorAll(".updated").forEach(function (el) {
      var at = parseFloat(el.getAttribute("data-at") || "0");
      el.classList.add("stale");
      el.textContent = text.replace("{time}", clock(at) + " UTC");
    });
  }

  function copyButtons(root) {
    root.querySelectorAll("button.copy").forEach(function (button) {
      button.addEventListener("click", function () {
        var source = document.querySelector(button.getAttribute("data-copy"));
        if (!source || !navigator.clipboard) { return; }
        navigator.clipboard.writeText(source.textContent.trim()).then(function () {
          button.textContent = button.getAttribute("data-done") || "Copied";
        });
      });
    });
  }

  // The node page's charts: the last hour from /admin/nodes/ID/history, drawn by uPlot.
  function charts(root) {
    root.querySelectorAll(".charts[data-history]").forEach(function (box) {
      if (typeof uPlot === "undefined") { return; }
      var labels = JSON.parse(box.getAttribute("data-labels") || "{}");
      fetch(box.getAttribute("data-history"), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (h) { if (h) { draw(box, h, labels); } });
    });
  }

  // The overview's charts: the gateway's last hour from /admin/gateway.json.
  function gatewayCharts(root) {
    root.querySelectorAll(".charts[data-gateway]").forEach(function (box) {
      if (typeof uPlot === "undefined") { return; }
      var labels = JSON.parse(box.getAttribute("data-labels") || "{}");
      fetch(box.getAttribute("data-gateway"), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (g) {
          if (!g) { return; }
          box.textContent = "";
          plot(box, labels.requests || "Requests", g.t, [
            { label: labels.requests || "Requests", stroke: COLOURS[0], data: g.requests },
            { label: labels.errors || "Errors", stroke: COLOURS[1], data: g.errors },
          ], "");
          plot(box, labels.ttft || "Time to first token", g.t, [
            { label: labels.ttft || "Time to first token", stroke: COLOURS[2], data: g.ttft_ms },
          ], " ms");
        });
    });
  }

  function plot(box, title, t, series, unit) {
    var el = document.createElement("div");
    el.className = "chart";
    var h = document.createElement("h3");
    h.textContent = title;
    el.appendChild(h);
    box.appendChild(el);
    var width = Math.max(280, Math.min(640, box.clientWidth - 24));
    var opts = {
      width: width, height: 160,
      series: [{}].concat(series.map(function (s) {
        return { label: s.label, stroke: s.stroke, spanGaps: false,
                 value: function (u, v) { return v == null ? "—" : v + unit; } };
      })),
      axes: [{}, { size: 50 }],
      legend: { show: true },
    };
    new uPlot(opts, [t].concat(series.map(function (s) { return s.data; })), el);
  }

  var COLOURS = ["#2b59c3", "#b42318", "#1a7f37", "#9a6700", "#7a3fb8", "#0b7a8a", "#c2410c", "#4b5563"];

  function draw(box, h, labels) {
    box.textContent = "";
    var t = h.t;
    function share(used, total) {
      return used.map(function (u, i) { return u == null || !total[i] ? null : Math.round(1000 * u / total[i]) / 10; });
    }
    plot(box, (labels.cpu || "CPU") + " / " + (labels.ram || "RAM"), t, [
      { label: labels.cpu || "CPU", stroke: COLOURS[0], data: h.cpu_percent },
      { label: labels.ram || "RAM", stroke: COLOURS[1], data: share(h.memory_used, h.memory_total) },
    ], " %");
    var gpus = h.gpus || [];
    if (!gpus.length) { return; }
    var figures = [
      ["utilization", labels.utilization || "Busy", " %", function (g) { return g.utilization; }],
      ["memory", labels.memory || "Memory", " %", function (g) { return share(g.memory_used, g.memory_total); }],
      ["power", labels.power || "Power", " W", function (g) { return g.power; }],
      ["temperature", labels.temperature || "Temperature", " °C", function (g) { return g.temperature; }],
    ];
    figures.forEach(function (f) {
      var series = gpus.map(function (g, i) {
        return { label: String(g.index != null ? g.index : i), stroke: COLOURS[i % COLOURS.length], data: f[3](g) };
      });
      var read = series.some(function (s) { return s.data.some(function (v) { return v != null; }); });
      if (read) { plot(box, f[1], t, series, f[2]); }
    });
  }

  // A followed log shows its newest lines: scrolled to the end after each refresh.
  function logEnd(root) {
    root.querySelectorAll("pre.log").forEach(function (pre) { pre.scrollTop = pre.scrollHeight; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    copyButtons(document);
    charts(document);
    gatewayCharts(document);
    logEnd(document);
    document.body.addEventListener("htmx:afterSwap", function (e) { logEnd(e.target.parentNode || document); });
    document.body.addEventListener("htmx:sendError", markStale);
    document.body.addEventListener("htmx:responseError", markStale);
    document.body.addEventListener("htmx:afterSwap", function (e) { copyButtons(e.target); });
  });
})();
