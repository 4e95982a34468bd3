"""Tile sizes: given by the user, or chosen by a simple model of the machine's caches.

The model: a tile of a band with sizes T1..Tn touches, for each access, the product of the tile
sizes of the members that move its subscripts.  A tile's data must fit in half the L2 cache,
so that it stays cached while the tile runs.  Two candidates: the largest equal power-of-two
size (the only one when the sizes are symbolic), and, when the band's extents are known, the
whole band with its outer members halved until it fits (the inner loops whole).  The cheaper
by :func:`_cost` wins: elements fetched from beyond the cache per iteration, plus the starts of
the innermost loop.  A third candidate, when the innermost loop strides across an access's rows
(a transpose), cuts the innermost loop to the lines L1 can hold for that stride
(:func:`_run_capacity`: rows a power-of-two apart share one set of L1) and keeps the equal
blocks of the outer members.  The caches are this machine's, or the ``cache_sizes`` option's (exports for
another machine).
"""

from __future__ import annotations

import math

import islpy as isl

from polyc.ir.model import PolyProgram
from polyc.lang.symbolic import Affine
from polyc.options import Options
from polyc.target import PAGE_BYTES, target_of, usable_cores

_CANDIDATE_SIZES = (256, 128, 64, 32, 16, 8)


def cache_sizes(options: Options | None = None) -> dict[int, int]:
    """Data/unified cache size in bytes per level (1, 2, 3) of the options' target
    (:func:`polyc.target.target_of`): ``options.cache_sizes`` when given, else this machine's."""
    return target_of(options).caches


def l1_set_span(options: Options | None = None) -> int:
    """Bytes between two addresses that fall in the same set of L1, for the options' target."""
    return target_of(options).l1_set_span


def choose_tile_sizes(
    node: isl.ScheduleNode,
    program: PolyProgram,
    user_sizes: tuple[int, ...] | None,
    caches: dict[int, int],
    threads: int | None = None,
    set_span: int = PAGE_BYTES,
) -> list[int] | None:
    """Tile sizes for the band at ``node`` (outermost member first), or None not to tile;
    ``threads``: how many threads run its parallel loop (None: this machine's cores);
    ``set_span``: L1's size over its ways (:func:`l1_set_span`)."""
    n = node.band_n_member()
    if user_sizes:
        sizes = list(user_sizes[:n])
        return sizes + [sizes[-1]] * (n - len(sizes))
    from polyc.schedule.transform import member_indices, statement_accesses, stride_score  # shares the member analysis

    movers: list[dict[str, str]] = [member_indices(node, m, program) for m in range(n)]
    accesses: list[tuple[frozenset[int], int]] = []  # (members moving the access, element size)
    contiguous: list[frozenset[int]] = []  # per access, the members moving its last dimension
    steps: list[dict[int, int | None]] = []  # per access and member: bytes its index steps the address
    fixed = _fixed_sizes(program.context)
    statements = set().union(*[m.keys() for m in movers]) if movers else set()
    for name in statements:
        statement = program.statement(name)
        members = {m: movers[m][name] for m in range(n) if name in movers[m]}
        for tensor, subscripts in statement_accesses(statement):
            moving = frozenset(
                m
                for m, index in members.items()
                if any(not isinstance(s, Affine) or index in s.names() for s in subscripts)
            )
            accesses.append((moving, program.definition.tensor(tensor).dtype.itemsize))
            last = subscripts[-1] if subscripts else None
            contiguous.append(
                frozenset(m for m, index in members.items() if isinstance(last, Affine) and index in last.names())
            )
            shape = program.definition.tensor(tensor).shape
            steps.append(
                {m: _byte_step(subscripts, shape, index, accesses[-1][1], fixed) for m, index in members.items()}
            )
    budget = caches.get(2, 1 << 20) // 2
    equal = _equal_sizes(accesses, n, budget)
    extents = band_extents(node, program.context)
    if extents is None:
        return equal
    inner = max(range(n), key=lambda m: (stride_score(node, m, program), m))
    whole_inner = _outer_first_sizes(accesses, extents, inner, budget)
    capped = [min(size, extent) for size, extent in zip(equal, extents)]  # a tile beyond the extent is the extent
    # Accesses the innermost loop strides across (a transpose's A(j, i) under j): one cache line
    # each, and how many of those lines L1 holds at their stride.
    l1 = caches.get(1, 32 << 10)
    strided = [
        (moving, itemsize, _run_capacity(step.get(inner), l1, set_span))
        for (moving, itemsize), last, step in zip(accesses, contiguous, steps)
        if inner in moving and last and inner not in last
    ]
    candidates = [(capped, equal)]  # (sizes the cost is taken of, sizes chosen)
    if whole_inner is not None:
        candidates.append((whole_inner, whole_inner))
    # Equal blocks with the innermost loop cut to the strided lines L1 holds.  The outer members
    # keep their blocks: their rows cross the same strides, and longer ones measured slower
    # (a 2048 x 2048 symmetrisation: 1024 x 12 tiles slower than 256 x 12 or 256 x 256).
    run = min((capacity for _, _, capacity in strided), default=capped[inner])
    if run < capped[inner]:
        run_sized = list(capped)
        run_sized[inner] = run
        candidates.append((run_sized, run_sized))
    # The first of the cheapest: equal blocks unless another candidate is strictly cheaper.
    chosen = min(candidates, key=lambda c: _cost(accesses, c[0], inner, strided))[1]
    coincident = [m for m in range(n) if node.band_member_get_coincident(m)]
    if coincident:
        _leave_tiles_for_threads(chosen, extents, coincident[0], threads or usable_cores())
    return chosen


def _leave_tiles_for_threads(sizes: list[int], extents: list[int], parallel: int, threads: int) -> None:
    """Shrink the tile of the member whose tile loop runs in parallel until its tiles are at
    least as many as the threads (where its extent allows): a tile as large as the whole loop
    leaves all but one thread idle (a large L2 makes whole rows fit)."""
    if threads > 1 and -(-extents[parallel] // sizes[parallel]) < threads:
        sizes[parallel] = max(1, -(-extents[parallel] // threads))


def _footprint(accesses: list[tuple[frozenset[int], int]], sizes: list[int]) -> int:
    """Bytes a tile touches: per access, the product of the tile sizes of the members moving it."""
    return sum(itemsize * math.prod(sizes[m] for m in moving) for moving, itemsize in accesses)


def _equal_sizes(accesses, n: int, budget: int) -> list[int]:
    """The largest equal power-of-two size whose tile fits the budget (the extents unknown)."""
    for size in _CANDIDATE_SIZES:
        if _footprint(accesses, [size] * n) <= budget:
            return [size] * n
    return [_CANDIDATE_SIZES[-1]] * n


def _outer_first_sizes(accesses, extents: list[int], inner: int, budget: int) -> list[int] | None:
    """Tiles that keep the inner members whole: starting from the whole band, the outermost
    member is halved until the tile fits or it is down to 1, then the next, the member that
    suits the innermost loop (``inner``) last.  None when even that does not fit."""
    sizes = list(extents)
    for member in [m for m in range(len(extents)) if m != inner] + [inner]:
        while _footprint(accesses, sizes) > budget and sizes[member] > 1:
            sizes[member] = (sizes[member] + 1) // 2
    return sizes if _footprint(accesses, sizes) <= budget else None


#: What starting the innermost loop once costs, in elements fetched from memory (its set-up and
#: its vector remainder).  With it the model prefers a tensordot's whole 28 x 28 planes to
#: 8 x 8 x 8 tiles (slower even than gcc -O3's naive loops: the ``tensordot`` case of
#: ``python -m benchmarks``), but keeps a matmul's equal 128-blocks, whose reuse is worth far more.
_INNER_LOOP_COST = 4.0


def _cost(accesses, sizes: list[int], inner: int, strided=()) -> float:
    """Per iteration of the band: the elements fetched from beyond the cache (an access is
    fetched again for each tile of the members that do not move it, so once per product of
    their tile sizes), plus the start of an innermost loop every ``sizes[inner]`` iterations.

    An access in ``strided`` (moving members, element size, lines L1 holds at its stride) takes
    a cache line per iteration; its other elements are used by later iterations of the loops
    outside only while the lines of one run of the innermost loop stay in L1.  Beyond that,
    each iteration costs a whole line of elements: a 2048 x 2048 transpose with whole rows of
    j innermost (32 x 2048 tiles) took far longer than with 256 x 256 tiles, and on an Intel
    core, whose 12-way L1 holds 12 lines 8 KiB apart, 256 x 12 tiles beat 256 x 256 ones."""
    fetched = sum(1.0 / math.prod(sizes[m] for m in range(len(sizes)) if m not in moving) for moving, _ in accesses)
    for moving, itemsize, capacity in strided:
        if sizes[inner] > capacity:
            fetched += (max(1, _LINE_BYTES // itemsize) - 1) / math.prod(
                sizes[m] for m in range(len(sizes)) if m not in moving
            )
    return fetched + _INNER_LOOP_COST / sizes[inner]


def _run_capacity(step: int | None, l1: int, set_span: int) -> int:
    """How many lines of a run that steps ``step`` bytes from one element to the next stay in
    L1 together: half of L1, unless the step makes them share sets.  Lines ``step`` apart cycle
    through ``set_span / gcd(step, set_span)`` sets, each of L1's ways deep: rows of a
    2048-float matrix (8 KiB apart) all fall in one set, 12 lines on a 48 KiB 12-way L1."""
    half = l1 // 2 // _LINE_BYTES
    if not step:
        return half
    ways = max(1, l1 // set_span)
    sets = min(set_span // math.gcd(abs(step), set_span), max(1, set_span // _LINE_BYTES))
    return max(1, min(half, ways * sets))


def _byte_step(subscripts, shape, index: str, itemsize: int, sizes: dict[str, int]) -> int | None:
    """Bytes the address of an access to a row-major tensor of ``shape`` moves when ``index``
    grows by one; None when a subscript is not affine or the shape is not known."""
    step, row = 0, itemsize
    for subscript, extent in zip(reversed(subscripts), reversed(shape)):
        if not isinstance(subscript, Affine) or (index in subscript.names() and not subscript.coefficient(index)):
            return None  # the index inside a floor, min or max: no single step
        step += subscript.coefficient(index) * row
        try:
            row *= extent.evaluate(sizes)
        except (KeyError, ValueError):
            return None
    return step


def _fixed_sizes(context: isl.Set) -> dict[str, int]:
    """The sizes ``context`` fixes to one value (all of them when the kernel is specialised)."""
    fixed: dict[str, int] = {}
    for position in range(context.dim(isl.dim_type.param)):
        value = context.plain_get_val_if_fixed(isl.dim_type.param, position)
        name = context.get_dim_name(isl.dim_type.param, position)
        if value.is_int() and name is not None:
            fixed[name] = value.to_python()
    return fixed


#: Bytes of a cache line (x86 and the AArch64 cores polyc targets).
_LINE_BYTES = 64


def band_extents(node: isl.ScheduleNode, context: isl.Set) -> list[int] | None:
    """Each member's number of values over the band's domain under ``context``, when they are
    all constants (the sizes are specialised); None otherwise."""
    domain = node.get_domain().intersect_params(context)
    partial = node.band_get_partial_schedule()
    extents = []
    for member in range(node.band_n_member()):
        values = partial.get_at(member).intersect_domain(domain)
        low, high = values.min_val(), values.max_val()
        if not (low.is_int() and high.is_int()):
            return None
        extents.append(max(1, high.to_python() - low.to_python() + 1))
    return extents
