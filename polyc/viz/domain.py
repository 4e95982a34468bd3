"""Iteration domains, dependences and execution order, as points and arrows (matplotlib).

    plot = polyc.viz.plot_domain(kernel, {"N": 6, "M": 5})        # every statement, first two indices
    plot = polyc.viz.plot_domain(kernel, sizes, dims=("m", "r_k"), fixed={"n": 0}, order=True)
    plot.save("domain.svg")                                         # or .png; notebooks show it inline

Every point is an instance of a statement at the given (small) sizes, enumerated by isl; every
arrow is a pair of the dependence relation (coloured by kind: flow, anti, output, reduction)
between two plotted points.  A statement with more than two indices is shown as the 2-D slice
at ``fixed`` values of the others (default: their lowest), named in the title.  Several
statements are drawn side by side, each in its own colour, as Clint does.  ``order=True``
numbers the points in the order the compiled schedule runs them; ``tiles=True`` draws the tiles
of the compiled schedule as hulls with only the dependences between tiles (islplot's view);
``parallel=True`` colours the points by the iteration of the parallel loop that runs them.
For 3-D, rotation, filters and a step-through of the order, see :mod:`polyc.viz.view`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from polyc.viz.instances import KINDS, Instances, StatementPoints, collect, integer_ticks, layout

KIND_COLOURS = {"flow": "#1565c0", "anti": "#c62828", "output": "#6a1b9a", "reduction": "#2e7d32"}
VIOLATED_COLOUR = "#ff1744"
STATEMENT_COLOURS = ("#37474f", "#ef6c00", "#00838f", "#ad1457", "#558b2f", "#4527a0")
TILE_COLOURS = ("#fff176", "#80deea", "#f48fb1", "#a5d6a7", "#ce93d8", "#ffcc80", "#90caf9")
#: Above this many points the order is a colour scale instead of a number beside each point.
ORDER_LABEL_LIMIT = 150
#: Above this many arrows their heads are drawn smaller (they would hide the points).
ARROW_HEAD_LIMIT = 400


@dataclass
class DomainPlot:
    """Points per statement, dependence arrows, and a matplotlib figure of them."""

    instances: Instances
    show_order: bool = False
    tiles: bool = False  # tile hulls, and only the arrows that cross tiles
    parallel: bool = False  # points shaded by the iteration of the parallel loop
    _figure: object = None

    @property
    def statements(self) -> list[StatementPoints]:
        return self.instances.statements

    @property
    def arrows(self) -> list:
        """The arrows drawn: every dependence pair shown, or with ``tiles`` those crossing tiles."""
        if self.tiles and self.instances.tile:
            return [a for a in self.instances.arrows if self.instances.crosses_tiles(a)]
        return self.instances.arrows

    @property
    def order(self) -> dict:
        return self.instances.order if self.show_order else {}

    @property
    def title(self) -> str:
        return self.instances.title

    @property
    def figure(self):
        if self._figure is None:
            self._figure = self._draw()
        return self._figure

    def save(self, path) -> None:
        """Write the picture as SVG, PNG or PDF (by the file's extension)."""
        self.figure.savefig(path, bbox_inches="tight")

    def _repr_svg_(self) -> str:
        buffer = io.StringIO()
        self.figure.savefig(buffer, format="svg", bbox_inches="tight")
        return buffer.getvalue()

    @property
    def positions(self) -> dict:
        """(statement, point) -> (x, y) where the picture draws it (:func:`layout`): at its index
        values, statements over the same indices overlapping, each nudged a little."""
        return self._layout()[0]

    @property
    def ticks(self) -> list[tuple[float, str]]:
        """(x position, label) of each x tick: the index value of the points drawn there."""
        return self._layout()[1][0]

    @property
    def flat(self) -> bool:
        """Every statement drawn along one index: one row per statement."""
        return all(len(set(st.dims)) == 1 for st in self.statements)

    def _layout(self):
        position, ticks = layout(self.statements, 2)
        return position, ticks

    def _draw(self):
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D

        flat = self.flat
        position, all_ticks = self._layout()
        rectangles = self._cell_rectangles()
        ticks = all_ticks[0]
        if rectangles:  # ticks over everything drawn, blocks included
            all_ticks = [
                [(float(v), str(v)) for v in integer_ticks(int(min(lows)), int(max(highs)))]
                for lows, highs in (
                    (
                        [r[0] for r in rectangles] + [x for x, _ in position.values()],
                        [r[1] for r in rectangles] + [x for x, _ in position.values()],
                    ),
                    (
                        [r[2] for r in rectangles] + [y for _, y in position.values()],
                        [r[3] for r in rectangles] + [y for _, y in position.values()],
                    ),
                )
            ]
            ticks = all_ticks[0]
        xs_all = [x for x, _ in position.values()] + [v for r in rectangles for v in r[:2]] or [0]
        ys_all = [y for _, y in position.values()] + [v for r in rectangles for v in r[2:4]] or [0]
        width = max(xs_all) - min(xs_all) + 1
        height = max(ys_all) - min(ys_all) + 1
        scale = min(1.0, 14.0 / max(width, height, 1))
        # Constrained layout keeps the legend below the axis label and the title above the names.
        figure = Figure(
            figsize=(max(3.5, 0.55 * width * scale + 1.5), max(2.2, 0.55 * height * scale + 1.6)), layout="constrained"
        )
        ax = figure.subplots()
        count = max(1, len(position))
        # Marker area shrinks as the points crowd (the figure stops growing at 14 steps a side).
        marker = max(4.0, min(28.0, 28.0 * (14.0 / max(width, height, 14)) ** 2))
        numbered = bool(self.order) and count <= ORDER_LABEL_LIMIT
        coloured_by_order = bool(self.order) and not numbered
        shades = sorted(set(self.instances.parallel.values())) if self.parallel else []
        names_above: list = []
        self._draw_cells(ax, rectangles, width, height, scale)
        for k, s in enumerate(self.statements):
            if s.aggregated:
                continue
            points = s.shown_points()
            xs = [position[(s.name, p)][0] for p in points]
            ys = [position[(s.name, p)][1] for p in points]
            colour = STATEMENT_COLOURS[k % len(STATEMENT_COLOURS)]
            if shades:
                import matplotlib.cm as cm

                colours = [
                    cm.tab10(shades.index(self.instances.parallel[(s.name, p)]) % 10)
                    if (s.name, p) in self.instances.parallel
                    else colour
                    for p in points
                ]
                ax.scatter(xs, ys, s=marker * 1.4, c=colours, zorder=3)
            elif coloured_by_order:
                ax.scatter(
                    xs,
                    ys,
                    s=marker,
                    c=[self.order.get((s.name, p), 0) for p in points],
                    cmap="viridis",
                    vmin=0,
                    vmax=count - 1,
                    zorder=3,
                )
            else:
                ax.scatter(xs, ys, s=marker, color=colour, zorder=3)
            if numbered:
                for point, x, y in zip(points, xs, ys):
                    ax.annotate(
                        str(self.order.get((s.name, point), "")),
                        (x, y),
                        fontsize=6,
                        xytext=(4, -10),
                        textcoords="offset points",
                    )
            if self.tiles:
                self._draw_tiles(ax, s, points, xs, ys)
            fixed = ", ".join(f"{i}={v}" for i, v in s.fixed.items())
            label = f"{s.name}" + (f" at {fixed}" if fixed else "")
            # Statement names sit outside the points: left of a row, above a block.
            if len(set(s.dims)) == 1:
                ax.annotate(
                    label,
                    (min(xs, default=0), ys[0] if ys else 0),
                    xytext=(-8, 0),
                    textcoords="offset points",
                    ha="right",
                    va="center",
                    fontsize=8,
                    color=colour,
                )
            else:
                names_above.append((label, colour))
        for number, (label, colour) in enumerate(names_above):
            # Names of the statements drawn over two indices, above the axes, in their colours.
            ax.annotate(
                label,
                (0.0, 1.0),
                xycoords="axes fraction",
                xytext=(60 * number, 6),
                textcoords="offset points",
                fontsize=8,
                color=colour,
                annotation_clip=False,
            )
        ax.set_xticks([x for x, _ in ticks], [label for _, label in ticks])
        if rectangles and flat:
            flat = False  # aggregated blocks have their own y extent
        ax.set_xlabel(" / ".join(dict.fromkeys(st.indices[st.dims[0]] for st in self.statements if st.indices)))
        if not flat:
            ax.set_yticks([y for y, _ in all_ticks[1]], [label for _, label in all_ticks[1]])
            ax.set_ylabel(
                " / ".join(dict.fromkeys(st.indices[st.dims[1]] for st in self.statements if len(st.dims) > 1))
            )
        else:
            ax.set_yticks([])
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(alpha=0.2)
        heads = len(self.arrows) <= ARROW_HEAD_LIMIT
        for kind, source, a, sink, b in self.arrows:
            start, end = position.get((source, a)), position.get((sink, b))
            if start is None or end is None:
                continue
            bad = (source, a, sink, b) in self.instances.violated
            curved = "arc3,rad=0.25" if start[1] == end[1] and abs(start[0] - end[0]) > 1 else "arc3"
            ax.annotate(
                "",
                xy=end,
                xytext=start,
                arrowprops=dict(
                    arrowstyle="->",
                    mutation_scale=10 if heads or bad else 5,
                    color=VIOLATED_COLOUR if bad else KIND_COLOURS[kind],
                    lw=2.2 if bad else 0.9,
                    alpha=1 if bad else 0.8,
                    connectionstyle=curved,
                    shrinkA=4,
                    shrinkB=4,
                ),
                zorder=4 if bad else 2,
            )
        handles, labels = [], []
        for kind in sorted({a[0] for a in self.arrows}):
            handles.append(Line2D([0], [0], color=KIND_COLOURS[kind]))
            labels.append(kind + (" (between tiles)" if self.tiles and self.instances.tile else ""))
        violated = self.instances.violated
        elsewhere = self.instances.violated_elsewhere
        drawn_bad = sum(1 for arrow in self.arrows if arrow[1:] in violated)
        if violated or elsewhere:
            handles.append(Line2D([0], [0], color=VIOLATED_COLOUR, lw=2.2))
            labels.append(
                f"violated by the schedule (its sink would run first): {drawn_bad} drawn"
                + (f" of {len(violated)}" if drawn_bad < len(violated) else "")
                + (f", {elsewhere} with an end outside this slice" if elsewhere else "")
            )
        if shades:
            handles.append(Line2D([0], [0], marker="o", linestyle="", color="#888"))
            labels.append(f"colour: iteration of the parallel loop {self.instances.parallel_loop}")
        elif coloured_by_order:
            handles.append(Line2D([0], [0], marker="o", linestyle="", color="#21918c"))
            labels.append(f"colour: position in the {self.instances.schedule_source} order, dark first")
        if self.tiles and self.instances.tile:
            handles.append(Line2D([0], [0], marker="s", linestyle="", color="#f9a825", alpha=0.5))
            labels.append(
                self.instances.tile_label
                or "tiles of " + " x ".join(map(str, self.instances.tile_sizes)) + ", one colour each"
            )
        if handles:
            figure.legend(
                handles,
                labels,
                loc="outside lower center",
                ncol=min(len(handles), 2),
                fontsize=8,
                frameon=False,
            )
        title = self.title
        if self.arrows:
            title += "\n" + self.instances.arrows_note
        if title:
            figure.suptitle(title, fontsize=9, x=0.02, ha="left")
        return figure

    def _cell_rectangles(self) -> list:
        """(x0, x1, y0, y1, count, statement number) of every block of the aggregated statements,
        in index values (x and y as drawn: a statement over one index is a row below the others)."""
        rectangles = []
        row = 0
        for number, s in enumerate(self.statements):
            if not s.aggregated:
                continue
            two = len(s.cell_sizes) > 1
            for block, count in s.cells.items():
                # each axis' block, cut to the values the slice holds
                spans = [
                    (max(low, b * size), min(high, (b + 1) * size - 1))
                    for b, size, (low, high) in zip(block, s.cell_sizes, s.bounds)
                ]
                (x0, x1), (y0, y1) = spans[0], spans[1] if two else (-row, -row)
                rectangles.append((x0, x1, y0, y1, count, number))
            if not two:
                row += 1
        return rectangles

    def _draw_cells(self, ax, rectangles, width, height, scale) -> None:
        """The aggregated statements' blocks, shaded by their counts, each count written in it."""
        if not rectangles:
            return
        from matplotlib.patches import Rectangle

        most = max(r[4] for r in rectangles)
        for x0, x1, y0, y1, count, number in rectangles:
            colour = STATEMENT_COLOURS[number % len(STATEMENT_COLOURS)]
            ax.add_patch(
                Rectangle(
                    (x0 - 0.45, y0 - 0.45),
                    x1 - x0 + 0.9,
                    y1 - y0 + 0.9,
                    facecolor=colour,
                    alpha=0.15 + 0.5 * count / most,
                    edgecolor="#424242",
                    lw=0.6,
                    zorder=1,
                )
            )
            ax.annotate(str(count), ((x0 + x1) / 2, (y0 + y1) / 2), ha="center", va="center", fontsize=6, zorder=5)
        for number, s in enumerate(self.statements):
            if s.aggregated:
                ax.annotate(
                    f"{s.name} (aggregated)",
                    (0.0, 1.0),
                    xycoords="axes fraction",
                    xytext=(0, 6 + 10 * number),
                    textcoords="offset points",
                    fontsize=8,
                    color=STATEMENT_COLOURS[number % len(STATEMENT_COLOURS)],
                    annotation_clip=False,
                )
        ax.autoscale_view()

    def _draw_tiles(self, ax, s, points, xs, ys) -> None:
        """One hull per tile around the points it holds (a box, slightly padded), neighbouring
        tiles in different colours."""
        groups: dict = {}
        for point, x, y in zip(points, xs, ys):
            tile = self.instances.tile.get((s.name, point))
            if tile is not None:
                groups.setdefault(tile, []).append((x, y))
        from matplotlib.patches import Polygon

        for tile, members in groups.items():
            hull = convex_hull(members)
            padded = _pad(hull, 0.3)
            ax.add_patch(
                Polygon(
                    padded,
                    closed=True,
                    fill=True,
                    facecolor=tile_colour(tile),
                    alpha=0.35,
                    edgecolor="#616161",
                    lw=0.8,
                    zorder=1,
                )
            )


def tile_colour(tile: tuple) -> str:
    """A colour for a tile that differs from its neighbours' along and across any two of its
    coordinates (weights 1, 3, 5 modulo 7 never sum to 0 for steps of one)."""
    return TILE_COLOURS[sum(w * c for w, c in zip((1, 3, 5, 2, 4, 6), tile)) % len(TILE_COLOURS)]


def convex_hull(points) -> list[tuple[float, float]]:
    """The convex hull of 2-D points, counter-clockwise (Andrew's monotone chain)."""
    unique = sorted(set(points))
    if len(unique) <= 2:
        return unique

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    def half(sequence):
        chain: list = []
        for p in sequence:
            while len(chain) >= 2 and cross(chain[-2], chain[-1], p) <= 0:
                chain.pop()
            chain.append(p)
        return chain[:-1]

    return half(unique) + half(reversed(unique))


def _pad(hull, margin):
    """``hull`` grown by ``margin`` on every side (points and segments become boxes)."""
    xs, ys = [p[0] for p in hull], [p[1] for p in hull]
    if len(hull) <= 2 or len(set(xs)) == 1 or len(set(ys)) == 1:
        x0, x1, y0, y1 = min(xs) - margin, max(xs) + margin, min(ys) - margin, max(ys) + margin
        return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    cx, cy = sum(xs) / len(xs), sum(ys) / len(ys)
    result = []
    for x, y in hull:
        dx, dy = x - cx, y - cy
        length = max((dx * dx + dy * dy) ** 0.5, 1e-9)
        result.append((x + margin * 1.5 * dx / length, y + margin * 1.5 * dy / length))
    return result


def plot_domain(
    kernel,
    sizes: dict,
    statements=None,
    dims=None,
    fixed: dict | None = None,
    kinds=KINDS,
    order: bool = False,
    tiles: bool = False,
    parallel: bool = False,
    schedule=None,
    violated=None,
) -> DomainPlot:
    """The points of ``statements`` (names like ``S0``; default: all but ``!`` initialisations)
    of ``kernel`` at ``sizes``, the dependence arrows of ``kinds`` between them, and with
    ``order`` their positions in the compiled schedule; ``tiles`` draws the compiled schedule's
    tiles as hulls and keeps only the arrows between tiles; ``parallel`` colours each point by
    the iteration of the parallel loop it runs in.  ``schedule`` (isl text, a union map or an
    isl.Schedule) numbers the points in a schedule of your own instead, and ``violated`` (a
    union map of dependence pairs) draws those arrows bold red: see
    :meth:`polyc.viz.explain.ScheduleCheck.plot`.  A statement with more than
    :data:`~polyc.viz.instances.MAX_POINTS` instances in the slice is drawn aggregated: blocks
    (the gemm kernel's cache blocks on the gemm path) as rectangles with their counts, as the
    title says."""
    return DomainPlot(
        collect(
            kernel,
            sizes,
            statements,
            dims,
            fixed,
            kinds,
            max_dims=2,
            schedule=schedule,
            violated=violated,
            aggregate=True,
        ),
        show_order=order,
        tiles=tiles,
        parallel=parallel,
    )
