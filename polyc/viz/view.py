"""An interactive view of iteration domains in a notebook: 2-D or 3-D, rotate and zoom, colour
by statement, execution order, tile or parallel iteration, filter dependence kinds, and step
through (or play) the order the compiled schedule runs the instances in.

    view = polyc.viz.view_domain(kernel, {"M": 4, "K": 4, "N": 4})   # first three indices, 3-D
    view                                   # in Jupyter: drag to rotate, wheel to zoom, ▶ to play
    view.save("matmul.html")               # one self-contained page

The view is plain HTML, a canvas and a little JavaScript with its data inline: no library, no
network, so it works the same in JupyterLab, in the classic notebook and in a notebook exported
to static HTML by nbconvert.  The data is :class:`polyc.viz.instances.Instances`, the same the
static plots (:func:`polyc.viz.plot_domain`) draw.
"""

from __future__ import annotations

import html
import itertools
import json
from dataclasses import dataclass

from polyc.viz.domain import KIND_COLOURS, STATEMENT_COLOURS
from polyc.viz.instances import KINDS, Instances, collect, layout
from polyc.viz.page import write_page

_ids = itertools.count()


@dataclass
class DomainView:
    instances: Instances
    width: int = 640
    height: int = 440

    def data(self) -> dict:
        """What the page draws: points at their index values (:func:`polyc.viz.instances.layout`),
        the axes' names and ticks, arrows as pairs of point numbers, and per point its order,
        tile and parallel iteration."""
        points: list[dict] = []
        arrows: list[list] = []
        statements: list[dict] = []
        number: dict = {}
        counts = [len(dict.fromkeys(s.dims)) for s in self.instances.statements]
        flat = all(count == 1 for count in counts) and len(counts) > 1
        dims = 2 if flat else max(counts, default=1)
        position, ticks = layout(self.instances.statements, dims)
        for k, s in enumerate(self.instances.statements):
            axes = list(dict.fromkeys(s.dims))
            for p in s.shown_points():
                key = (s.name, p)
                number[key] = len(points)
                tile = self.instances.tile.get(key)
                points.append(
                    {
                        "s": k,
                        "c": list(position[key]),
                        "label": f"{s.name}({', '.join(f'{i}={v}' for i, v in zip(s.indices, p))})",
                        "order": self.instances.order.get(key, 0),
                        "tile": None if tile is None else list(tile),
                        "par": self.instances.parallel.get(key),
                    }
                )
            statements.append(
                {
                    "name": s.name,
                    "colour": STATEMENT_COLOURS[k % len(STATEMENT_COLOURS)],
                    "axes": [s.indices[a] for a in axes],
                    "fixed": ", ".join(f"{i}={v}" for i, v in s.fixed.items()),
                }
            )
        names = [
            " / ".join(
                dict.fromkeys(
                    s.indices[a] for s in self.instances.statements for a in list(dict.fromkeys(s.dims))[d : d + 1]
                )
            )
            if not (flat and d > 0)
            else ""
            for d in range(dims)
        ]
        for arrow in self.instances.arrows:
            kind, source, a, sink, b = arrow
            if (source, a) in number and (sink, b) in number:
                arrows.append(
                    [
                        kind,
                        number[(source, a)],
                        number[(sink, b)],
                        bool(self.instances.tile) and self.instances.crosses_tiles(arrow),
                        (source, a, sink, b) in self.instances.violated,
                    ]
                )
        return {
            "title": self.instances.title,
            "dims": dims,
            "points": points,
            "arrows": arrows,
            "statements": statements,
            "kinds": {k: KIND_COLOURS[k] for k in KINDS},
            "axisNames": names,
            "ticks": [[[position, label] for position, label in axis] for axis in ticks],
            "arrowsNote": self.instances.arrows_note if self.instances.arrows else "",
            "parallelLoop": self.instances.parallel_loop,
            "tileSizes": list(self.instances.tile_sizes),
        }

    def html(self) -> str:
        """The view as an HTML fragment (a ``div`` and its script)."""
        view_id = f"polyc-view-{next(_ids)}-{id(self) & 0xFFFF:x}"
        payload = self.data()
        data = json.dumps(payload).replace("</", "<\\/")
        kinds = sorted({a[0] for a in self.instances.arrows})
        checks = "".join(
            f'<label style="color:{KIND_COLOURS[k]}"><input type="checkbox" data-kind="{k}" checked> {k}</label> '
            for k in kinds
        )
        colourings = [("statement", "statement"), ("order", "execution order")]
        if self.instances.schedule_source == "user":  # a schedule of one's own: its order first
            colourings.reverse()
        if self.instances.tile:
            colourings.append(("tile", "tile"))
        if self.instances.parallel:
            colourings.append(("par", "parallel iteration"))
        options = "".join(f'<option value="{v}">{html.escape(t)}</option>' for v, t in colourings)
        tiles = (
            '<label><input type="checkbox" data-role="hulls"> tile hulls</label> '
            '<label><input type="checkbox" data-role="between"> only arrows between tiles</label> '
            if self.instances.tile
            else ""
        )
        count = len(payload["points"])
        return f"""<div class="polyc-view" id="{view_id}" style="font:12px sans-serif;max-width:{self.width}px">
<div style="font-weight:bold;margin-bottom:2px">{html.escape(self.instances.title)}</div>
<div>colour <select data-role="colour">{options}</select> {checks}{tiles}</div>
<div><button data-role="play" type="button">&#9654;</button>
<input type="range" data-role="step" min="0" max="{count}" value="{count}" style="width:60%">
<span data-role="step-text"></span></div>
<canvas width="{self.width}" height="{self.height}" style="border:1px solid #ddd;cursor:grab"></canvas>
<div data-role="info" style="min-height:1.3em;color:#333">drag to rotate, wheel to zoom, hover a point</div>
<script type="application/json" data-role="data">{data}</script>
</div>
<script>{_SCRIPT.replace("@ID@", view_id)}</script>"""

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path) -> None:
        """Write the view as a self-contained HTML page."""
        write_page(path, self.instances.title, self.html())


def view_domain(
    kernel,
    sizes: dict,
    statements=None,
    dims=None,
    fixed: dict | None = None,
    kinds=KINDS,
    width: int = 640,
    height: int = 440,
    schedule=None,
    violated=None,
) -> DomainView:
    """An interactive view of the instances of ``statements`` of ``kernel`` at ``sizes`` in up
    to three ``dims`` (default: each statement's first three indices; the others are fixed at
    ``fixed`` or their lowest value), with the dependence arrows of ``kinds`` between them.
    ``schedule`` and ``violated`` as for :func:`polyc.viz.plot_domain`."""
    return DomainView(
        collect(kernel, sizes, statements, dims, fixed, kinds, max_dims=3, schedule=schedule, violated=violated),
        width,
        height,
    )


# The page's script: orthographic projection of the points onto a 2-D canvas, redrawn on every
# change.  It finds its own elements by the view's id and wires them once.
_SCRIPT = r"""
(function () {
  var root = document.getElementById("@ID@");
  if (!root || root.getAttribute("data-polyc-wired")) return;
  root.setAttribute("data-polyc-wired", "1");
  var data = JSON.parse(root.querySelector('[data-role="data"]').textContent);
  var canvas = root.querySelector("canvas"), ctx = canvas.getContext("2d");
  var colourBy = root.querySelector('[data-role="colour"]'), step = root.querySelector('[data-role="step"]');
  var stepText = root.querySelector('[data-role="step-text"]'), info = root.querySelector('[data-role="info"]');
  var between = root.querySelector('[data-role="between"]'), play = root.querySelector('[data-role="play"]');
  var hulls = root.querySelector('[data-role="hulls"]');
  var three = data.dims === 3;
  var yaw = three ? 0.65 : 0, pitch = three ? 0.45 : 0, zoom = 1;
  var n = data.points.length, palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var low = [Infinity, Infinity, Infinity], high = [-Infinity, -Infinity, -Infinity];
  data.points.forEach(function (p) {
    for (var d = 0; d < data.dims; d++) { low[d] = Math.min(low[d], p.c[d]); high[d] = Math.max(high[d], p.c[d]); }
  });
  var centre = [0, 0, 0], span = 1;
  for (var d = 0; d < data.dims; d++) { centre[d] = (low[d] + high[d]) / 2; span = Math.max(span, high[d] - low[d]); }
  var tileKeys = {}, tileCount = 0;
  data.points.forEach(function (p) {
    if (p.tile !== null) { var key = p.tile.join(","); if (!(key in tileKeys)) tileKeys[key] = tileCount++; }
  });
  var screen = [];

  function project(c) {
    var x = c[0] - centre[0], y = (data.dims > 1 ? c[1] - centre[1] : 0), z = (data.dims > 2 ? c[2] - centre[2] : 0);
    var x1 = Math.cos(yaw) * x + Math.sin(yaw) * z, z1 = -Math.sin(yaw) * x + Math.cos(yaw) * z;
    var y1 = Math.cos(pitch) * y - Math.sin(pitch) * z1, depth = Math.sin(pitch) * y + Math.cos(pitch) * z1;
    var scale = zoom * 0.7 * Math.min(canvas.width, canvas.height) / (span + 1);
    return [canvas.width / 2 + scale * x1, canvas.height / 2 - scale * y1, depth];
  }
  function colour(p) {
    var mode = colourBy.value;
    if (mode === "order") return "hsl(" + Math.round(240 - 240 * p.order / Math.max(1, n - 1)) + ",75%,45%)";
    if (mode === "tile" && p.tile !== null) return palette[tileKeys[p.tile.join(",")] % palette.length];
    if (mode === "par" && p.par !== null) return palette[p.par % palette.length];
    return data.statements[p.s].colour;
  }
  function kindShown(kind) {
    var box = root.querySelector('input[data-kind="' + kind + '"]');
    return !box || box.checked;
  }
  function axis(from, to) {
    var a = project(from), b = project(to);
    ctx.strokeStyle = "#bbb"; ctx.beginPath(); ctx.moveTo(a[0], a[1]); ctx.lineTo(b[0], b[1]); ctx.stroke();
    return b;
  }
  function arrow(a, b, colourText, alpha) {
    var dx = b[0] - a[0], dy = b[1] - a[1], length = Math.sqrt(dx * dx + dy * dy);
    if (length < 1) return;
    var ux = dx / length, uy = dy / length, tipX = b[0] - ux * 5, tipY = b[1] - uy * 5;
    ctx.globalAlpha = alpha; ctx.strokeStyle = colourText; ctx.fillStyle = colourText;
    ctx.beginPath(); ctx.moveTo(a[0] + ux * 5, a[1] + uy * 5); ctx.lineTo(tipX, tipY); ctx.stroke();
    ctx.beginPath(); ctx.moveTo(tipX, tipY); ctx.lineTo(tipX - ux * 6 - uy * 3, tipY - uy * 6 + ux * 3);
    ctx.lineTo(tipX - ux * 6 + uy * 3, tipY - uy * 6 - ux * 3); ctx.closePath(); ctx.fill();
    ctx.globalAlpha = 1;
  }
  // The convex hull of 2-D points (monotone chain), counter-clockwise.
  function hull(points) {
    points = points.slice().sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; });
    if (points.length < 3) return points;
    function cross(o, a, b) { return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]); }
    function half(list) {
      var chain = [];
      list.forEach(function (p) {
        while (chain.length >= 2 && cross(chain[chain.length - 2], chain[chain.length - 1], p) <= 0) chain.pop();
        chain.push(p);
      });
      chain.pop();
      return chain;
    }
    return half(points).concat(half(points.slice().reverse()));
  }
  // Each tile of each statement as the hull of its points on the screen, padded a little.
  function drawHulls() {
    var groups = {};
    data.points.forEach(function (p, i) {
      if (p.tile === null) return;
      var key = p.s + ":" + p.tile.join(",");
      (groups[key] = groups[key] || []).push(screen[i]);
    });
    Object.keys(groups).forEach(function (key) {
      var outline = hull(groups[key]), cx = 0, cy = 0;
      outline.forEach(function (p) { cx += p[0] / outline.length; cy += p[1] / outline.length; });
      ctx.beginPath();
      outline.forEach(function (p, k) {
        var dx = p[0] - cx, dy = p[1] - cy, length = Math.max(Math.sqrt(dx * dx + dy * dy), 1e-6);
        var x = p[0] + 9 * dx / length, y = p[1] + 9 * dy / length;
        if (k === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      });
      if (outline.length < 3) {  // one point or a segment: a box around it
        var xs = outline.map(function (p) { return p[0]; }), ys = outline.map(function (p) { return p[1]; });
        var x0 = Math.min.apply(null, xs) - 9, y0 = Math.min.apply(null, ys) - 9;
        ctx.rect(x0, y0, Math.max.apply(null, xs) + 9 - x0, Math.max.apply(null, ys) + 9 - y0);
      }
      ctx.closePath();
      ctx.fillStyle = "rgba(255, 245, 157, 0.35)"; ctx.strokeStyle = "#f9a825";
      ctx.fill(); ctx.stroke();
    });
  }
  function draw() {
    var done = +step.value;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.font = "11px sans-serif";
    screen = data.points.map(function (p) { return project(p.c); });
    var origin = [low[0] - 0.5, low[1] - 0.5, low[2] - 0.5], labels = [], drawnTicks = [];
    for (var d = 0; d < data.dims; d++) {
      var end = origin.slice(); end[d] = high[d] + 1.2;
      labels.push([axis(origin.slice(0, 3), end), data.axisNames[d] || ""]);
      // Ticks: the index values of the points at each position, beside the axis.
      ctx.fillStyle = "#666"; ctx.font = "10px sans-serif";
      drawnTicks.push(data.ticks[d].map(function (tick) {
        var at = origin.slice(); at[d] = tick[0];
        var s = project(at);
        ctx.fillText(tick[1], s[0] + (d === 0 ? -3 : -16), s[1] + (d === 0 ? 14 : 4));
        return tick[1];
      }));
    }
    root.setAttribute("data-polyc-ticks", JSON.stringify(drawnTicks));
    if (hulls && hulls.checked) drawHulls();
    data.arrows.forEach(function (a) {
      if (!kindShown(a[0]) || (between && between.checked && !a[3])) return;
      var visible = data.points[a[1]].order < done && data.points[a[2]].order < done;
      if (a[4]) { ctx.lineWidth = 2.5; arrow(screen[a[1]], screen[a[2]], "#ff1744", 1); ctx.lineWidth = 1; return; }
      arrow(screen[a[1]], screen[a[2]], data.kinds[a[0]], visible ? 0.75 : 0.12);
    });
    var byDepth = data.points.map(function (_, i) { return i; });
    byDepth.sort(function (i, j) { return screen[i][2] - screen[j][2]; });
    byDepth.forEach(function (i) {
      var p = data.points[i], s = screen[i];
      ctx.globalAlpha = p.order < done ? 1 : 0.15;
      ctx.fillStyle = colour(p);
      ctx.beginPath(); ctx.arc(s[0], s[1], 4.5, 0, 2 * Math.PI); ctx.fill();
      if (p.order === done - 1 && done < n) {
        ctx.strokeStyle = "#000"; ctx.lineWidth = 2;
        ctx.beginPath(); ctx.arc(s[0], s[1], 7.5, 0, 2 * Math.PI); ctx.stroke(); ctx.lineWidth = 1;
      }
    });
    ctx.globalAlpha = 1;
    ctx.font = "bold 12px sans-serif"; ctx.fillStyle = "#333";
    labels.forEach(function (l) { ctx.fillText(l[1], l[0][0] + 4, l[0][1] - 4); });
    ctx.font = "11px sans-serif";
    var names = data.statements.map(function (s) { return s.name + (s.fixed ? " at " + s.fixed : ""); });
    ctx.fillStyle = "#333"; ctx.fillText(names.join("   "), 6, 14);
    if (data.arrowsNote) { ctx.fillStyle = "#666"; ctx.fillText(data.arrowsNote, 6, canvas.height - 6); }
    if (colourBy.value === "par") ctx.fillText("colour: iteration of the parallel loop " + data.parallelLoop, 6, 28);
    if (colourBy.value === "tile") ctx.fillText("colour: tile (sizes " + data.tileSizes.join(" x ") + ")", 6, 28);
    stepText.textContent = done + " of " + n + " instances run";
    root.setAttribute("data-polyc-drawn", "1");
  }
  var dragging = null, timer = null;
  canvas.addEventListener("mousedown", function (e) { dragging = [e.clientX, e.clientY]; canvas.style.cursor = "grabbing"; });
  window.addEventListener("mouseup", function () { dragging = null; canvas.style.cursor = "grab"; });
  canvas.addEventListener("mousemove", function (e) {
    var box = canvas.getBoundingClientRect(), x = e.clientX - box.left, y = e.clientY - box.top;
    if (dragging) {
      yaw += (e.clientX - dragging[0]) * 0.01; pitch += (e.clientY - dragging[1]) * 0.01;
      dragging = [e.clientX, e.clientY]; draw(); return;
    }
    var best = -1, bestDistance = 64;
    screen.forEach(function (s, i) {
      var d = (s[0] - x) * (s[0] - x) + (s[1] - y) * (s[1] - y);
      if (d < bestDistance) { best = i; bestDistance = d; }
    });
    if (best >= 0) {
      var p = data.points[best], parts = [p.label, "runs " + (p.order + 1) + " of " + n];
      if (p.tile !== null) parts.push("tile (" + p.tile.join(", ") + ")");
      if (p.par !== null) parts.push("parallel iteration " + p.par);
      info.textContent = parts.join(" \u00b7 ");
    }
  });
  canvas.addEventListener("wheel", function (e) {
    e.preventDefault(); zoom *= e.deltaY < 0 ? 1.1 : 1 / 1.1; draw();
  }, {passive: false});
  play.addEventListener("click", function () {
    if (timer) { clearInterval(timer); timer = null; play.innerHTML = "&#9654;"; return; }
    if (+step.value >= n) step.value = 0;
    play.innerHTML = "&#10074;&#10074;";
    timer = setInterval(function () {
      step.value = +step.value + 1; draw();
      if (+step.value >= n) { clearInterval(timer); timer = null; play.innerHTML = "&#9654;"; }
    }, Math.max(15, Math.min(250, 6000 / Math.max(1, n))));
  });
  [colourBy, step, between].forEach(function (el) { if (el) el.addEventListener("input", draw); });
  if (hulls) hulls.addEventListener("change", draw);
  root.querySelectorAll("input[data-kind]").forEach(function (el) { el.addEventListener("change", draw); });
  if (between) between.addEventListener("change", draw);
  colourBy.addEventListener("change", draw);
  draw();
})();
"""
