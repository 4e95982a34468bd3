"""Block-level tree reductions: a launch that reduces into scalars runs on a block of threads.

A launch whose first band has no coincident member would run on one thread
(:mod:`polyc.schedule.gpu_mapping`).  When it is a full reduction -- every statement either
initialises a 0-d tensor or updates one with ``+``, ``*``, ``max`` or ``min``, and the only
dependences among the updates are the reductions' own -- its instances are dealt to the
threads of one block instead (the band member with the most values, cyclically: consecutive
threads take consecutive values), each thread reduces its share into a private partial, and
the partials are combined in shared memory by a tree of ``log2(threads)`` steps with a barrier
after each.  Thread 0 initialises the target first and combines the tree's result into it last.

The order of the operations changes (as OpenMP's parallel reductions change it on the CPU),
so float sums may round differently: within TC's tolerance of ``n * eps * max|term|``.

Everything is a statement of the launch's flat schedule (time ``[phase, ...]``), so isl
generates the loops and the guards:

    phase 0            the targets' initialisations, thread 0
    phase 1            partial = identity
    phase 2            the updates of this thread's share, into the partial
    phase 3            red[t] = partial                      (shared array, one per target)
    phase 4            barrier
    phase 5 + 2k       red[t] op= red[t + s_k] for t < s_k = threads / 2^(k+1)
    phase 6 + 2k       barrier
    phase 5 + 2L       target = target op red[0], thread 0
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram
from polyc.schedule.gpu_promotion import BARRIER, BLOCK_ID, THREAD_ID, find_races

#: Threads of a reduction block (a power of two; fewer when the reduction is shorter).
REDUCTION_THREADS = 256

PARTIAL_INIT = "polyc_partial_init_"
PARTIAL_STORE = "polyc_partial_store_"
TREE = "polyc_tree_"
FINAL = "polyc_final_"


@dataclass(frozen=True)
class BlockReduction:
    """How a launch reduces on one block: the targets, their operators, the tree's steps."""

    threads: int
    targets: tuple[tuple[str, str], ...]   # (0-d tensor, operator)
    updates: tuple[str, ...]               # the update statements, whose target is the partial
    schedule: isl.UnionMap
    thread_domain: isl.UnionSet            # what thread polyc_thread0 runs
    context: isl.Set                       # the sizes and the range of the thread id
    block_domain: isl.UnionSet             # what the block runs (for the proofs)
    thread_of: isl.UnionMap                # block instance -> [thread]

    @property
    def steps(self) -> int:
        return int(math.log2(self.threads))

    @staticmethod
    def partial(tensor: str) -> str:
        return f"polyc_partial_{tensor}"

    @staticmethod
    def shared(tensor: str) -> str:
        return f"{tensor}_tree"

    def tree_stride(self, step: int) -> int:
        return self.threads >> (step + 1)


def reduce_in_block(program: PolyProgram, launch, band: isl.ScheduleNode | None, dependences: Dependences,
                    threads: int = REDUCTION_THREADS) -> BlockReduction | None:
    """The block reduction of a one-thread ``launch``, or None when it is not a full reduction."""
    statements = [program.statement(name) for name in launch.statements]
    updates = [s for s in statements if s.kind == "update"]
    targets: dict[str, str] = {}
    for statement in statements:
        tensor = program.definition.tensor(statement.source.target)
        if tensor.rank != 0 or statement.kind == "assign":
            return None
        if statement.kind == "update":
            if statement.source.op not in ("+", "*", "max", "min"):
                return None
            if targets.setdefault(tensor.name, statement.source.op) != statement.source.op:
                return None
    if not updates or band is None or band.get_type() != isl.schedule_node_type.band:
        return None
    update_domain = isl.UnionSet.empty(launch.domain.get_space())
    for statement in updates:
        update_domain = update_domain.union(isl.UnionSet.from_set(statement.domain))
    update_domain = update_domain.intersect(launch.domain)
    others = dependences.non_reduction.intersect_domain(update_domain).intersect_range(update_domain)
    if not others.is_empty():
        return None  # an update reads what another writes: not only a reduction
    for statement in updates:  # an update reading a target would see a partial
        if any(access.tensor in targets for access in statement.reads if access.read is not None):
            return None

    # deal the member with the most values across the threads
    best = None
    for member in range(band.band_n_member()):
        member_map = isl.UnionMap.from_multi_union_pw_aff(isl.MultiUnionPwAff.from_union_pw_aff(
            band.band_get_partial_schedule().get_at(member))).intersect_domain(update_domain)
        values = isl.Set.from_union_set(member_map.range()).intersect_params(program.context)
        values = values.project_out(isl.dim_type.param, 0, values.dim(isl.dim_type.param))
        if values.is_empty():
            continue
        low, high = _constant(values.dim_min(0)), _constant(values.dim_max(0))
        if best is None or high - low > best[2] - best[1]:
            best = (member_map, low, high)
    if best is None or best[2] == best[1]:
        return None
    member_map, low, high = best
    threads = min(threads, 1 << max(1, math.ceil(math.log2(high - low + 1))))
    steps = int(math.log2(threads))

    schedule, block_domain, thread_of = _tree_schedule(program, launch, update_domain, member_map, low, threads,
                                                       list(targets), steps)
    thread = f"{THREAD_ID}0"
    params = ", ".join([*(program.context.get_dim_name(isl.dim_type.param, p)
                          for p in range(program.context.dim(isl.dim_type.param))), f"{BLOCK_ID}0", thread])
    ids = isl.Set.read_from_str(program.ctx, f"[{params}] -> {{ : {BLOCK_ID}0 = 0 and 0 <= {thread} < {threads} }}")
    context = ids.intersect(program.context.align_params(ids.get_space()))
    own = thread_of.intersect_range(isl.UnionSet.from_set(isl.Set.read_from_str(
        program.ctx, f"[{thread}] -> {{ [{thread}] }}"))).domain()
    thread_domain = block_domain.intersect(own).intersect_params(context)
    reduction = BlockReduction(threads, tuple(targets.items()), tuple(s.name for s in updates), schedule,
                               thread_domain, context, block_domain, thread_of)
    return reduction if prove_tree(reduction, program) is None else None


def _tree_schedule(program: PolyProgram, launch, update_domain: isl.UnionSet, member_map: isl.UnionMap, low: int,
                   threads: int, targets: list[str], steps: int):
    """(flat schedule, the block's instances, instance -> [thread]) of the reduction: the phases
    of the module's docstring.  The new statements carry their thread as their one dimension."""
    ctx = program.ctx
    flat = launch.schedule
    length = _out_dims(flat)
    dims = ", ".join(f"f{i}" for i in range(length))
    zeros = ", ".join(["0"] * length)

    def phase_of(name: str, phase: int, condition: str) -> tuple[isl.UnionMap, isl.UnionSet, isl.UnionMap]:
        time = f"[{phase}{', ' + zeros if length else ''}]"
        return (isl.UnionMap.from_map(isl.Map.read_from_str(ctx, f"{{ {name}[t] -> {time} }}")),
                isl.UnionSet.from_set(isl.Set.read_from_str(ctx, f"{{ {name}[t] : 0 <= t < {threads} and {condition} }}")),
                isl.UnionMap.from_map(isl.Map.read_from_str(ctx, f"{{ {name}[t] -> [t] }}")))

    to_phase = lambda phase: isl.UnionMap.from_map(isl.Map.read_from_str(  # noqa: E731
        ctx, f"{{ [{dims}] -> [{phase}{', ' + dims if dims else ''}] }}"))
    # the updates: value v of the dealt member goes to thread (v - low) mod threads
    schedule = flat.intersect_domain(update_domain).apply_range(to_phase(2))
    domain = update_domain
    thread_of = member_map.apply_range(isl.UnionMap.from_map(isl.Map.read_from_str(
        ctx, f"{{ [v] -> [t] : 0 <= t < {threads} and exists q : v = {low} + t + {threads} q }}")))
    inits = launch.domain.subtract(update_domain)  # the targets' initialisations: thread 0
    schedule = schedule.union(flat.intersect_domain(inits).apply_range(to_phase(0)))
    domain = domain.union(inits)
    thread_of = thread_of.union(isl.UnionMap.from_domain_and_range(
        inits, isl.UnionSet.from_set(isl.Set.read_from_str(ctx, "{ [0] }"))))
    pieces = []
    for tensor in targets:
        pieces += [(PARTIAL_INIT + tensor, 1, "true"), (PARTIAL_STORE + tensor, 3, "true"),
                   (FINAL + tensor, 5 + 2 * steps, "t = 0")]
        pieces += [(f"{TREE}{tensor}_{step}", 5 + 2 * step, f"t < {threads >> (step + 1)}") for step in range(steps)]
    pieces += [(f"{BARRIER}{phase}", phase, "true") for phase in [4] + [6 + 2 * step for step in range(steps)]]
    for name, phase, condition in pieces:
        times, instances, owner = phase_of(name, phase, condition)
        schedule, domain, thread_of = schedule.union(times), domain.union(instances), thread_of.union(owner)
    return schedule, domain.intersect_params(program.context), thread_of.intersect_domain(domain)


def tree_accesses(reduction: "BlockReduction", tensor: str) -> tuple[isl.UnionMap, isl.UnionMap]:
    """(writes, reads) of ``tensor``'s shared tree: block instance -> [element]."""
    ctx = reduction.context.get_ctx()
    writes = [f"{PARTIAL_STORE}{tensor}[t] -> [t]"]
    reads = [f"{FINAL}{tensor}[t] -> [0]"]
    for step in range(reduction.steps):
        name, stride = f"{TREE}{tensor}_{step}", reduction.tree_stride(step)
        writes.append(f"{name}[t] -> [t]")
        reads += [f"{name}[t] -> [t]", f"{name}[t] -> [t + {stride}]"]
    as_map = lambda pairs: isl.UnionMap.read_from_str(ctx, "{ " + "; ".join(pairs) + " }")  # noqa: E731
    return (as_map(writes).intersect_domain(reduction.block_domain),
            as_map(reads).intersect_domain(reduction.block_domain))


def prove_tree(reduction: "BlockReduction", program: PolyProgram) -> str | None:
    """None when the tree is race-free and reads only what was stored, else what fails."""
    barriers = [f"{BARRIER}{phase}" for phase in [4] + [6 + 2 * step for step in range(reduction.steps)]]
    for tensor, _ in reduction.targets:
        writes, reads = tree_accesses(reduction, tensor)
        race = find_races(reduction.schedule, reduction.block_domain, barriers, reduction.thread_of, writes, reads)
        if not race.is_empty():
            return f"tree of {tensor}: threads race without a barrier between {race.coalesce()}"
        if not reads.range().is_subset(writes.range()):
            return f"tree of {tensor}: a step reads an element no thread stored"
    return None


def _out_dims(flat: isl.UnionMap) -> int:
    maps: list[isl.Map] = []
    flat.foreach_map(maps.append)
    return maps[0].dim(isl.dim_type.out) if maps else 0


def _constant(bound: isl.PwAff) -> int:
    pieces: list[isl.Aff] = []
    bound.foreach_piece(lambda _set, aff: pieces.append(aff))
    return pieces[0].get_constant_val().to_python()
