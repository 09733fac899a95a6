// tessera's live dashboard: polls /dashboard/data for the points after the
// last one it holds, keeps the last 15 minutes, and draws each panel as an
// SVG line chart. Plain JavaScript, no library, nothing fetched from
// elsewhere. See crates/runtime/src/telemetry/dashboard.rs for the data.
"use strict";

(function () {
  var POLL_MS = 1000;
  var RETRY_MS = 2000;
  var WIDTH = 600, HEIGHT = 180;
  var LEFT = 64, RIGHT = 8, TOP = 8, BOTTOM = 20;
  var COLORS = ["#2559c4", "#d9480f", "#2b8a3e", "#ae3ec9", "#e67700", "#0c8599", "#c2255c", "#5c940d"];
  var SVG_NS = "http://www.w3.org/2000/svg";

  var panels = new Map(); // id -> {title, unit, lines: Map(name -> [[t, v], ...])}
  var since = 0;
  var spanMs = 15 * 60 * 1000;
  var stepMs = 1000;

  function formatValue(value, unit) {
    if (value === null || value === undefined || !isFinite(value)) return "–";
    if (unit === "seconds") {
      if (value === 0) return "0 s";
      if (value < 0.001) return "<1 ms";
      if (value < 1) return (value * 1000).toFixed(value < 0.01 ? 1 : 0) + " ms";
      return value.toFixed(value < 10 ? 2 : 1) + " s";
    }
    if (unit === "bytes") {
      var units = ["B", "KiB", "MiB", "GiB", "TiB"];
      var index = 0;
      while (Math.abs(value) >= 1024 && index < units.length - 1) { value /= 1024; index++; }
      return (index === 0 ? value.toFixed(0) : value.toFixed(1)) + " " + units[index];
    }
    var suffix = unit === "per_second" ? "/s" : "";
    var abs = Math.abs(value);
    if (abs >= 1e9) return (value / 1e9).toFixed(2) + "G" + suffix;
    if (abs >= 1e6) return (value / 1e6).toFixed(2) + "M" + suffix;
    if (abs >= 1e3) return (value / 1e3).toFixed(1) + "k" + suffix;
    if (abs >= 10 || value === 0) return value.toFixed(0) + suffix;
    return value.toFixed(2) + suffix;
  }

  function merge(data) {
    spanMs = data.span_ms || spanMs;
    stepMs = data.step_ms || stepMs;
    document.getElementById("daemon").textContent = data.daemon;
    data.panels.forEach(function (incoming) {
      var panel = panels.get(incoming.id);
      if (!panel) {
        panel = { title: incoming.title, unit: incoming.unit, lines: new Map() };
        panels.set(incoming.id, panel);
      }
      incoming.lines.forEach(function (line) {
        var points = panel.lines.get(line.name);
        if (!points) { points = []; panel.lines.set(line.name, points); }
        line.points.forEach(function (point) {
          points.push(point);
          if (point[0] > since) since = point[0];
        });
      });
    });
    var oldest = data.now - spanMs;
    panels.forEach(function (panel) {
      panel.lines.forEach(function (points, name) {
        while (points.length && points[0][0] <= oldest) points.shift();
        if (!points.length) panel.lines.delete(name);
      });
    });
  }

  function element(name, attributes, parent) {
    var node = document.createElementNS(SVG_NS, name);
    Object.keys(attributes).forEach(function (key) { node.setAttribute(key, attributes[key]); });
    if (parent) parent.appendChild(node);
    return node;
  }

  function section(id, panel) {
    var node = document.getElementById("panel-" + id);
    if (node) return node;
    node = document.createElement("section");
    node.className = "panel";
    node.id = "panel-" + id;
    node.setAttribute("data-panel", id);
    node.setAttribute("data-unit", panel.unit);
    var title = document.createElement("h2");
    title.textContent = panel.title;
    node.appendChild(title);
    var svg = element("svg", { viewBox: "0 0 " + WIDTH + " " + HEIGHT, preserveAspectRatio: "none", role: "img" });
    svg.setAttribute("aria-label", panel.title);
    node.appendChild(svg);
    var legend = document.createElement("ul");
    legend.className = "legend";
    node.appendChild(legend);
    document.getElementById("panels").appendChild(node);
    return node;
  }

  function draw(id, panel, now) {
    var node = section(id, panel);
    var svg = node.querySelector("svg");
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var legend = node.querySelector(".legend");
    while (legend.firstChild) legend.removeChild(legend.firstChild);

    // In a panel of many lines (drops by reason), the lines that stayed at 0 are
    // left out of the chart and the legend, and counted in one legend entry.
    var lines = new Map(), quiet = 0;
    panel.lines.forEach(function (points, name) {
      var moved = points.some(function (point) { return point[1] !== null && point[1] !== 0; });
      if (panel.lines.size > 3 && !moved) { quiet++; } else { lines.set(name, points); }
    });
    var start = now - spanMs;
    var max = 0, count = 0;
    lines.forEach(function (points) {
      points.forEach(function (point) {
        if (point[1] !== null && point[1] > max) max = point[1];
        count++;
      });
    });
    node.setAttribute("data-points", String(count));
    var top = max > 0 ? max * 1.1 : 1;
    var plotWidth = WIDTH - LEFT - RIGHT, plotHeight = HEIGHT - TOP - BOTTOM;
    var x = function (t) { return LEFT + ((t - start) / spanMs) * plotWidth; };
    var y = function (v) { return TOP + plotHeight - (v / top) * plotHeight; };

    [0, 0.5, 1].forEach(function (fraction) {
      var value = top * fraction;
      element("line", { class: "grid", x1: LEFT, x2: WIDTH - RIGHT, y1: y(value), y2: y(value) }, svg);
      element("text", { x: LEFT - 6, y: y(value) + 4, "text-anchor": "end" }, svg).textContent =
        formatValue(value, panel.unit);
    });
    [15, 10, 5, 0].forEach(function (minutes) {
      var at = x(now - minutes * 60000);
      element("text", { x: at, y: HEIGHT - 4, "text-anchor": minutes === 0 ? "end" : "middle" }, svg).textContent =
        minutes === 0 ? "now" : "−" + minutes + " min";
    });
    if (count === 0) {
      element("text", { class: "empty", x: LEFT + plotWidth / 2, y: TOP + plotHeight / 2, "text-anchor": "middle" }, svg)
        .textContent = quiet > 0 ? "all at 0" : "no data yet";
    }

    var index = 0;
    lines.forEach(function (points, name) {
      var color = COLORS[index++ % COLORS.length];
      // A gap of more than three steps breaks the line.
      var runs = [], run = [], last = null;
      points.forEach(function (point) {
        if (point[1] === null) return;
        if (last !== null && point[0] - last > 3 * stepMs && run.length) { runs.push(run); run = []; }
        run.push(x(point[0]).toFixed(1) + "," + y(point[1]).toFixed(1));
        last = point[0];
      });
      if (run.length) runs.push(run);
      runs.forEach(function (coordinates) {
        if (coordinates.length === 1) coordinates.push(coordinates[0]);
        element("polyline", { points: coordinates.join(" "), stroke: color }, svg);
      });
      var latest = points.length ? points[points.length - 1][1] : null;
      var item = document.createElement("li");
      item.setAttribute("data-line", name);
      item.setAttribute("data-latest", latest === null ? "" : String(latest));
      var swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(name));
      var value = document.createElement("span");
      value.className = "value";
      value.textContent = formatValue(latest, panel.unit);
      item.appendChild(value);
      legend.appendChild(item);
    });
    if (quiet > 0) {
      var rest = document.createElement("li");
      rest.className = "quiet";
      rest.setAttribute("data-quiet", String(quiet));
      rest.textContent = (lines.size ? quiet + " more at 0" : "all " + quiet + " at 0");
      legend.appendChild(rest);
    }
  }

  function setStatus(state, text) {
    var status = document.getElementById("status");
    status.setAttribute("data-state", state);
    status.textContent = text;
  }

  function poll() {
    // From the origin, not the page's URL: a page opened with a user and password in its URL
    // (a telemetry port behind basic auth) cannot fetch a URL that holds credentials, and
    // the browser sends the ones it was given for the origin anyway.
    fetch(location.origin + "/dashboard/data?since=" + since, { cache: "no-store" })
      .then(function (response) {
        if (!response.ok) throw new Error("/dashboard/data answered " + response.status);
        return response.json();
      })
      .then(function (data) {
        merge(data);
        panels.forEach(function (panel, id) { draw(id, panel, data.now); });
        setStatus("live", "updated " + new Date(data.now).toLocaleTimeString() + " · " + panels.size + " charts");
        setTimeout(poll, POLL_MS);
      })
      .catch(function (error) {
        setStatus("error", "cannot reach the daemon (" + error.message + "); retrying");
        setTimeout(poll, RETRY_MS);
      });
  }

  poll();
})();
