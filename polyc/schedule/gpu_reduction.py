"""Block-level reductions: a block of threads shares the work of one row (or of everything).

Two kinds of launch run this way instead of one value per thread
(:mod:`polyc.schedule.gpu_mapping`):

* a launch whose first band has no coincident member (a full reduction into scalars: one
  block, one thread otherwise);
* a launch mapping one loop of "rows" (a softmax's or a layernorm's rows, a matrix-vector
  product's outputs) with long work in each row, when the device model prefers it: too few
  rows to fill the device one thread each, and rows whose one-thread-each reads would not be
  coalesced.  Each row then goes to a block of its own.

Inside a block, the launch's statements run one after the other (in the order of the flat
schedule), each followed by a barrier where a dependence between two threads needs one (the
barriers that isl finds needless are dropped).  A statement's innermost loop (the last dimension of
the flat schedule along which it varies within a row) is dealt to the threads cyclically
(consecutive threads take consecutive values: coalesced); a statement without one runs on
thread 0.  An update whose target is one element per block (``s(n) += ...`` in row ``n``) is a
tree reduction: each thread reduces its share into a private partial, the partials are
combined in shared memory by ``log2(threads)`` steps with a barrier after each, and thread 0
combines the result into the target.  Operators ``+``, ``*``, ``max`` and ``min``; the order of
the operations changes (as OpenMP's parallel reductions change it on the CPU), within TC's
tolerance of ``n * eps * max|term|``.

Everything is a statement of a new flat schedule, time ``[group, phase, the old time...]``,
so isl generates the loops and the guards.  For a tree reduction's group:

    phase 0            partial = identity                        (every thread)
    phase 1            the updates of this thread's share, into the partial
    phase 2            tree[t] = partial                         (a shared array per update)
    phase 3            barrier
    phase 4 + 2k       tree[t] op= tree[t + s_k] for t < s_k = threads / 2^(k+1)
    phase 5 + 2k       barrier
    phase 4 + 2L       target = target op tree[0]                (thread 0)
    phase 5 + 2L       barrier

and for any other statement: phase 0 the statement, phase 1 a barrier (when needed).  The
barriers fence global memory too: a later statement reads what an earlier one wrote, on
another thread.

:func:`prove_block_reduction` checks the result with isl: no dependence joins two rows; every
dependence between two statement instances goes forward in the new order and, between two
threads, has a barrier between its two ends; and each tree is race-free (:func:`prove_tree`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import islpy as isl

from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram
from polyc.schedule.gpu_promotion import BARRIER, BLOCK_ID, THREAD_ID, find_races
from polyc.schedule.isl_helpers import named, out_dims, project_params, sets, value_range

#: Threads of a reduction block (a power of two; fewer when the work of a row is shorter).
REDUCTION_THREADS = 256

PARTIAL_INIT = "polyc_partial_init_"
PARTIAL_STORE = "polyc_partial_store_"
TREE = "polyc_tree_"
FINAL = "polyc_final_"
#: The barriers of a block reduction (``polyc_barrier_g<group>_<phase>``): global memory too.
GROUP_BARRIER = BARRIER + "_g"

_SUPPORTED = ("+", "*", "max", "min")


@dataclass(frozen=True)
class RowLoop:
    """A band member whose values go one per block."""

    member: int
    schedule: isl.UnionMap  # statement instance -> the member's value
    offset: int
    extent: int
    indices: dict  # statement -> the TC index the member runs over, when one


@dataclass(frozen=True)
class Tree:
    """An update statement reduced by a tree: its target element in the block's row."""

    statement: str
    tensor: str
    op: str
    subscripts: tuple[isl.Aff, ...]  # the target's element, affine in the sizes and block ids
    group: int  # its place in the block's order


@dataclass(frozen=True)
class BlockReduction:
    """How a launch runs with a block per row: its rows, its trees, its schedule."""

    threads: int
    rows: tuple[RowLoop, ...]  # empty: one block runs everything
    trees: tuple[Tree, ...]
    schedule: isl.UnionMap
    thread_domain: isl.UnionSet  # what thread polyc_thread0 of block polyc_block0.. runs
    context: isl.Set  # the sizes and the ranges of the block and thread ids
    block_domain: isl.UnionSet  # what a block runs (block ids free; for the proofs)
    thread_of: isl.UnionMap  # block instance -> [thread]
    barriers: tuple[str, ...]

    @property
    def steps(self) -> int:
        return int(math.log2(self.threads))

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(row.extent for row in self.rows) or (1,)

    def tree(self, statement: str) -> Tree | None:
        """``statement``'s tree, if it has one."""
        return next((tree for tree in self.trees if tree.statement == statement), None)

    @staticmethod
    def partial(statement: str) -> str:
        return f"polyc_partial_{statement}"

    @staticmethod
    def shared(statement: str) -> str:
        return f"polyc_tree_of_{statement}"

    def tree_stride(self, step: int) -> int:
        return self.threads >> (step + 1)


def reduce_in_blocks(
    program: PolyProgram,
    flat: isl.UnionMap,
    domain: isl.UnionSet,
    band: isl.ScheduleNode | None,
    dependences: Dependences,
    rows: list[int],
    min_row_work: int = 2,
    warp: int = 32,
    threads: int = REDUCTION_THREADS,
) -> BlockReduction | None:
    """The block reduction of the launch running ``domain`` in the order ``flat`` with the
    members ``rows`` of its first ``band`` one value per block (none: one block), or None when
    the launch cannot run so (a statement outside the scheme, a failed proof) or a row has
    fewer than ``min_row_work`` values to deal in every statement.  A statement's innermost
    loop is dealt when it has two ``warp``s of values, else its longest."""
    from polyc.schedule.transform import member_indices

    if band is None or band.get_type() != isl.schedule_node_type.band:
        return None
    ctx = program.ctx
    row_loops = []
    for member in rows:
        member_map = isl.UnionMap.from_multi_union_pw_aff(
            isl.MultiUnionPwAff.from_union_pw_aff(band.band_get_partial_schedule().get_at(member))
        ).intersect_domain(domain)
        low, high = value_range(member_map.range(), program.context)
        row_loops.append(RowLoop(member, member_map, low, high - low + 1, member_indices(band, member, program)))
    row_of = _rows_map(row_loops, domain, ctx)
    length = out_dims(flat)

    # the groups, in the order of the flat schedule: (statement, dealt position or None, low)
    groups = []
    most_work = 0
    for statement_name in _in_flat_order(flat, domain, program):
        statement = program.statement(statement_name)
        instances = named(domain, statement_name)
        times = flat.intersect_domain(instances)
        # the innermost loop (consecutive threads, consecutive addresses), or the longest when
        # the innermost is too short to give every thread work
        work = {
            position: _values_per_row(times, row_of.intersect_domain(instances), position, program)
            for position in range(length)
        }
        varying = [position for position in range(length) if work[position] > 1]
        dealt = None
        if varying:
            dealt = varying[-1] if work[varying[-1]] >= 2 * warp else max(varying, key=lambda p: (work[p], p))
            most_work = max(most_work, work[dealt])
        low = value_range(_pick(times, dealt, length, ctx).range(), program.context)[0] if dealt is not None else 0
        tree = None
        if dealt is not None and _one_element_per_row(statement, row_of.intersect_domain(instances), program):
            if statement.kind != "update" or statement.source.op not in _SUPPORTED:
                return None  # threads would write one element otherwise than by a reduction
            if any(access.tensor == statement.source.target for access in statement.reads if access.read is not None):
                return None  # an update reading its own target would see its partial
            tree = (statement.source.target, statement.source.op)
        groups.append((statement_name, dealt, low, tree))
    if most_work < min_row_work:
        return None
    threads = min(threads, 1 << max(1, math.ceil(math.log2(most_work))))
    steps = int(math.log2(threads))

    schedule, block_domain, thread_of, barriers = _block_schedule(program, flat, domain, groups, threads, steps, length)
    block_ids = [f"{BLOCK_ID}{d}" for d in range(max(1, len(row_loops)))]
    thread = f"{THREAD_ID}0"
    params = ", ".join(
        [
            *(
                program.context.get_dim_name(isl.dim_type.param, p)
                for p in range(program.context.dim(isl.dim_type.param))
            ),
            *block_ids,
            thread,
        ]
    )
    ranges = [f"0 <= {block_id} < {row.extent}" for block_id, row in zip(block_ids, row_loops)] or [
        f"{block_ids[0]} = 0"
    ]
    ids = isl.Set.read_from_str(ctx, f"[{params}] -> {{ : {' and '.join(ranges)} and 0 <= {thread} < {threads} }}")
    context = ids.intersect(program.context.align_params(ids.get_space()))
    # the block's instances: the original ones of its rows (new statements have no row)
    in_block = block_domain
    for d, row in enumerate(row_loops):
        value = isl.Set.read_from_str(ctx, f"[{block_ids[d]}] -> {{ [v] : v = {row.offset} + {block_ids[d]} }}")
        mine = row.schedule.intersect_range(isl.UnionSet.from_set(value)).domain()
        in_block = in_block.subtract(domain).union(in_block.intersect(domain).intersect(mine))
    own = thread_of.intersect_range(
        isl.UnionSet.from_set(isl.Set.read_from_str(ctx, f"[{thread}] -> {{ [{thread}] }}"))
    ).domain()
    thread_domain = in_block.intersect(own).intersect_params(context)
    trees = []
    for group, (statement_name, _, _, tree) in enumerate(groups):
        if tree is None:
            continue
        write = isl.UnionMap.from_map(program.statement(statement_name).write)
        element = isl.Set.from_union_set(write.intersect_domain(named(in_block, statement_name)).range())
        subscripts = _single_affs(element.intersect_params(context))
        if subscripts is None:
            return None
        trees.append(Tree(statement_name, *tree, subscripts, group))
    reduction = BlockReduction(
        threads,
        tuple(row_loops),
        tuple(trees),
        schedule,
        thread_domain,
        context,
        in_block.intersect_params(context),
        thread_of,
        tuple(barriers),
    )
    if prove_block_reduction(reduction, program, domain, dependences) is not None:
        return None
    # a statement's closing barrier stays only where a dependence between two threads needs it
    # (a softmax's exponentials feed its sum on the same threads: no barrier between them)
    tree_groups = {tree.group for tree in trees}
    for group in range(len(groups)):
        if group in tree_groups:  # its result is written by the final step: keep its barriers
            continue
        trial = _without_barrier(reduction, f"{GROUP_BARRIER}{group}_1")
        if not _unseparated(trial, program, domain, dependences).is_empty():
            continue
        reduction = trial
    return reduction


def _without_barrier(reduction: BlockReduction, name: str) -> BlockReduction:
    keep = lambda union: union.subtract(named(union, name))  # noqa: E731
    return dataclasses.replace(
        reduction,
        schedule=reduction.schedule.subtract_domain(named(reduction.block_domain, name)),
        thread_domain=keep(reduction.thread_domain),
        block_domain=keep(reduction.block_domain),
        thread_of=reduction.thread_of.subtract_domain(named(reduction.block_domain, name)),
        barriers=tuple(b for b in reduction.barriers if b != name),
    )


def _block_schedule(
    program: PolyProgram, flat: isl.UnionMap, domain: isl.UnionSet, groups: list, threads: int, steps: int, length: int
):
    """(flat schedule, the block's instances, instance -> [thread], barrier names): the groups
    and phases of the module's docstring.  New statements carry their thread as their one
    dimension."""
    ctx = program.ctx
    dims = ", ".join(f"f{i}" for i in range(length))
    zeros = ", ".join(["0"] * length)
    schedule = isl.UnionMap.empty(flat.get_space())
    block_domain = isl.UnionSet.empty(domain.get_space())
    thread_of = isl.UnionMap.empty(flat.get_space())
    barriers = []

    def new_statement(name: str, group: int, phase: int, condition: str = "true") -> None:
        nonlocal schedule, block_domain, thread_of
        time = f"[{group}, {phase}{', ' + zeros if length else ''}]"
        schedule = schedule.union(isl.UnionMap.read_from_str(ctx, f"{{ {name}[t] -> {time} }}"))
        block_domain = block_domain.union(
            isl.UnionSet.read_from_str(ctx, f"{{ {name}[t] : 0 <= t < {threads} and {condition} }}")
        )
        thread_of = thread_of.union(isl.UnionMap.read_from_str(ctx, f"{{ {name}[t] -> [t] }}"))

    def barrier(group: int, phase: int) -> None:
        name = f"{GROUP_BARRIER}{group}_{phase}"
        barriers.append(name)
        new_statement(name, group, phase)

    for group, (statement, dealt, low, tree) in enumerate(groups):
        instances = named(domain, statement)
        phase = 1 if tree else 0
        at = isl.UnionMap.read_from_str(ctx, f"{{ [{dims}] -> [{group}, {phase}{', ' + dims if dims else ''}] }}")
        schedule = schedule.union(flat.intersect_domain(instances).apply_range(at))
        block_domain = block_domain.union(instances)
        if dealt is None:  # thread 0
            owner = isl.UnionMap.from_domain_and_range(instances, isl.UnionSet.read_from_str(ctx, "{ [0] }"))
        else:  # value v of the dealt dimension: thread (v - low) mod threads
            deal = isl.UnionMap.read_from_str(
                ctx, f"{{ [{dims}] -> [t] : 0 <= t < {threads} and exists q : f{dealt} = {low} + t + {threads} q }}"
            )
            owner = flat.intersect_domain(instances).apply_range(deal)
        thread_of = thread_of.union(owner)
        if tree is None:
            barrier(group, 1)
            continue
        new_statement(PARTIAL_INIT + statement, group, 0)
        new_statement(PARTIAL_STORE + statement, group, 2)
        barrier(group, 3)
        for step in range(steps):
            new_statement(f"{TREE}{statement}_{step}", group, 4 + 2 * step, f"t < {threads >> (step + 1)}")
            barrier(group, 5 + 2 * step)
        new_statement(FINAL + statement, group, 4 + 2 * steps, "t = 0")
        barrier(group, 5 + 2 * steps)
    return schedule, block_domain.intersect_params(program.context), thread_of, barriers


def tree_accesses(reduction: BlockReduction, statement: str) -> tuple[isl.UnionMap, isl.UnionMap]:
    """(writes, reads) of ``statement``'s shared tree: block instance -> [element]."""
    ctx = reduction.context.get_ctx()
    writes = [f"{PARTIAL_STORE}{statement}[t] -> [t]"]
    reads = [f"{FINAL}{statement}[t] -> [0]"]
    for step in range(reduction.steps):
        name, stride = f"{TREE}{statement}_{step}", reduction.tree_stride(step)
        writes.append(f"{name}[t] -> [t]")
        reads += [f"{name}[t] -> [t]", f"{name}[t] -> [t + {stride}]"]
    as_map = lambda pairs: isl.UnionMap.read_from_str(ctx, "{ " + "; ".join(pairs) + " }")  # noqa: E731
    return (
        as_map(writes).intersect_domain(reduction.block_domain),
        as_map(reads).intersect_domain(reduction.block_domain),
    )


def prove_tree(reduction: BlockReduction, program: PolyProgram) -> str | None:
    """None when every tree is race-free and reads only what was stored, else what fails."""
    for tree in reduction.trees:
        statement, tensor = tree.statement, tree.tensor
        writes, reads = tree_accesses(reduction, statement)
        # only the tree's own statements touch it: the proof needs them and the barriers only
        barriers = [name for name in reduction.barriers if name.startswith(f"{GROUP_BARRIER}{tree.group}_")]
        names = {
            *barriers,
            PARTIAL_STORE + statement,
            FINAL + statement,
            *(f"{TREE}{statement}_{step}" for step in range(reduction.steps)),
        }
        involved = isl.UnionSet.empty(reduction.block_domain.get_space())
        for piece in sets(reduction.block_domain):
            if piece.get_tuple_name() in names:
                involved = involved.union(isl.UnionSet.from_set(piece))
        race = find_races(reduction.schedule, involved, barriers, reduction.thread_of, writes, reads)
        if not race.is_empty():
            return f"tree of {statement} ({tensor}): threads race without a barrier between {race.coalesce()}"
        if not reads.range().is_subset(writes.range()):
            return f"tree of {statement} ({tensor}): a step reads an element no thread stored"
    return None


def prove_block_reduction(
    reduction: BlockReduction, program: PolyProgram, domain: isl.UnionSet, dependences: Dependences
) -> str | None:
    """None when the block reduction computes what the schedule did, else what fails: a
    dependence between two rows (two blocks), one going backwards in the new order, or one
    between two threads with no barrier between; then the trees' own proof."""
    if reduction.rows:
        row_of = _rows_map(list(reduction.rows), domain, program.ctx)
        kept = _kept_dependences(reduction, domain, dependences)
        across = kept.apply_domain(row_of).apply_range(row_of)
        if not across.subtract(across.range().identity()).is_empty():
            return "a dependence joins two rows"
    related = _related(reduction, domain, dependences)
    block_ids = [f"{BLOCK_ID}{d}" for d in range(len(reduction.rows))]
    in_block = project_params(reduction.block_domain, block_ids)
    time = reduction.schedule.intersect_domain(in_block)
    pairs = time.reverse().apply_range(related).apply_range(time)
    times = pairs.domain().union(pairs.range())
    backwards = pairs.intersect(times.lex_ge_union_set(times))
    if not backwards.is_empty():
        return f"a dependence goes backwards in the block's order: {backwards.coalesce()}"
    # a dependence between two threads needs a barrier between its two ends
    unseparated = _unseparated(reduction, program, domain, dependences)
    if not unseparated.is_empty():
        return f"a dependence joins two threads with no barrier between: {unseparated.coalesce()}"
    return prove_tree(reduction, program)


def _kept_dependences(reduction: BlockReduction, domain: isl.UnionSet, dependences: Dependences) -> isl.UnionMap:
    """The launch's dependences but a tree's own reduction (its updates may run in any order)."""
    related = dependences.all
    for tree in reduction.trees:
        updates = named(domain, tree.statement)
        related = related.subtract(dependences.reduction.intersect_domain(updates).intersect_range(updates))
    return related.intersect_domain(domain).intersect_range(domain)


def _related(reduction: BlockReduction, domain: isl.UnionSet, dependences: Dependences) -> isl.UnionMap:
    """The dependences the block must keep, between instances of one block (and one row)."""
    block_ids = [f"{BLOCK_ID}{d}" for d in range(len(reduction.rows))]
    in_block = project_params(reduction.block_domain, block_ids)
    related = _kept_dependences(reduction, domain, dependences).intersect_domain(in_block).intersect_range(in_block)
    if reduction.rows:
        row_of = _rows_map(list(reduction.rows), domain, reduction.context.get_ctx())
        related = related.intersect(row_of.apply_range(row_of.reverse()))
    return related


def _unseparated(
    reduction: BlockReduction, program: PolyProgram, domain: isl.UnionSet, dependences: Dependences
) -> isl.UnionMap:
    """The times of dependences between two threads of a block with no barrier between."""
    related = _related(reduction, domain, dependences)
    same_thread = reduction.thread_of.apply_range(reduction.thread_of.reverse())
    block_ids = [f"{BLOCK_ID}{d}" for d in range(len(reduction.rows))]
    in_block = project_params(reduction.block_domain, block_ids)
    time = reduction.schedule.intersect_domain(in_block)
    pairs = time.reverse().apply_range(related.subtract(same_thread)).apply_range(time)
    if pairs.is_empty():
        return pairs
    barrier_times = isl.UnionSet.empty(pairs.get_space().domain())
    for name in reduction.barriers:
        barrier_times = barrier_times.union(time.intersect_domain(named(in_block, name)).range())
    before = pairs.domain().lex_lt_union_set(barrier_times)
    after = barrier_times.lex_lt_union_set(pairs.range())
    return pairs.subtract(before.apply_range(after))


# ----------------------------------------------------------------------------- pieces
def _rows_map(rows: list[RowLoop], domain: isl.UnionSet, ctx: isl.Context) -> isl.UnionMap:
    """Instance -> [row values] ([] without rows: every instance in the one block)."""
    if not rows:
        return isl.UnionMap.from_domain_and_range(domain, isl.UnionSet.read_from_str(ctx, "{ [] }"))
    result = rows[0].schedule
    for row in rows[1:]:
        result = result.flat_range_product(row.schedule)
    return result


def _in_flat_order(flat: isl.UnionMap, domain: isl.UnionSet, program: PolyProgram) -> list[str]:
    """The launch's statements by their first instance's time."""
    firsts = []
    for piece in sets(domain):
        times = isl.Set.from_union_set(flat.intersect_domain(isl.UnionSet.from_set(piece)).range())
        times = times.intersect_params(program.context)
        first = times.lexmin()
        point = first.sample_point()
        values = tuple(
            point.get_coordinate_val(isl.dim_type.set, d).to_python() for d in range(first.dim(isl.dim_type.set))
        )
        firsts.append((values, piece.get_tuple_name()))
    return [name for _, name in sorted(firsts)]


def _pick(times: isl.UnionMap, position: int, length: int, ctx: isl.Context) -> isl.UnionMap:
    dims = ", ".join(f"f{i}" for i in range(length))
    return times.apply_range(isl.UnionMap.read_from_str(ctx, f"{{ [{dims}] -> [f{position}] }}"))


def _values_per_row(times: isl.UnionMap, row_of: isl.UnionMap, position: int, program: PolyProgram) -> int:
    """Most values dimension ``position`` of ``times`` takes within one row."""
    values = row_of.reverse().apply_range(_pick(times, position, out_dims(times), program.ctx))
    if values.is_empty():
        return 0
    relation = isl.Map.from_union_map(values).intersect_params(program.context)
    span = relation.lexmax_pw_multi_aff().get_pw_aff(0).sub(relation.lexmin_pw_multi_aff().get_pw_aff(0)).max_val()
    return span.to_python() + 1 if span.is_int() else 0


def _one_element_per_row(statement, row_of: isl.UnionMap, program: PolyProgram) -> bool:
    """Whether the statement writes one element per row (a row's reduction target)."""
    write = isl.UnionMap.from_map(statement.write).intersect_params(program.context)
    return row_of.reverse().apply_range(write).is_single_valued()


def _single_affs(element: isl.Set) -> tuple[isl.Aff, ...] | None:
    """Each coordinate of a one-point set as one affine expression of its parameters."""
    affs = []
    for d in range(element.dim(isl.dim_type.set)):
        pieces: list[isl.Aff] = []
        element.dim_max(d).coalesce().foreach_piece(lambda _set, aff: pieces.append(aff))
        if len(pieces) != 1:
            return None
        affs.append(pieces[0])
    return tuple(affs)
