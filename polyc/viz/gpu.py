"""The GPU mapping of a def as a picture, and each block's memory footprint per tensor.

    plot = polyc.viz.plot_gpu_mapping(kernel, {"M": 16, "N": 16, "K": 8})   # colour = block
    plot.block_of[("S0", (3, 5, 0))]      # -> (block x, block y) that runs S0[m=3, n=5, r_k=0]
    table = polyc.viz.block_footprints(kernel, {"M": 16, "N": 16, "K": 8})  # elements per block

Both are read from the GPU path's own plan (:class:`polyc.schedule.gpu_mapping.GpuPlan`, what
``kernel.gpu_stages(sizes, dialect)`` compiles; no device is needed): the block and thread ids
of an instance are those of the launch's ``thread_domain``, the instances one thread runs with
the ids as isl parameters, here turned into a relation instance -> ids and enumerated by isl at
the given sizes.  Shared-memory tiles are the promoted arrays' boxes (their offsets are isl
affine functions of the block ids and the slice), evaluated per block.  A footprint is the
image of a block's instances under the def's access relations.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass, field

import islpy as isl

from polyc.errors import PolycError
from polyc.schedule.gpu_promotion import BLOCK_ID, THREAD_ID
from polyc.viz.domain import ORDER_LABEL_LIMIT
from polyc.viz.instances import StatementPoints, _slice, domain_points, pairs

#: Colours of blocks, taken in turn by the linear block id (x fastest); neighbours differ.
BLOCK_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
)  # fmt: skip


@dataclass(frozen=True)
class SharedTile:
    """The box of ``tensor`` a block holds in shared memory for one slice of the sequential loop."""

    tensor: str
    array: str  # the shared array's name in the code
    block: tuple[int, ...]  # block ids, x first
    slice: int
    low: tuple[int, ...]  # first element of the box, per tensor dimension
    sizes: tuple[int, ...]


@dataclass
class GpuMappingPlot:
    """A statement's instances (a 2-D slice) coloured by the block that runs them, the thread
    of the block beside each point, and the shared-memory tiles of the promoted tensors."""

    definition: str
    launch: str  # the kernel function's name
    statement: StatementPoints
    grid: tuple[int, ...]  # blocks along x, y, z
    block: tuple[int, ...]  # threads per block along x, y, z
    loops: dict  # "x"/"y"/"z" -> the statement's index mapped there (None: a schedule dimension)
    block_of: dict  # (statement, point) -> block ids, x first, for every shown point
    thread_of: dict  # (statement, point) -> thread ids, x first
    tiles: list = field(default_factory=list)  # SharedTile per block for the slice shown
    shapes: dict = field(default_factory=dict)  # tensor -> its shape at the sizes
    sizes: dict = field(default_factory=dict)
    note: str = ""  # how the launch is mapped (promotion, reduction), one line
    _figure: object = None

    @property
    def title(self) -> str:
        mapped = ", ".join(f"{index or 'a schedule dimension'} -> {dim}" for dim, index in self.loops.items())
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        return f"{self.definition} at {sizes}: kernel {self.launch}, grid {self.grid}, block {self.block}; {mapped}"

    def block_index(self, block: tuple[int, ...]) -> int:
        """The linear id of a block, x fastest (as CUDA and OpenCL number work-groups)."""
        linear, scale = 0, 1
        for value, extent in zip(block, self.grid):
            linear += value * scale
            scale *= extent
        return linear

    @property
    def colours(self) -> dict:
        """(statement, point) -> the colour the picture gives it: its block's."""
        return {key: BLOCK_COLOURS[self.block_index(b) % len(BLOCK_COLOURS)] for key, b in self.block_of.items()}

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
        from matplotlib.patches import Rectangle

        promoted = sorted({t.tensor for t in self.tiles})
        panels = 1 + len(promoted)
        # Height from the flattest panel's rows per column: equal aspect leaves no empty band.
        extents = [self._extent()] + [self._tensor_extent(t) for t in promoted]
        height = max(rows / cols for rows, cols in extents) * 5.2 + 1.4
        figure = Figure(figsize=(5.2 * panels, min(max(height, 2.8), 9.0)), layout="constrained")
        axes = figure.subplots(1, panels, squeeze=False)[0]
        figure.suptitle(self.title, fontsize=9)
        ax = axes[0]
        points = self.statement.shown_points()
        dims = self.statement.dims
        names = [self.statement.indices[d] for d in dims]
        colours = self.colours
        xs = [p[dims[-1]] if len(dims) > 1 else p[dims[0]] for p in points]
        ys = [p[dims[0]] if len(dims) > 1 else 0 for p in points]
        ax.scatter(xs, ys, c=[colours[(self.statement.name, p)] for p in points], s=150, zorder=2)
        if len(points) <= ORDER_LABEL_LIMIT:
            for x, y, p in zip(xs, ys, points):
                thread = ",".join(map(str, self.thread_of[(self.statement.name, p)]))
                colour = colours[(self.statement.name, p)]
                ax.annotate(
                    thread, (x, y), ha="center", va="center", fontsize=5.5, color=_label_colour(colour), zorder=3
                )
        ax.set_xlabel(names[-1] if len(names) > 1 else names[0])
        ax.set_ylabel(names[0] if len(names) > 1 else "")
        ax.invert_yaxis()  # rows down, as a matrix is printed
        ax.set_aspect("equal")
        fixed = ", ".join(f"{k}={v}" for k, v in self.statement.fixed.items())
        ax.set_title(
            f"{self.statement.name}{' at ' + fixed if fixed else ''}: colour = block, label = thread "
            f"({','.join('xyz'[: len(self.block)])})",
            fontsize=8,
        )
        _integer_ticks(ax)
        for ax, tensor in zip(axes[1:], promoted):
            shape = self.shapes[tensor]
            rows, cols = self._tensor_extent(tensor)
            ax.scatter(
                [c for r in range(rows) for c in range(cols)],
                [r for r in range(rows) for c in range(cols)],
                s=12,
                c="#cfd8dc",
                zorder=1,
            )
            drawn: dict = {}  # box -> outlines drawn on it: blocks sharing a box are nested
            for tile in (t for t in self.tiles if t.tensor == tensor):
                low = tile.low if len(tile.low) > 1 else (0, *tile.low)
                size = tile.sizes if len(tile.sizes) > 1 else (1, *tile.sizes)
                inset = 0.45 - 0.1 * drawn.get((low, size), 0)
                drawn[(low, size)] = drawn.get((low, size), 0) + 1
                colour = BLOCK_COLOURS[self.block_index(tile.block) % len(BLOCK_COLOURS)]
                ax.add_patch(
                    Rectangle(
                        (low[1] - inset, low[0] - inset),
                        size[1] - 1 + 2 * inset,
                        size[0] - 1 + 2 * inset,
                        fill=False,
                        edgecolor=colour,
                        linewidth=2,
                        zorder=2,
                    )
                )
            array = next(t.array for t in self.tiles if t.tensor == tensor)
            slice_ = next(t.slice for t in self.tiles if t.tensor == tensor)
            ax.set_title(f"{tensor}: each block's {array} tile, slice {slice_} (outline = block)", fontsize=8)
            ax.set_xlim(-1, cols)
            ax.set_ylim(rows, -1)
            ax.set_aspect("equal")
            ax.set_xlabel(f"{tensor} dim {len(shape) - 1}")
            ax.set_ylabel(f"{tensor} dim 0" if len(shape) > 1 else "")
            _integer_ticks(ax)
        if self.note:
            figure.supxlabel(self.note, fontsize=7)
        return figure

    def _extent(self) -> tuple[int, int]:
        """Rows and columns of the instances panel."""
        points = self.statement.points[self.statement.shown]
        if not len(points):
            return 1, 1
        dims = self.statement.dims
        span = [int(points[:, d].max() - points[:, d].min()) + 1 for d in dims]
        return (span[0], span[-1]) if len(span) > 1 else (1, span[0])

    def _tensor_extent(self, tensor: str) -> tuple[int, int]:
        """Rows and columns of a tensor's panel (a vector is one row; more than two dimensions:
        the first two)."""
        shape = self.shapes[tensor]
        return (shape[0], shape[1]) if len(shape) > 1 else (1, shape[0])


def _label_colour(background: str) -> str:
    """Black on light colours, white on dark ones (relative luminance of the hex colour)."""
    red, green, blue = (int(background[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.2126 * red + 0.7152 * green + 0.0722 * blue > 0.55 else "white"


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _mapped_plan(kernel, sizes: dict, dialect: str):
    """The GPU stages of ``kernel`` at ``sizes``, refused when no launch uses more than one thread."""
    stages = kernel.gpu_stages(sizes, dialect)
    plan = stages.gpu
    mapped = [launch for launch in plan.launches if launch.loops or launch.reduction is not None]
    if not mapped:
        reasons = "; ".join(launch.reason for launch in plan.launches) or "every domain is empty"
        raise PolycError(
            f"{kernel.definition.name} has no GPU mapping to draw at these sizes: each launch runs on "
            f"one thread ({reasons})"
        )
    return stages, mapped


def _launch_of(mapped: list, statement: str | None, program):
    """The mapped launch running ``statement`` (default: the first non-initialisation statement
    of a mapped launch) and the statement's name."""
    if statement is not None:
        if statement not in {s.name for s in program.statements}:
            raise PolycError(
                f"no statement {statement}; the statements are {', '.join(s.name for s in program.statements)}"
            )
        for launch in mapped:
            if statement in launch.statements:
                return launch, statement
        raise PolycError(f"{statement} runs on one thread of the GPU (no launch maps it to blocks and threads)")
    for launch in mapped:
        for name in launch.statements:
            if program.statement(name).kind != "init":
                return launch, name
    return mapped[0], mapped[0].statements[0]


def launch_ids(launch, program) -> isl.UnionMap:
    """Instance -> [block ids..., thread ids...] (x first) of every instance ``launch`` runs,
    read off its ``thread_domain`` (the instances of one thread, the ids as parameters)."""
    thread_domain = launch.reduction.thread_domain if launch.reduction is not None else launch.thread_domain
    ids = [f"{BLOCK_ID}{d}" for d in range(launch.block_dims)] + [f"{THREAD_ID}{d}" for d in range(launch.thread_dims)]
    pieces: list[isl.Set] = []
    thread_domain.intersect_params(launch.build_context).foreach_set(pieces.append)
    result = None
    for piece in pieces:
        if piece.get_tuple_name() not in launch.statements:
            continue  # copies and barriers of a promotion or a reduction tree
        relation = isl.Map.from_domain(piece)
        for name in ids:
            position = relation.find_dim_by_name(isl.dim_type.param, name)
            relation = relation.move_dims(
                isl.dim_type.out, relation.dim(isl.dim_type.out), isl.dim_type.param, position, 1
            )
        relation = relation.intersect_params(program.context.align_params(relation.get_space()))
        relation = relation.project_out(isl.dim_type.param, 0, relation.dim(isl.dim_type.param))
        as_union = isl.UnionMap.from_map(relation)
        result = as_union if result is None else result.union(as_union)
    if result is None:
        raise PolycError(f"{launch.name}: no instance of its statements in its thread domain")
    return result


def _shared_tiles(launch, program, blocks: set, slice_: int) -> list[SharedTile]:
    """Each block's box of every promoted tensor for slice ``slice_``."""
    promotion = launch.promotion
    if promotion is None:
        return []
    tiles = []
    for array in promotion.arrays:
        for block in sorted(blocks):
            values = {**(program.size_values or {}), **{f"{BLOCK_ID}{d}": v for d, v in enumerate(block)}}
            low = tuple(_evaluate(offset, values, slice_) for offset in array.offsets)
            tiles.append(SharedTile(array.tensor, array.name, block, slice_, low, tuple(array.sizes)))
    return tiles


def _evaluate(aff: isl.Aff, params: dict, argument: int) -> int:
    """``aff`` (on the space [s]) at ``s = argument`` and parameter values ``params``."""
    relation = isl.Map.from_aff(aff)
    for position in range(relation.dim(isl.dim_type.param)):
        name = relation.get_dim_name(isl.dim_type.param, position)
        value = isl.Val.int_from_si(relation.get_ctx(), params[name])
        relation = relation.fix_val(isl.dim_type.param, position, value)
    relation = relation.fix_val(isl.dim_type.in_, 0, isl.Val.int_from_si(relation.get_ctx(), argument))
    values = domain_points(relation.range().project_out(isl.dim_type.param, 0, relation.dim(isl.dim_type.param)))
    return int(values[0][0])


def plot_gpu_mapping(
    kernel,
    sizes: dict,
    dialect: str = "opencl",
    statement: str | None = None,
    dims=None,
    fixed: dict | None = None,
    slice: int = 0,
) -> GpuMappingPlot:
    """The instances of ``statement`` (default: the first that a launch maps to blocks and
    threads) of ``kernel`` at ``sizes``, as the GPU path in ``dialect`` maps them: each point
    coloured by the block that runs it and labelled with its thread within the block, and, one
    panel per tensor promoted to shared memory, every block's tile of it for slice ``slice`` of
    the sequential loop.  More than two indices: the 2-D slice at ``fixed`` (default: the
    lowest values of the others), as :func:`polyc.viz.domain.plot_domain`.  The title says the
    grid, the block and which index runs along x and y.  The kernel's options choose the
    mapping (``block``, ``grid``, ``gpu_tiles``, ``device``); no GPU is needed.

    Raises :class:`PolycError` when every launch runs on one thread (nothing is mapped)."""
    stages, mapped = _mapped_plan(kernel, sizes, dialect)
    program = stages.program
    launch, name = _launch_of(mapped, statement, program)
    points = _slice(program.statement(name), dims, fixed, 2)
    shown = set(points.shown_points())
    block_dims = launch.block_dims
    block_of, thread_of = {}, {}
    for source, point, _, ids in pairs(launch_ids(launch, program)):
        if source == name and point in shown:
            block_of[(name, point)] = tuple(ids[:block_dims])
            thread_of[(name, point)] = tuple(ids[block_dims:])
    if launch.reduction is not None:
        loops = {"xyz"[d]: row.indices.get(name) for d, row in enumerate(launch.reduction.rows)}
        note = (
            f"a block per row; its {launch.reduction.threads} threads share the innermost loop "
            "and reduce in shared memory"
        )
    else:
        loops = {"xyz"[d]: loop.indices.get(name) for d, loop in enumerate(launch.loops)}
        registers = [f"{'xyz'[d]}: {loop.registers}" for d, loop in enumerate(launch.loops) if loop.registers > 1]
        note = f"register tiles ({', '.join(registers)} values per thread)" if registers else ""
    if launch.promotion is not None:
        p = launch.promotion
        note = "; ".join(
            filter(None, [note, f"band member {p.member} in {p.slices} slices of {p.slice_size} through shared memory"])
        )
        if not 0 <= slice < p.slices:
            raise PolycError(f"slice {slice} out of range: {launch.name} has slices 0..{p.slices - 1}")
    shapes = {t.name: t.concrete_shape(program.size_values or {}) for t in kernel.definition.tensors}
    tiles = _shared_tiles(launch, program, set(block_of.values()), slice)
    return GpuMappingPlot(
        kernel.definition.name,
        launch.name,
        points,
        launch.grid,
        launch.block,
        loops,
        block_of,
        thread_of,
        tiles,
        shapes,
        dict(sizes),
        note,
    )


@dataclass(frozen=True)
class TensorFootprint:
    """What one tile (a GPU block, or a tile of the CPU schedule) touches of one tensor."""

    #: block ids (x first), or the values of the loops around the tiled band then the tile's
    #: coordinates (loop values divided by the tile sizes)
    tile: tuple[int, ...]
    tensor: str
    elements: int  # distinct elements read or written by the tile's instances
    read: int  # distinct elements read
    written: int  # distinct elements written
    #: "x+1", "m+1", ... -> elements this tile shares with the next one along that dimension
    shared: dict = field(default_factory=dict)


@dataclass
class Footprints:
    """Per tile (``unit``: GPU blocks or CPU tiles), per tensor, the distinct elements its
    instances touch and those it shares with its neighbouring tiles (elements loaded again by
    the next tile: reuse that a larger tile, or a cache the tiles share, would keep)."""

    definition: str
    unit: str  # "block" or "tile"
    where: str  # what the tiles are, e.g. "kernel polyc_mm_k0, grid (4, 2)"
    rows: list[TensorFootprint]
    sizes: dict
    distinct: dict = field(default_factory=dict)  # tensor -> distinct elements over all tiles

    def totals(self) -> dict:
        """tensor -> (sum over tiles of the elements each touches, distinct elements over all
        tiles): their ratio is how many tiles touch an element on average."""
        touched: dict = {}
        for row in self.rows:
            touched[row.tensor] = touched.get(row.tensor, 0) + row.elements
        return {tensor: (count, self.distinct[tensor]) for tensor, count in touched.items()}

    def to_list(self) -> list[dict]:
        """The table as plain rows, one per tile and tensor."""
        return [
            {
                self.unit: row.tile,
                "tensor": row.tensor,
                "elements": row.elements,
                "read": row.read,
                "written": row.written,
                **{f"shared with {k}": v for k, v in row.shared.items()},
            }
            for row in self.rows
        ]

    def __str__(self) -> str:
        lines = [f"{self.definition}, {self.where}: elements per {self.unit} and tensor"]
        for row in self.rows:
            shared = ", ".join(f"{v} with {k}" for k, v in row.shared.items())
            lines.append(
                f"  {self.unit} {row.tile} {row.tensor}: {row.elements} ({row.read} read, {row.written} written)"
                + (f"; shared {shared}" if shared else "")
            )
        for tensor, (touched, distinct) in self.totals().items():
            lines.append(f"  {tensor}: {touched} touched by all {self.unit}s, {distinct} distinct")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        neighbours = sorted({k for row in self.rows for k in row.shared})
        head = "".join(
            f"<th>{html.escape(h)}</th>"
            for h in (self.unit, "tensor", "elements", "read", "written", *[f"shared with {k}" for k in neighbours])
        )
        body = []
        for row in self.rows:
            cells = [str(row.tile), row.tensor, row.elements, row.read, row.written]
            cells += [row.shared.get(k, "") for k in neighbours]
            body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        totals = "".join(
            f"<li>{html.escape(t)}: {touched} elements touched by all {self.unit}s, {distinct} distinct"
            f" ({touched / max(distinct, 1):.2f} {self.unit}s per element)</li>"
            for t, (touched, distinct) in self.totals().items()
        )
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        return (
            f"<div class=\"polyc-footprints\"><p><b>{html.escape(self.definition)}</b> at {html.escape(sizes)}: "
            f"{html.escape(self.where)}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            f"<ul>{totals}</ul></div>"
        )


def block_footprints(kernel, sizes: dict, dialect: str = "opencl", statement: str | None = None) -> Footprints:
    """For the GPU launch that runs ``statement`` (default: as :func:`plot_gpu_mapping`), every
    block's footprint per tensor: the distinct elements its instances read or write (the image
    of the block's instances under the def's access relations, enumerated by isl at ``sizes``)
    and how many of them the next block along x, y, z touches too."""
    stages, mapped = _mapped_plan(kernel, sizes, dialect)
    program = stages.program
    launch, _ = _launch_of(mapped, statement, program)
    ids = launch_ids(launch, program)
    blocks = ids.apply_range(_first_dims(ids, launch.block_dims))
    neighbours = [(d, f"{'xyz'[d]}+1") for d in range(launch.block_dims)]
    rows, distinct = _footprints(program, blocks, neighbours, x_first=True)
    where = f"kernel {launch.name}, grid {launch.grid}, block {launch.block}"
    return Footprints(kernel.definition.name, "block", where, rows, dict(sizes), distinct)


def tile_footprints(kernel, sizes: dict, statement: str | None = None) -> Footprints:
    """The same as :func:`block_footprints` for the tiles of the compiled CPU schedule: the
    outermost tiled band over ``statement`` (default: the first statement under a tiled band),
    a tile being the instances whose loop values divided by the tile sizes (rounded down) are
    equal, within one iteration of the loops around the band (as ``plot_domain(tiles=True)``).
    Raises :class:`PolycError` when no band over the statement is tiled (the path is not the
    generic loop nest, or tiling was not worth it: the reason is given)."""
    stages = kernel.stages(sizes)
    program = stages.program
    decisions = [d for d in stages.decisions if d.member_maps and (statement is None or statement in d.statements)]
    tiled = next((d for d in decisions if d.tile_sizes), None)
    if tiled is None:
        reasons = "; ".join(f"{', '.join(d.statements)}: {d.tiling}" for d in decisions if d.tiling)
        raise PolycError(
            f"{kernel.definition.name} has no tiled band{' over ' + statement if statement else ''} on the "
            f"{stages.path} path at these sizes" + (f" ({reasons})" if reasons else "")
        )
    prefix = tiled.prefix
    tile_of = prefix
    for member, size in zip(tiled.member_maps, tiled.tile_sizes):
        divide = isl.UnionMap.read_from_str(program.ctx, f"{{ [v] -> [floor(v / {size})] }}")
        tile_of = tile_of.flat_range_product(member.apply_range(divide))
    tile_of = tile_of.intersect_params(program.context)
    # The tile coordinates follow the values of the loops around the band (the prefix's width).
    widths: list[int] = []
    prefix.range().foreach_set(lambda piece: widths.append(piece.dim(isl.dim_type.set)))
    start = max(widths, default=0)
    names = [
        "/".join(sorted(set(indices.values()))) if indices else f"c{tiled.depth + d}"
        for d, indices in enumerate(tiled.member_indices or [{}] * len(tiled.tile_sizes))
    ]
    neighbours = [(start + d, f"{names[d]}+1") for d in range(len(tiled.tile_sizes))]
    rows, distinct = _footprints(program, tile_of, neighbours)
    where = f"tiles {' x '.join(map(str, tiled.tile_sizes))} of {', '.join(names)}"
    return Footprints(kernel.definition.name, "tile", where, rows, dict(sizes), distinct)


def _footprints(program, tile_of: isl.UnionMap, neighbours: list, x_first: bool = False) -> tuple[list, dict]:
    """Rows of :class:`TensorFootprint` for the tiles ``tile_of`` (instance -> tile key) gives,
    and the distinct elements of each tensor over all tiles.  ``neighbours``: (position in the
    key, label) of the dimensions along which the next tile is compared.  Rows go in the order
    of the keys, the last dimension fastest, or with ``x_first`` (GPU blocks) the first."""
    context = program.context
    per_tile: dict = {}  # (tile key, tensor, "read"/"written") -> set of elements
    for kind, access in (("read", program.reads), ("written", program.writes)):
        access = access.intersect_params(context)
        footprint = tile_of.reverse().apply_range(access.align_params(tile_of.get_space()))
        for _, tile, tensor, element in pairs(footprint):
            per_tile.setdefault((tile, tensor, kind), set()).add(element)
    tensors = sorted({tensor for _, tensor, _ in per_tile})
    tiles = sorted({tile for tile, _, _ in per_tile}, key=lambda t: tuple(reversed(t)) if x_first else t)
    rows, distinct = [], {}
    for tensor in tensors:
        touched = {
            t: per_tile.get((t, tensor, "read"), set()) | per_tile.get((t, tensor, "written"), set()) for t in tiles
        }
        distinct[tensor] = len(set().union(*touched.values()))
        for tile in tiles:
            if not touched[tile]:
                continue
            shared = {}
            for position, label in neighbours:
                neighbour = tuple(v + (1 if e == position else 0) for e, v in enumerate(tile))
                if neighbour in touched:
                    shared[label] = len(touched[tile] & touched[neighbour])
            rows.append(
                TensorFootprint(
                    tile,
                    tensor,
                    len(touched[tile]),
                    len(per_tile.get((tile, tensor, "read"), ())),
                    len(per_tile.get((tile, tensor, "written"), ())),
                    shared,
                )
            )
    return rows, distinct


def _first_dims(relation: isl.UnionMap, count: int) -> isl.UnionMap:
    """[ids...] -> [first ``count`` of them], on the range space of ``relation``."""
    spaces: list[isl.Set] = []
    relation.range().foreach_set(spaces.append)
    width = spaces[0].dim(isl.dim_type.set)
    names = [f"i{d}" for d in range(width)]
    return isl.UnionMap.read_from_str(relation.get_ctx(), f"{{ [{', '.join(names)}] -> [{', '.join(names[:count])}] }}")
