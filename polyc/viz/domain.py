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

from polyc.viz.instances import KINDS, Instances, StatementPoints, collect

KIND_COLOURS = {"flow": "#1565c0", "anti": "#c62828", "output": "#6a1b9a", "reduction": "#2e7d32"}
VIOLATED_COLOUR = "#ff1744"
STATEMENT_COLOURS = ("#37474f", "#ef6c00", "#00838f", "#ad1457", "#558b2f", "#4527a0")


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

    def _draw(self):
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure

        flat = all(len(set(st.dims)) == 1 for st in self.statements)
        width = (
            sum(_extent(st, 0) + 1 for st in self.statements)
            if not flat
            else max((_extent(st, 0) + 1 for st in self.statements), default=1)
        )
        height = max((_extent(st, 1) + 1 for st in self.statements), default=1) if not flat else len(self.statements)
        scale = min(1.0, 14.0 / max(width, height, 1))
        figure = Figure(figsize=(max(3.5, 0.55 * width * scale + 1.5), max(2.2, 0.55 * height * scale + 1.6)))
        ax = figure.subplots()
        position = {}
        shades = sorted(set(self.instances.parallel.values())) if self.parallel else []
        offset = 0
        for k, s in enumerate(self.statements):
            # Statements side by side (2-D) or one row each (1-D), in their own colours, as Clint does.
            points = s.shown_points()
            low_x = min((p[s.dims[0]] for p in points), default=0)
            xs = [p[s.dims[0]] - (low_x - offset if not flat else 0) for p in points]
            # In a 2-D picture a statement of one index is a row at 0.
            ys = [(p[s.dims[1]] if len(s.dims) > 1 else 0) if not flat else -k for p in points]
            colour = STATEMENT_COLOURS[k % len(STATEMENT_COLOURS)]
            if shades:
                import matplotlib.cm as cm

                colours = [
                    cm.tab10(shades.index(self.instances.parallel[(s.name, p)]) % 10)
                    if (s.name, p) in self.instances.parallel
                    else colour
                    for p in points
                ]
                ax.scatter(xs, ys, s=40, c=colours, zorder=3)
            else:
                ax.scatter(xs, ys, s=28, color=colour, zorder=3)
            for point, x, y in zip(points, xs, ys):
                position[(s.name, point)] = (x, y)
                if self.order:
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
            if flat:
                ax.annotate(
                    label,
                    (min(xs, default=0), -k),
                    xytext=(-8, 0),
                    textcoords="offset points",
                    ha="right",
                    va="center",
                    fontsize=8,
                    color=colour,
                )
            else:
                ax.annotate(
                    label,
                    (offset, max(ys, default=0)),
                    xytext=(0, 10),
                    textcoords="offset points",
                    fontsize=8,
                    color=colour,
                )
                offset += _extent(s, 0) + 2
        ax.set_xlabel(" / ".join(dict.fromkeys(st.indices[st.dims[0]] for st in self.statements if st.indices)))
        if not flat:
            ax.set_ylabel(
                " / ".join(dict.fromkeys(st.indices[st.dims[1]] for st in self.statements if len(st.dims) > 1))
            )
        else:
            ax.set_yticks([])
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(alpha=0.2)
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
        from matplotlib.lines import Line2D

        for kind in sorted({a[0] for a in self.arrows}):
            handles.append(Line2D([0], [0], color=KIND_COLOURS[kind]))
            labels.append(kind + (" (between tiles)" if self.tiles and self.instances.tile else ""))
        if self.instances.violated:
            handles.append(Line2D([0], [0], color=VIOLATED_COLOUR, lw=2.2))
            labels.append("violated by the schedule (its sink would run first)")
        if shades:
            handles.append(Line2D([0], [0], marker="o", linestyle="", color="#888"))
            labels.append(f"colour: iteration of the parallel loop {self.instances.parallel_loop}")
        if handles:
            figure.legend(
                handles,
                labels,
                loc="upper center",
                bbox_to_anchor=(0.5, 0.0),
                ncol=min(len(handles), 2),
                fontsize=8,
                frameon=False,
            )
        if self.title:
            figure.suptitle(self.title, fontsize=10, x=0.02, ha="left")
        return figure

    def _draw_tiles(self, ax, s, points, xs, ys) -> None:
        """One hull per tile around the points it holds (a box, slightly padded)."""
        groups: dict = {}
        for point, x, y in zip(points, xs, ys):
            tile = self.instances.tile.get((s.name, point))
            if tile is not None:
                groups.setdefault(tile, []).append((x, y))
        from matplotlib.patches import Polygon

        for members in groups.values():
            hull = convex_hull(members)
            padded = _pad(hull, 0.3)
            ax.add_patch(
                Polygon(
                    padded,
                    closed=True,
                    fill=True,
                    facecolor="#fff59d",
                    alpha=0.35,
                    edgecolor="#f9a825",
                    lw=1.0,
                    zorder=1,
                )
            )


def _extent(statement: StatementPoints, axis: int) -> int:
    """How many steps the shown points span along the picture's ``axis`` (none along an axis the
    statement has no index on)."""
    if axis >= len(statement.dims):
        return 0
    values = [p[statement.dims[axis]] for p in statement.shown_points()]
    return max(values) - min(values) if values else 0


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
    :meth:`polyc.viz.explain.ScheduleCheck.plot`."""
    return DomainPlot(
        collect(kernel, sizes, statements, dims, fixed, kinds, max_dims=2, schedule=schedule, violated=violated),
        show_order=order,
        tiles=tiles,
        parallel=parallel,
    )
