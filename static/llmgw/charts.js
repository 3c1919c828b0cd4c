// Draws the node page's charts with uPlot from the series the server embedded as JSON.
// No inline script: the data sits in a <script type="application/json"> element, and
// this file runs whenever htmx puts a charts section on the page.
(function () {
  "use strict";

  const GIB = 2 ** 30;
  const HEIGHT = 170;
  const PALETTE = ["#2f81f7", "#d29922", "#3fb950", "#db61a2", "#a371f7", "#f85149", "#39c5cf", "#8d96a0"];

  function format(unit, value) {
    if (value === null || value === undefined) return "—";
    if (value === 0) return "0";
    switch (unit) {
      case "percent": return value.toFixed(0) + "%";
      case "bytes": return (value / GIB).toFixed(value >= 10 * GIB ? 0 : 1) + " GiB";
      case "cores":
      case "load": return value.toFixed(value >= 10 ? 0 : 2);
      case "seconds": return value >= 1 ? value.toFixed(1) + " s" : (value * 1000).toFixed(0) + " ms";
      default: return String(Math.round(value * 100) / 100);
    }
  }

  function colours() {
    const dark = window.matchMedia("(prefers-color-scheme: dark)").matches;
    return { text: dark ? "#8d96a0" : "#656d76", grid: dark ? "#30363d" : "#e6eaef", event: dark ? "#e3b341" : "#9a6700" };
  }

  function countPoints(values) {
    let points = 0;
    for (const column of values) for (const v of column) if (v !== null) points++;
    return points;
  }

  // Under the cursor, a series with no point at that instant shows its nearest
  // point within a minute instead of a dash: a young series has few points.
  const SNAP = 4;
  function nearestPoint(u, seriesIdx, hoveredIdx) {
    const values = u.data[seriesIdx];
    if (seriesIdx === 0 || values[hoveredIdx] != null) return hoveredIdx;
    for (let d = 1; d <= SNAP; d++) {
      if (values[hoveredIdx - d] != null) return hoveredIdx - d;
      if (values[hoveredIdx + d] != null) return hoveredIdx + d;
    }
    return hoveredIdx;
  }

  // The node's events as vertical lines on every chart, each with a hover area that
  // shows what happened. The text is the agent's or an operator's: it goes in as
  // text, never as markup, inside a <bdi> so a right-to-left string stays in its box.
  // The same events are listed under the charts, which is where a keyboard or a
  // screen reader finds them; the markers are for the eye and the mouse.
  function timeText(t) {
    const d = new Date(t * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function markerElement(key, event) {
    const marker = document.createElement("span");
    marker.className = "event-marker";
    marker.id = "marker-" + key + "-" + event.id;
    marker.dataset.kind = event.kind;
    marker.setAttribute("aria-hidden", "true");
    const tip = document.createElement("span");
    tip.className = "event-tip";
    const when = document.createElement("time");
    when.textContent = timeText(event.t);
    const text = document.createElement("bdi");
    text.textContent = event.text;
    tip.append(when, " ", text);
    marker.append(tip);
    return marker;
  }

  function eventMarkers(key, events, lineColour) {
    let placed = null;
    return {
      hooks: {
        draw: [(u) => {
          // Made on the first draw, which comes before uPlot's "ready".
          if (placed === null) {
            placed = events.map((event) => [event, u.over.appendChild(markerElement(key, event))]);
          }
          const ctx = u.ctx;
          const { left, top, width, height } = u.bbox;
          ctx.save();
          ctx.strokeStyle = lineColour;
          ctx.lineWidth = Math.max(1, devicePixelRatio);
          ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
          for (const [event, marker] of placed) {
            const x = Math.round(u.valToPos(event.t, "x", true));
            const inside = x >= left && x <= left + width;
            marker.hidden = !inside;
            if (!inside) continue;
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, top + height);
            ctx.stroke();
            // CSSOM, not a style attribute: the site's CSP allows this.
            const cssX = u.valToPos(event.t, "x");
            marker.style.left = cssX + "px";
            marker.classList.toggle("tip-left", cssX > u.over.clientWidth / 2);
          }
          ctx.restore();
        }],
      },
    };
  }

  function plot(figure, chart, times, events) {
    const c = colours();
    const axis = { stroke: c.text, grid: { stroke: c.grid, width: 1 }, ticks: { stroke: c.grid, width: 1 } };
    const options = {
      width: Math.max(figure.clientWidth - 16, 200),
      height: HEIGHT,
      series: [
        { label: "time", value: "{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}" },
        ...chart.series.map((name, i) => ({
          label: name,
          stroke: PALETTE[i % PALETTE.length],
          width: 1.5,
          value: (u, v) => format(chart.unit, v),
          // A young or gappy series is a few points: show them, or nothing would be seen.
          points: { show: countPoints([chart.values[i]]) < 60 },
        })),
      ],
      axes: [axis, { ...axis, size: 64, values: (u, ticks) => ticks.map((v) => format(chart.unit, v)) }],
      scales: { x: { time: true }, y: chart.unit === "percent" ? { range: [0, 100] } : { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
      legend: { live: true },
      cursor: { dataIdx: nearestPoint },
      plugins: [eventMarkers(chart.key, events, c.event)],
    };
    const instance = new uPlot(options, [times, ...chart.values], figure);
    new ResizeObserver(() => instance.setSize({ width: Math.max(figure.clientWidth - 16, 200), height: HEIGHT })).observe(figure);
    return instance;
  }

  function draw(root) {
    const grids = root.matches && root.matches("[data-chart-source]") ? [root] : root.querySelectorAll("[data-chart-source]");
    for (const grid of grids) {
      const source = document.getElementById(grid.dataset.chartSource);
      if (!source) continue;
      const data = JSON.parse(source.textContent);
      for (const chart of data.charts) {
        const figure = grid.querySelector('.chart[data-key="' + chart.key + '"]');
        if (!figure) continue;
        // Read by the browser tests: how many points this chart was handed and drew.
        figure.dataset.points = String(countPoints(chart.values));
        if (chart.series.length && typeof uPlot !== "undefined") {
          plot(figure, chart, data.times, data.events || []);
          figure.dataset.drawn = "true";
        }
      }
    }
  }

  // The charts section swaps with `settle:0ms`, so htmx fires htmx:load in the same
  // task as the swap and the new charts are drawn before the browser lays the page out
  // again: a refresh never shortens the page under the reader, and the window keeps
  // its place. (With htmx's default 20 ms settle, the page is briefly chart-less.)
  document.addEventListener("htmx:load", (event) => draw(event.detail.elt));

  // htmx swaps in only a successful answer, and the charts section keeps polling on
  // its own trigger either way; a failed try only needs saying, in place of the
  // "Loading" line or above charts that are now getting old.
  function reportFailure(event) {
    const section = event.detail.elt;
    if (!section || !section.classList || !section.classList.contains("charts")) return;
    const xhr = event.detail.xhr;
    const why = event.type === "htmx:sendError" || !xhr || !xhr.status
      ? "the server could not be reached"
      : "the server answered HTTP " + xhr.status;
    const loading = section.querySelector(".charts-loading");
    if (loading) loading.remove();
    let note = section.querySelector(".charts-failed");
    if (!note) {
      note = document.createElement("p");
      note.className = "warning charts-failed";
      note.setAttribute("role", "status");
      section.prepend(note);
    }
    note.textContent = "History could not be loaded: " + why + "; trying again every 30 s.";
  }
  document.addEventListener("htmx:responseError", reportFailure);
  document.addEventListener("htmx:sendError", reportFailure);
})();
