"""Iteration domains, dependences and execution order, as points and arrows (matplotlib).

    plot = polyc.viz.plot_domain(kernel, {"N": 6, "M": 5})        # every statement, first two indices
    plot = polyc.viz.plot_domain(kernel, sizes, dims=("m", "r_k"), fixed={"n": 0}, order=True)
    plot.save("domain.svg")                                         # or .png; notebooks show it inline

Every point is an instance of a statement at the given (small) sizes, enumerated by isl; every
arrow is a pair of the dependence relation (coloured by kind: flow, anti, output, reduction)
between two plotted points.  A statement with more than two indices is shown as the 2-D slice
at ``fixed`` values of the others (default: their lowest), named in the title.  Several
statements are drawn side by side, each in its own colour, as Clint does.  ``order=True``
numbers the points in the order the compiled schedule runs them.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import islpy as isl
import numpy as np

from polyc.errors import PolycError

KIND_COLOURS = {"flow": "#1565c0", "anti": "#c62828", "output": "#6a1b9a", "reduction": "#2e7d32"}
STATEMENT_COLOURS = ("#37474f", "#ef6c00", "#00838f", "#ad1457", "#558b2f", "#4527a0")
MAX_POINTS = 20000


@dataclass
class StatementPoints:
    name: str
    indices: tuple[str, ...]
    points: np.ndarray          # every instance at the sizes, one row per point
    shown: np.ndarray           # mask of the rows in the plotted slice
    dims: tuple[int, int]       # which indices are the plot's x and y
    fixed: dict                 # index -> value of the other indices in the slice


@dataclass
class DomainPlot:
    """Points per statement, dependence arrows, and a matplotlib figure of them."""

    statements: list[StatementPoints]
    arrows: list[tuple[str, str, tuple, str, tuple]]   # (kind, source, point, sink, point)
    order: dict = field(default_factory=dict)          # (statement, point) -> position in the schedule
    title: str = ""
    _figure: object = None

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
        figure = Figure(figsize=(4.2 * max(1, len(self.statements)), 4.2))
        axes = figure.subplots(1, len(self.statements), squeeze=False)[0]
        position = {}
        for ax, (k, s) in zip(axes, enumerate(self.statements)):
            xs, ys = s.points[s.shown][:, s.dims[0]], s.points[s.shown][:, s.dims[1]] if s.points.shape[1] > 1 \
                else np.zeros(int(s.shown.sum()))
            ax.scatter(xs, ys, s=28, color=STATEMENT_COLOURS[k % len(STATEMENT_COLOURS)], zorder=3)
            for point, x, y in zip(s.points[s.shown], xs, ys):
                position[(s.name, tuple(int(v) for v in point))] = (ax, x, y)
                if self.order:
                    ax.annotate(str(self.order.get((s.name, tuple(int(v) for v in point)), "")), (x, y),
                                fontsize=6, xytext=(3, 3), textcoords="offset points")
            fixed = ", ".join(f"{i}={v}" for i, v in s.fixed.items())
            ax.set_title(f"{s.name}" + (f" at {fixed}" if fixed else ""), fontsize=9)
            ax.set_xlabel(s.indices[s.dims[0]] if s.indices else "")
            ax.set_ylabel(s.indices[s.dims[1]] if len(s.indices) > 1 else "")
            ax.set_aspect("equal", adjustable="datalim")
            ax.grid(alpha=0.2)
        for kind, source, a, sink, b in self.arrows:
            start, end = position.get((source, a)), position.get((sink, b))
            if start is None or end is None or start[0] is not end[0]:
                continue
            start[0].annotate("", xy=(end[1], end[2]), xytext=(start[1], start[2]),
                              arrowprops=dict(arrowstyle="->", color=KIND_COLOURS[kind], lw=0.9, alpha=0.8))
        kinds = sorted({a[0] for a in self.arrows})
        if kinds:
            from matplotlib.lines import Line2D
            figure.legend([Line2D([0], [0], color=KIND_COLOURS[k]) for k in kinds], kinds, loc="upper right",
                          ncol=len(kinds), fontsize=8, frameon=False)
        if self.title:
            figure.suptitle(self.title, fontsize=10)
        return figure


def plot_domain(kernel, sizes: dict, statements=None, dims=None, fixed: dict | None = None,
                kinds=("flow", "anti", "output", "reduction"), order: bool = False) -> DomainPlot:
    """The points of ``statements`` (names like ``S0``; default: all but ``!`` initialisations)
    of ``kernel`` at ``sizes``, the dependence arrows of ``kinds`` between them, and with
    ``order`` their positions in the compiled schedule."""
    stages = kernel.stages(sizes)
    program = stages.program
    names = list(statements) if statements else [s.name for s in program.statements if s.kind != "init"]
    unknown = [n for n in names if n not in {s.name for s in program.statements}]
    if unknown:
        raise PolycError(f"no statement {', '.join(unknown)}; the statements are "
                         f"{', '.join(s.name for s in program.statements)}")
    plotted = []
    for name in names:
        statement = program.statement(name)
        points = _points(statement.domain)
        wanted = tuple(dims) if dims else statement.indices[:2]
        missing = [d for d in wanted if d not in statement.indices]
        if missing:
            raise PolycError(f"{name} has no index {', '.join(missing)} (its indices: {', '.join(statement.indices)})")
        axes = tuple(statement.indices.index(d) for d in wanted) if wanted else (0,)
        if len(axes) == 1:
            axes = (axes[0], axes[0])
        slice_values = {}
        shown = np.ones(len(points), bool)
        for position, index in enumerate(statement.indices):
            if position in axes:
                continue
            value = (fixed or {}).get(index, int(points[:, position].min()) if len(points) else 0)
            slice_values[index] = value
            shown &= points[:, position] == value
        plotted.append(StatementPoints(name, statement.indices, points, shown, axes[:2], slice_values))
    arrows = []
    for kind in kinds:
        relation = getattr(stages.dependences, kind)
        if kind != "reduction":
            relation = relation.subtract(stages.dependences.reduction)
        relation = relation.intersect_params(program.context)
        shown = {s.name: {tuple(int(v) for v in p) for p in s.points[s.shown]} for s in plotted}
        for source, a, sink, b in _pairs(relation):
            if a in shown.get(source, ()) and b in shown.get(sink, ()):
                arrows.append((kind, source, a, sink, b))
    ranks = _schedule_order(stages.optimized_schedule, program, plotted) if order else {}
    sizes_text = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return DomainPlot(plotted, arrows, ranks, f"{kernel.definition.name} at {sizes_text}")


def _points(domain: isl.Set) -> np.ndarray:
    points: list[list[int]] = []
    n = domain.dim(isl.dim_type.set)

    def add(point):
        if len(points) > MAX_POINTS:
            raise PolycError(f"more than {MAX_POINTS} points: plot smaller sizes")
        points.append([point.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(n)])
    domain.foreach_point(add)
    return np.array(points, dtype=np.int64).reshape(len(points), n)


def _pairs(relation: isl.UnionMap):
    maps: list[isl.Map] = []
    relation.foreach_map(maps.append)
    for relation_map in maps:
        n_in, n_out = relation_map.dim(isl.dim_type.in_), relation_map.dim(isl.dim_type.out)
        source = relation_map.get_tuple_name(isl.dim_type.in_)
        sink = relation_map.get_tuple_name(isl.dim_type.out)
        found: list = []
        relation_map.wrap().foreach_point(lambda p: found.append(
            [p.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(n_in + n_out)]))
        for values in found:
            yield source, tuple(values[:n_in]), sink, tuple(values[n_in:])


def _schedule_order(schedule: isl.Schedule, program, plotted) -> dict:
    """(statement, point) -> its position when the schedule runs the plotted instances in order."""
    relation = schedule.get_map().intersect_params(program.context)
    timed = []
    for statements in plotted:
        for point in statements.points[statements.shown]:
            values = tuple(int(v) for v in point)
            instance = isl.Set.read_from_str(program.ctx, f"{{ {statements.name}[{', '.join(map(str, values))}] }}")
            image = relation.intersect_domain(isl.UnionSet.from_set(instance.align_params(relation.get_space())))
            sets: list[isl.Set] = []
            image.range().foreach_set(sets.append)
            time = sets[0].sample_point()
            n = sets[0].dim(isl.dim_type.set)
            timed.append((tuple(time.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(n)),
                          statements.name, values))
    width = max((len(t[0]) for t in timed), default=0)
    timed.sort(key=lambda t: t[0] + (0,) * (width - len(t[0])))
    return {(name, point): rank for rank, (_, name, point) in enumerate(timed)}
