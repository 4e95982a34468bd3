"""Shared-memory promotion for GPU launches: tiles that a block's threads reuse are copied into
shared (OpenCL: local) memory once per slice of the sequential loop, and read from there.

The loop a launch's threads run sequentially first (the first unmapped member of its band: a
matmul's reduction loop) is cut into slices of ``slice_size`` iterations.  For every tensor the
launch only reads, with affine accesses, the elements a block touches in one slice (its
*footprint*, computed with isl over the block's instances) fit a box of constant size at an
offset affine in the block ids and the slice; when the block reads each element twice or more
on average, the box becomes a shared array.  The schedule of each thread becomes

    for each slice s:
        copy (phase 0):    the footprint of slice s, element j of the box (row-major) by
                           thread j mod T, in round j div T
        barrier (phase 1)
        compute (phase 2): the statement instances of slice s, in their old order, promoted
                           reads going to the shared arrays
        barrier (phase 3)

as new statements of the launch's flat schedule (``polyc_copy_<T>[s, e...]``,
``polyc_barrier<p>[s]``), so isl generates the loops and guards of all of them together.
Copies walk the box in row-major order with consecutive threads on consecutive elements, so
the global loads of a warp are consecutive.  Barriers are executed by every thread of the
block (their domains do not depend on the thread ids).

:func:`prove_promotion` checks, with isl, that no two different threads of a block touch one
shared element (one of them writing) without a barrier between the two accesses in schedule
order, and that every promoted read finds its element copied in its slice.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import islpy as isl
import numpy as np

from polyc.ir.bounds import tensor_box
from polyc.ir.model import PolyProgram
from polyc.schedule.isl_helpers import constant_bound, named, out_dims, project_params, sets, value_range

#: Iterations of the sequential loop per shared-memory slice.
SLICE_SIZE = 32
#: Shared memory a launch may use unless told otherwise: what every CUDA GPU since sm_20 and
#: OpenCL devices commonly give a block without opting in (48 KiB).
DEFAULT_MAX_SHARED_BYTES = 48 * 1024

COPY = "polyc_copy_"
#: The elements copies move, ``polyc_copied_<T>[s, e...]``: the proofs' view of the copies.
COPIED = "polyc_copied_"
BARRIER = "polyc_barrier"
#: The parameters that stand for a thread's block and thread ids (one per mapped dimension).
BLOCK_ID = "polyc_block"
THREAD_ID = "polyc_thread"
#: Phases of a slice, the second dimension of every time in the promoted schedule.
PHASE_COPY, PHASE_BARRIER_BEFORE, PHASE_COMPUTE, PHASE_BARRIER_AFTER = 0, 1, 2, 3
#: Elements of a vector load in shared-memory copies (float4: 16 bytes, one load instruction).
VECTOR_WIDTH = 4


@dataclass(frozen=True)
class SharedArray:
    """A tensor's box in shared memory: element ``e`` of slice ``s`` is at local index
    ``sum_d (e_d - offset_d(s)) * stride_d``.  Rows (the last dimension) are padded to an odd
    length: threads reading down a column then hit different banks of the 32 (a column of an
    unpadded 32-wide box would be one bank, 32 accesses in turn)."""

    tensor: str
    name: str
    sizes: tuple[int, ...]
    offsets: tuple[isl.Aff, ...]  # on the space [s] (parameters: sizes, block ids)
    dtype: object
    #: elements one copy instance moves with one vector load (a float4): 1, or VECTOR_WIDTH
    #: where the rows' groups of four are proved aligned and inside the tensor
    vector: int = 1
    #: copies of the box: 2 when double-buffered (slice s in buffer s mod 2, the next slice
    #: copied while this one is computed), else 1
    buffers: int = 1

    @property
    def row_length(self) -> int:
        last = self.sizes[-1]
        return last + 1 if len(self.sizes) > 1 and last % 2 == 0 else last

    @property
    def elements(self) -> int:
        """Elements of the array, padding included."""
        return math.prod(self.sizes[:-1]) * self.row_length

    @property
    def strides(self) -> tuple[int, ...]:
        padded = (*self.sizes[:-1], self.row_length)
        return tuple(math.prod(padded[d + 1 :]) for d in range(len(padded)))

    @property
    def allocated(self) -> int:
        """Elements of the shared array: every buffer, padding included."""
        return self.elements * self.buffers

    @property
    def copy_sizes(self) -> tuple[int, ...]:
        """The box in copy units: elements, groups of ``vector`` along the last dimension."""
        return (*self.sizes[:-1], -(-self.sizes[-1] // self.vector))

    @property
    def copy_strides(self) -> tuple[int, ...]:
        """Copy j moves unit ``(j // copy_strides[d]) % copy_sizes[d]`` of dimension d."""
        sizes = self.copy_sizes
        return tuple(math.prod(sizes[d + 1 :]) for d in range(len(sizes)))

    @property
    def copies(self) -> int:
        return math.prod(self.copy_sizes)


@dataclass(frozen=True)
class Promotion:
    """What promotion did to a launch."""

    member: int  # the band member cut into slices
    low: int  # its smallest value: slice = floor((value - low) / slice_size)
    slice_size: int
    slices: int  # how many slices the member's values make
    member_affs: dict  # statement -> isl.Aff of the member's value on its instance
    arrays: tuple[SharedArray, ...]
    schedule: isl.UnionMap  # the new flat schedule (compute, copy and barrier statements)
    thread_domain: isl.UnionSet  # what one thread runs of it
    block_domain: isl.UnionSet  # what the whole block runs (thread ids free)
    thread_of: isl.UnionMap  # block instance -> [linear thread id]
    slice_of: isl.UnionMap  # statement instance -> [its slice]

    def array(self, tensor: str) -> SharedArray | None:
        return next((a for a in self.arrays if a.tensor == tensor), None)

    @property
    def shared_bytes(self) -> int:
        return sum(a.allocated * a.dtype.itemsize for a in self.arrays)

    @property
    def double_buffered(self) -> bool:
        return any(a.buffers > 1 for a in self.arrays)


def promote(
    program: PolyProgram,
    launch,
    band: isl.ScheduleNode,
    max_shared_bytes: int = DEFAULT_MAX_SHARED_BYTES,
    slice_sizes: tuple[int, ...] | None = None,
    double_buffer: bool = True,
) -> Promotion | None:
    """The promotion of ``launch`` (whose first band is ``band``), or None when nothing pays;
    ``slice_sizes`` (per band member, TC's tile sizes) sets the slice, else SLICE_SIZE;
    ``double_buffer``: copy the next slice while computing this one where there are several
    slices and two copies of the tiles fit the budget."""
    mapped = {loop.member for loop in launch.loops}
    free = [m for m in range(band.band_n_member()) if m not in mapped]
    if not launch.loops or not free or max_shared_bytes <= 0:
        return None
    # the first loop each thread runs (of more than one iteration): slicing it keeps every
    # thread's order
    for member in free:
        member_map = isl.UnionMap.from_multi_union_pw_aff(
            isl.MultiUnionPwAff.from_union_pw_aff(band.band_get_partial_schedule().get_at(member))
        ).intersect_domain(launch.domain)
        low, high = value_range(member_map.range(), program.context)
        if high > low:
            break
    else:
        return None
    member_affs = _single_affs(member_map, program, launch.domain)
    if member_affs is None:
        return None
    thread_params = [f"polyc_thread{d}" for d in range(len(launch.loops))]
    block_domain = project_params(launch.thread_domain, thread_params)
    # the slice: the user's (TC's tile size of the member), else the largest of 32, 16, ... 1
    # at which every reused tile fits the budget (a block with a register tile covers more
    # elements, and so needs thinner slices); when none does, slices of 32 with what fits
    if slice_sizes and member < len(slice_sizes):
        candidates = [slice_sizes[member]]
    else:
        candidates = [SLICE_SIZE >> k for k in range(SLICE_SIZE.bit_length()) if SLICE_SIZE >> k <= high - low + 1]
    for slice_size in candidates:
        slice_of = member_map.apply_range(
            isl.UnionMap.from_map(
                isl.Map.read_from_str(
                    program.ctx, f"{{ [v] -> [s] : {slice_size} s <= v - {low} < {slice_size} s + {slice_size} }}"
                )
            )
        )
        reused = _reused_arrays(program, launch, block_domain, slice_of)
        if sum(a.elements * a.dtype.itemsize for a in reused) <= max_shared_bytes:
            break
    else:
        slice_size = candidates[0]
        slice_of = member_map.apply_range(
            isl.UnionMap.from_map(
                isl.Map.read_from_str(
                    program.ctx, f"{{ [v] -> [s] : {slice_size} s <= v - {low} < {slice_size} s + {slice_size} }}"
                )
            )
        )
        reused = _reused_arrays(program, launch, block_domain, slice_of)
    budget = max_shared_bytes
    arrays = [a for a in reused if (budget := budget - a.elements * a.dtype.itemsize) >= 0]
    if not arrays:
        return None
    slices = isl.Set.from_union_set(slice_of.intersect_domain(block_domain).range())
    count = -(-(high - low + 1) // slice_size)
    used = sum(a.elements * a.dtype.itemsize for a in arrays)
    buffers = 2 if double_buffer and count > 1 and 2 * used <= max_shared_bytes else 1
    arrays = [dataclasses.replace(a, vector=_vector_width(program, a, slices), buffers=buffers) for a in arrays]

    flat = launch.schedule
    length = out_dims(flat)
    width = max(length, 3) + 2
    pad = lambda n: ", ".join(["0"] * (width - 2 - n))  # noqa: E731
    flat_dims = ", ".join(f"f{i}" for i in range(length))
    to_time = isl.Map.read_from_str(
        program.ctx,
        f"{{ [[s] -> [{flat_dims}]] -> [s, {PHASE_COMPUTE}{', ' + flat_dims if length else ''}"
        f"{', ' + pad(length) if width - 2 > length else ''}] }}",
    )
    schedule = slice_of.range_product(flat).apply_range(isl.UnionMap.from_map(to_time))
    thread_domain = launch.thread_domain
    full_block = block_domain
    linear_thread = _linear_thread_aff(launch, program)
    thread_of = _compute_thread_map(launch, program, block_domain)
    threads = math.prod(launch.block)
    for position, array in enumerate(arrays):
        copies = _copy_set(program, slices, array).align_params(launch.context.get_space())
        owner, round_of = _copy_distribution(copies.get_space(), threads)
        # each array's copy has a loop of its own: [s, phase, which array, round, copy]; double
        # buffered, slice s is copied in the iteration before (s - 1: the first before the loop)
        schedule = schedule.union(
            isl.UnionMap.from_map(_copy_time(copies.get_space(), position, round_of, width, buffers - 1))
        )
        owned = copies.intersect(
            isl.Set.from_basic_set(owner.sub(_params_on(linear_thread, copies.get_space())).zero_basic_set())
        )
        thread_domain = thread_domain.union(isl.UnionSet.from_set(owned).intersect_params(launch.context))
        full_block = full_block.union(isl.UnionSet.from_set(copies))
        thread_of = thread_of.union(
            isl.UnionMap.from_map(isl.Map.from_aff(owner)).intersect_domain(isl.UnionSet.from_set(copies))
        )
    # one buffer: copy, barrier, compute, barrier in every slice.  Two: copy the next slice,
    # compute this one (the other buffer), barrier; and a copy and barrier before the first
    phases = (PHASE_BARRIER_BEFORE, PHASE_BARRIER_AFTER) if buffers == 1 else (PHASE_BARRIER_AFTER,)
    if buffers > 1:
        slices = slices.union(isl.Set.read_from_str(program.ctx, "{ [-1] }").align_params(slices.get_space()))
    for phase in phases:
        name = f"{BARRIER}{phase}"
        barriers = slices.set_tuple_name(name)
        schedule = schedule.union(
            isl.UnionMap.from_map(
                isl.Map.read_from_str(
                    program.ctx, f"{{ {name}[s] -> [s, {phase}{', ' + pad(0) if width > 2 else ''}] }}"
                )
            )
        )
        thread_domain = thread_domain.union(isl.UnionSet.from_set(barriers).intersect_params(launch.context))
        full_block = full_block.union(isl.UnionSet.from_set(barriers))
    return Promotion(
        member,
        low,
        slice_size,
        count,
        member_affs,
        tuple(arrays),
        schedule,
        thread_domain,
        full_block,
        thread_of,
        slice_of,
    )


def _reused_arrays(program: PolyProgram, launch, block_domain: isl.UnionSet, slice_of: isl.UnionMap) -> list:
    """The shared arrays of the tensors the launch only reads and reuses in a slice."""
    written = {program.statement(s).source.target for s in launch.statements}
    read = {a.tensor for s in launch.statements for a in program.statement(s).reads}
    arrays = []
    for tensor in sorted(read - written):
        if program.definition.tensor(tensor).rank == 0:  # a scalar: no tile to share
            continue
        array = _shared_array(program, launch, block_domain, slice_of, tensor)
        if array is not None:
            arrays.append(array)
    return arrays


def prove_promotion(promotion: Promotion, program: PolyProgram, launch) -> str | None:
    """None when the promoted launch is race-free, complete and in bounds, else what fails: a
    copy reading outside its tensor, two different threads of a block touching one shared
    element (one writing) with no barrier between the accesses in schedule order, or a promoted
    read whose element its slice does not copy."""
    barriers = [f"{BARRIER}{PHASE_BARRIER_BEFORE}", f"{BARRIER}{PHASE_BARRIER_AFTER}"]
    for array in promotion.arrays:
        copies = isl.Set.from_union_set(named(promotion.block_domain, COPY + array.tensor))
        read = copied_elements(array, copies).range().apply(_copied_to_tensor(array, program))
        inside = tensor_box(program, array.tensor)
        outside = read.subtract(inside.align_params(read.get_space()))
        if not outside.is_empty():
            return f"shared {array.name}: copies read outside {array.tensor}: {outside.coalesce()}"
        writes, reads = shared_accesses(promotion, program, launch, array)
        race = find_races(promotion.schedule, promotion.block_domain, barriers, promotion.thread_of, writes, reads)
        if not race.is_empty():
            return f"shared {array.name}: threads race without a barrier between {race.coalesce()}"
        copied = isl.UnionSet.from_set(copied_elements(array, copies).range())
        needed = _needed_copies(promotion, program, launch, array)
        if not needed.is_subset(copied):
            return f"shared {array.name}: a read finds its element not copied: {needed.subtract(copied)}"
    return None


def find_races(
    schedule: isl.UnionMap,
    block_domain: isl.UnionSet,
    barrier_names: list[str],
    thread_of: isl.UnionMap,
    writes: isl.UnionMap,
    reads: isl.UnionMap,
) -> isl.UnionMap:
    """The pairs of times at which two different threads of a block touch one element of a
    shared array (one of them writing: ``writes`` and ``reads`` map block instances to the
    array's elements) with no barrier (an instance named in ``barrier_names``, run by every
    thread) strictly between them in ``schedule``; ``thread_of`` maps block instances to
    their thread.  Empty: no race."""
    time = schedule.intersect_domain(block_domain)
    times = time.range()
    barrier_times = isl.UnionSet.empty(times.get_space())
    for name in barrier_names:
        barrier_times = barrier_times.union(time.intersect_domain(named(block_domain, name)).range())
    separated = times.lex_lt_union_set(barrier_times).apply_range(barrier_times.lex_lt_union_set(times))
    same_thread = thread_of.apply_range(thread_of.reverse())
    accesses = writes.union(reads)
    same_element = writes.apply_range(accesses.reverse()).union(accesses.apply_range(writes.reverse()))
    conflicting = same_element.subtract(same_thread)
    ordered = time.reverse().apply_range(conflicting).apply_range(time)  # their times, both ways round
    # equal times are simultaneous on two threads: a race whatever the barriers
    return ordered.intersect(times.lex_le_union_set(times)).subtract(separated)


# ----------------------------------------------------------------------------- pieces
def _shared_array(
    program: PolyProgram, launch, block_domain: isl.UnionSet, slice_of: isl.UnionMap, tensor: str
) -> SharedArray | None:
    """``tensor``'s box per slice when every read is affine and the box is reused enough: the
    first block reads each element of its first slice's box twice or more on average."""
    relation = _reads_of(program, launch, tensor)
    if relation is None:
        return None
    reads_per_slice = _first_block_reads(program, launch, block_domain, slice_of, relation)
    footprint = slice_of.intersect_domain(block_domain).reverse().apply_range(relation.intersect_domain(block_domain))
    if footprint.is_empty():
        return None
    box = _box(isl.Map.from_union_map(footprint))
    if box is None:
        return None
    offsets, sizes = box
    dtype = program.definition.tensor(tensor).dtype
    if math.prod(sizes) * 2 > reads_per_slice:  # each element read less than twice: no reuse to exploit
        return None
    return SharedArray(tensor, f"{tensor}_shared", tuple(sizes), tuple(offsets), dtype)


def _first_block_reads(
    program: PolyProgram, launch, block_domain: isl.UnionSet, slice_of: isl.UnionMap, relation: isl.UnionMap
) -> int:
    """How many reads ``relation`` makes in block 0 in slice 0 (counted with isl)."""
    first_slice = slice_of.intersect_range(isl.UnionSet.from_set(isl.Set.read_from_str(program.ctx, "{ [0] }")))
    ids = " and ".join(f"polyc_block{d} = 0" for d in range(len(launch.loops)))
    names = ", ".join(f"polyc_block{d}" for d in range(len(launch.loops)))
    first_block = isl.Set.read_from_str(program.ctx, f"[{names}] -> {{ : {ids} }}")
    pairs = relation.intersect_domain(block_domain.intersect(first_slice.domain())).intersect_params(first_block)
    total = 0
    for pair_set in sets(pairs.wrap()):
        total += pair_set.intersect_params(program.context.align_params(pair_set.get_space())).count_val().to_python()
    return total


def _reads_of(program: PolyProgram, launch, tensor: str) -> isl.UnionMap | None:
    """Instance -> element of every read of ``tensor`` in the launch (where its guard holds);
    None if one is data-dependent."""
    result = None
    for name in launch.statements:
        for access in program.statement(name).reads:
            if access.tensor != tensor:
                continue
            if not access.exact:
                return None
            relation = isl.UnionMap.from_map(access.relation.intersect_domain(access.guard))
            result = relation if result is None else result.union(relation)
    return result


def _copy_set(program: PolyProgram, slices: isl.Set, array: SharedArray) -> isl.Set:
    """``polyc_copy_T[s, j]``: copy j of slice s, for every unit of the box (element, or group
    of ``vector``) that lies in the tensor (a box at the tensor's edge reaches past it)."""
    space = isl.Set.read_from_str(program.ctx, f"{{ {COPY}{array.tensor}[s, j] : 0 <= j < {array.copies} }}")
    copies = space.align_params(slices.get_space()).intersect(
        slices.align_params(space.get_space()).insert_dims(isl.dim_type.set, 1, 1).set_tuple_name(COPY + array.tensor)
    )
    to_tensor = _copy_elements(array, copies.get_space()).apply_range(_copied_to_tensor(array, program))
    inside = to_tensor.intersect_range(tensor_box(program, array.tensor).align_params(to_tensor.get_space()))
    return copies.intersect(inside.domain())


def _copy_elements(array: SharedArray, space: isl.Space) -> isl.Map:
    """``polyc_copy_T[s, j] -> polyc_copied_T[s, e...]``: the element copy j moves (a group's
    first element): unit ``(j // copy_strides[d]) % copy_sizes[d]`` of each dimension."""
    ctx = space.get_ctx()
    ls = isl.LocalSpace.from_space(space)
    slice_var, j = (isl.Aff.var_on_domain(ls, isl.dim_type.set, d) for d in (0, 1))
    to_slice = isl.MultiAff.from_aff(slice_var)
    result = isl.Map.from_aff(slice_var)
    rank = len(array.sizes)
    for d, (size, stride) in enumerate(zip(array.copy_sizes, array.copy_strides)):
        unit = j.scale_down_val(isl.Val.int_from_si(ctx, stride)).floor().mod_val(isl.Val.int_from_si(ctx, size))
        if d == rank - 1:
            unit = unit.scale_val(isl.Val.int_from_si(ctx, array.vector))
        element = unit.add(_align(array.offsets[d], space).pullback_multi_aff(to_slice))
        result = result.flat_range_product(isl.Map.from_aff(element))
    return result.set_tuple_name(isl.dim_type.out, COPIED + array.tensor)


def _copied_to_tensor(array: SharedArray, program: PolyProgram) -> isl.Map:
    e = ", ".join(f"e{d}" for d in range(len(array.sizes)))
    return isl.Map.read_from_str(program.ctx, f"{{ {COPIED}{array.tensor}[s, {e}] -> {array.tensor}[{e}] }}")


def _group_map(array: SharedArray, space: isl.Space) -> isl.Map:
    """On ``polyc_copied_T[s, e...]``: a group's first element -> the group's elements."""
    outer = ", ".join(["s"] + [f"e{d}" for d in range(len(array.sizes) - 1)])
    name = COPIED + array.tensor
    result = isl.Map.read_from_str(
        space.get_ctx(), f"{{ {name}[{outer}, x] -> {name}[{outer}, y] : x <= y < x + {array.vector} }}"
    )
    return result.align_params(space)


def copied_elements(array: SharedArray, copies: isl.Set) -> isl.Map:
    """Copy instance -> every element it moves."""
    elements = _copy_elements(array, copies.get_space()).intersect_domain(copies)
    return elements.apply_range(_group_map(array, elements.get_space().range()))


def _vector_width(program: PolyProgram, array: SharedArray, slices: isl.Set) -> int:
    """VECTOR_WIDTH when ``array``'s copies can move its rows in float4 loads: float32 elements,
    boxes whose rows are a whole number of groups starting at a multiple of the width (proved
    for every slice of every block with isl), and a tensor whose rows are a whole number of
    groups too, so that a group holding an element of the tensor lies inside it (and its
    address is 16-byte aligned), else 1."""
    width = VECTOR_WIDTH
    if array.dtype != np.float32 or array.sizes[-1] % width:
        return 1
    box = tensor_box(program, array.tensor)
    if (constant_bound(box.dim_max(box.dim(isl.dim_type.set) - 1)) + 1) % width:
        return 1
    aligned = isl.Set.from_basic_set(
        array.offsets[-1].mod_val(isl.Val.int_from_si(program.ctx, width)).zero_basic_set()
    )
    slices = slices.align_params(aligned.get_space())
    aligned = aligned.align_params(slices.get_space())
    return width if slices.is_subset(aligned) else 1


def _local_index(array: SharedArray, space: isl.Space) -> isl.Aff:
    """On ``polyc_copied_T[s, e...]``: the element's local index in the box."""
    ls = isl.LocalSpace.from_space(space)
    total = isl.Aff.zero_on_domain(ls)
    rank = len(array.sizes)
    to_slice = isl.MultiAff.from_aff(isl.Aff.var_on_domain(ls, isl.dim_type.set, 0))
    for d in range(rank):
        element = isl.Aff.var_on_domain(ls, isl.dim_type.set, d + 1)
        offset = _align(array.offsets[d], space).pullback_multi_aff(to_slice)
        total = total.add(element.sub(offset).scale_val(isl.Val.int_from_si(space.get_ctx(), array.strides[d])))
    if array.buffers > 1:  # slice s in buffer s mod buffers
        buffer = isl.Aff.var_on_domain(ls, isl.dim_type.set, 0).mod_val(
            isl.Val.int_from_si(space.get_ctx(), array.buffers)
        )
        total = total.add(buffer.scale_val(isl.Val.int_from_si(space.get_ctx(), array.elements)))
    return total


def _copy_distribution(space: isl.Space, threads: int) -> tuple[isl.Aff, isl.Aff]:
    """On ``polyc_copy_T[s, j]``: the linear id of the thread that makes copy j, and the round
    in which it does: j mod T and j div T.  Consecutive copies move consecutive units of a row,
    so consecutive threads x load consecutive addresses (coalesced), and every thread works
    while there are copies.  (isl generates each thread's copies as one loop over rounds; the
    element of a copy is computed from j in the printed code.  Letting isl derive the elements
    from the thread id through a modulus lost elements in its AST generation.)"""
    ls = isl.LocalSpace.from_space(space)
    j = isl.Aff.var_on_domain(ls, isl.dim_type.set, 1)
    t = isl.Val.int_from_si(space.get_ctx(), threads)
    return j.mod_val(t), j.scale_down_val(t).floor()


def _copy_time(space: isl.Space, position: int, round_of: isl.Aff, width: int, ahead: int = 0) -> isl.Map:
    """``polyc_copy_T[s, j] -> [s - ahead, PHASE_COPY, position, round, j, 0...]``."""
    ls = isl.LocalSpace.from_space(space)
    constant = lambda value: isl.Aff.zero_on_domain(ls).add_constant_val(isl.Val.int_from_si(space.get_ctx(), value))  # noqa: E731
    elements = [isl.Aff.var_on_domain(ls, isl.dim_type.set, d) for d in range(1, space.dim(isl.dim_type.set))]
    iteration = isl.Aff.var_on_domain(ls, isl.dim_type.set, 0).add_constant_val(
        isl.Val.int_from_si(space.get_ctx(), -ahead)
    )
    time = [iteration, constant(PHASE_COPY), constant(position), round_of, *elements]
    time += [constant(0)] * (width - len(time))
    result = isl.Map.from_aff(time[0])
    for aff in time[1:]:
        result = result.flat_range_product(isl.Map.from_aff(aff))
    return result


def _align(aff: isl.Aff, space: isl.Space) -> isl.Aff:
    return aff.align_params(space)


def _params_on(aff: isl.Aff, space: isl.Space) -> isl.Aff:
    """A parametric (zero-dimensional) affine expression moved onto the set space ``space``."""
    ls = isl.LocalSpace.from_space(space)
    result = isl.Aff.zero_on_domain(ls)
    aligned = aff.align_params(space)
    for p in range(aligned.dim(isl.dim_type.param)):
        c = aligned.get_coefficient_val(isl.dim_type.param, p)
        if not c.is_zero():
            name = aligned.get_dim_name(isl.dim_type.param, p)
            position = space.find_dim_by_name(isl.dim_type.param, name)
            result = result.add(isl.Aff.var_on_domain(ls, isl.dim_type.param, position).scale_val(c))
    return result.add_constant_val(aligned.get_constant_val())


def _linear_thread_aff(launch, program: PolyProgram) -> isl.Aff:
    """thread.x + block.x * (thread.y + block.y * thread.z), over the parameters."""
    names = [f"polyc_thread{d}" for d in range(len(launch.loops))]
    terms, stride = [], 1
    for d, name in enumerate(names):
        terms.append(f"{stride} {name}" if stride != 1 else name)
        stride *= launch.loops[d].block
    params = ", ".join(names)
    return isl.Aff.read_from_str(program.ctx, f"[{params}] -> {{ [({' + '.join(terms)})] }}")


def _compute_thread_map(launch, program: PolyProgram, block_domain: isl.UnionSet) -> isl.UnionMap:
    """Statement instance of the block -> [linear thread id] (mapped member values relative to
    the block's start)."""
    result = None
    stride = 1
    for _d, loop in enumerate(launch.loops):  # a value's thread: its offset from the start, modulo the block
        part = loop.schedule.apply_range(
            isl.UnionMap.from_map(
                isl.Map.read_from_str(
                    program.ctx,
                    f"{{ [v] -> [w] : exists q, t : w = {stride} t and 0 <= t < {loop.block} and "
                    f"v = {loop.offset} + {loop.block} q + t }}",
                )
            )
        )
        result = part if result is None else _add_ranges(result, part, program)
        stride *= loop.block
    return result.intersect_domain(block_domain)


def _add_ranges(a: isl.UnionMap, b: isl.UnionMap, program: PolyProgram) -> isl.UnionMap:
    plus = isl.Map.read_from_str(program.ctx, "{ [[x] -> [y]] -> [x + y] }")
    return a.range_product(b).apply_range(isl.UnionMap.from_map(plus))


def shared_accesses(promotion: Promotion, program: PolyProgram, launch, array: SharedArray):
    """(writes, reads) of ``array``: block instance -> [local index]."""
    copies = isl.Set.from_union_set(named(promotion.block_domain, COPY + array.tensor))
    written = copied_elements(array, copies)
    local = isl.Map.from_aff(_local_index(array, written.get_space().range()))
    writes = isl.UnionMap.from_map(written.apply_range(local))
    reads = _needed_copies_map(promotion, program, launch, array)
    return writes, reads.apply_range(isl.UnionMap.from_map(local))


def _needed_copies_map(promotion: Promotion, program: PolyProgram, launch, array: SharedArray) -> isl.UnionMap:
    """Block instance reading ``array``'s tensor -> its element as copied, ``polyc_copied_T[s, e...]``."""
    relation = _reads_of(program, launch, array.tensor).intersect_domain(promotion.block_domain)  # exact: promoted
    pair = promotion.slice_of.range_product(relation)
    rank = len(array.sizes)
    e = ", ".join(f"e{d}" for d in range(rank))
    flatten = isl.Map.read_from_str(
        program.ctx, f"{{ [[s] -> {array.tensor}[{e}]] -> {COPIED}{array.tensor}[s, {e}] }}"
    )
    return pair.apply_range(isl.UnionMap.from_map(flatten))


def _needed_copies(promotion: Promotion, program: PolyProgram, launch, array: SharedArray) -> isl.UnionSet:
    return _needed_copies_map(promotion, program, launch, array).range()


def _single_affs(member_map: isl.UnionMap, program: PolyProgram, domain: isl.UnionSet) -> dict | None:
    """Statement -> the member's value as one affine expression of its instance."""
    affs = {}
    maps: list[isl.Map] = []
    member_map.foreach_map(maps.append)
    for m in maps:
        pma = m.as_pw_multi_aff() if hasattr(m, "as_pw_multi_aff") else isl.PwMultiAff.from_map(m)
        pieces: list[isl.Aff] = []
        pma.get_pw_aff(0).coalesce().foreach_piece(lambda _set, aff: pieces.append(aff))
        if len(pieces) != 1:
            return None
        affs[m.get_tuple_name(isl.dim_type.in_)] = pieces[0]
    return affs


# ----------------------------------------------------------------------------- registers
#: Most elements of one tensor a thread keeps in registers (private memory).
MAX_PRIVATE_ELEMENTS = 16

LOAD = "polyc_load_"
STORE = "polyc_store_"


@dataclass(frozen=True)
class PrivateArray:
    """A tensor's elements one thread writes, kept in a private array (registers) from the
    start of the launch to its end: element ``e`` at ``sum_d (e_d - offset_d) / step_d * stride_d``."""

    tensor: str
    name: str
    sizes: tuple[int, ...]
    offsets: tuple[isl.Aff, ...]  # parametric: sizes, block and thread ids
    dtype: object
    steps: tuple[int, ...] = ()  # per dimension: the distance between the thread's elements

    @property
    def elements(self) -> int:
        return math.prod(self.sizes)

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(math.prod(self.sizes[d + 1 :]) for d in range(len(self.sizes)))


@dataclass(frozen=True)
class PrivatePromotion:
    arrays: tuple[PrivateArray, ...]
    schedule: isl.UnionMap  # [0, load...], [1, the body's time...], [2, store...]
    thread_domain: isl.UnionSet

    def array(self, tensor: str) -> PrivateArray | None:
        return next((a for a in self.arrays if a.tensor == tensor), None)


def promote_private(
    program: PolyProgram,
    launch,
    schedule: isl.UnionMap,
    thread_domain: isl.UnionSet,
    max_elements: int = MAX_PRIVATE_ELEMENTS,
) -> PrivatePromotion | None:
    """Every tensor the launch writes whose elements touched by one thread fit a small box
    (a matmul's accumulator: one element) lives in a private array: loaded once before the
    body, stored once after it.  ``schedule`` and ``thread_domain`` are the body's (with or
    without shared memory).  The mapping's proof (no dependence between threads) makes the
    threads' boxes disjoint."""
    if not launch.loops:
        return None
    written = sorted({program.statement(s).source.target for s in launch.statements})
    statements = isl.UnionSet.empty(thread_domain.get_space())
    for name in launch.statements:
        statements = statements.union(named(thread_domain, name))
    arrays = []
    for tensor in written:
        accesses = _accesses_of(program, launch, tensor)
        if accesses is None or program.definition.tensor(tensor).rank == 0:
            continue
        footprint = isl.Set.from_union_set(accesses.intersect_domain(statements).range()).intersect_params(
            launch.context
        )
        if footprint.is_empty():
            continue
        box = _box(footprint)
        if box is None:
            continue
        offsets, sizes = box
        # a register tile's values are ``block`` apart: keep every step-th element only
        steps = tuple(_step(footprint, d) for d in range(len(sizes)))
        sizes = tuple((size - 1) // step + 1 for size, step in zip(sizes, steps))
        if math.prod(sizes) > max_elements:
            continue
        arrays.append(
            PrivateArray(tensor, f"{tensor}_private", sizes, offsets, program.definition.tensor(tensor).dtype, steps)
        )
    if not arrays:
        return None
    length = out_dims(schedule)
    width = max([length] + [len(a.sizes) for a in arrays]) + 1

    def shifted(stage: int, n: int, dims: str) -> str:
        zeros = ", ".join(["0"] * (width - 1 - n))
        return f"[{stage}{', ' + dims if dims else ''}{', ' + zeros if zeros else ''}]"

    dims = ", ".join(f"f{i}" for i in range(length))
    body = isl.Map.read_from_str(program.ctx, f"{{ [{dims}] -> {shifted(1, length, dims)} }}")
    result = schedule.apply_range(isl.UnionMap.from_map(body))
    domain = thread_domain
    for array in arrays:
        accesses = _accesses_of(program, launch, array.tensor)
        footprint = isl.Set.from_union_set(accesses.intersect_domain(statements).range())
        footprint = footprint.intersect(tensor_box(program, array.tensor)).intersect_params(launch.context)
        e = ", ".join(f"e{d}" for d in range(len(array.sizes)))
        loaded = footprint.intersect(_read_before_written(program, launch, array.tensor, schedule, statements))
        for stage, prefix, elements in ((0, LOAD, loaded), (2, STORE, footprint)):
            name = prefix + array.tensor
            domain = domain.union(isl.UnionSet.from_set(elements.set_tuple_name(name)))
            result = result.union(
                isl.UnionMap.from_map(
                    isl.Map.read_from_str(program.ctx, f"{{ {name}[{e}] -> {shifted(stage, len(array.sizes), e)} }}")
                )
            )
    return PrivatePromotion(tuple(arrays), result, domain)


def _read_before_written(
    program: PolyProgram, launch, tensor: str, schedule: isl.UnionMap, statements: isl.UnionSet
) -> isl.Set:
    """The elements of ``tensor`` whose first access in a thread's order is a read (within an
    instance, reads come before the write): only those need loading into the private array;
    an accumulator its init statement sets first does not."""
    reads = writes = None
    for name in launch.statements:
        statement = program.statement(name)
        if statement.source.target == tensor:
            write = isl.UnionMap.from_map(statement.write)
            writes = write if writes is None else writes.union(write)
        for access in statement.reads:
            if access.tensor == tensor:
                read = isl.UnionMap.from_map(access.relation)
                reads = read if reads is None else reads.union(read)
    if reads is None:
        return isl.Set.empty(tensor_box(program, tensor).get_space())
    timed = schedule.intersect_domain(statements)
    read_times = reads.reverse().apply_range(timed)  # element -> times it is read
    first = read_times.union(writes.reverse().apply_range(timed)).lexmin()
    return first.intersect(read_times).domain().extract_set(tensor_box(program, tensor).get_space())


def _accesses_of(program: PolyProgram, launch, tensor: str) -> isl.UnionMap | None:
    """Instance -> element of every access (reads and writes) of ``tensor`` in the launch;
    None if a read is data-dependent."""
    result = None
    for name in launch.statements:
        statement = program.statement(name)
        relations = [statement.write] if statement.source.target == tensor else []
        for access in statement.reads:
            if access.tensor == tensor:
                if not access.exact:
                    return None
                relations.append(access.relation)
        for relation in relations:
            union = isl.UnionMap.from_map(relation)
            result = union if result is None else result.union(union)
    return result


def _step(footprint: isl.Set, dim: int) -> int:
    """The distance isl proves between the values of dimension ``dim`` of ``footprint`` (1 when
    it finds none)."""
    stride = footprint.get_stride(dim)
    return stride.to_python() if stride.is_int() and stride.to_python() > 0 else 1


def _box(footprint: isl.Set | isl.Map) -> tuple[tuple[isl.Aff, ...], tuple[int, ...]] | None:
    """Offsets and constant sizes of a box holding ``footprint``: a set of elements (offsets
    affine in the parameters) or a map to elements (offsets affine in its inputs too, a
    slice say); None when a lower bound is not one affine expression or a size not constant."""
    kind = isl.dim_type.out if isinstance(footprint, isl.Map) else isl.dim_type.set
    offsets, sizes = [], []
    rank = footprint.dim(kind)
    for d in range(rank):
        along = footprint.project_out(kind, d + 1, rank - d - 1).project_out(kind, 0, d)
        low = along.lexmin_pw_multi_aff().get_pw_aff(0)
        high = along.lexmax_pw_multi_aff().get_pw_aff(0)
        pieces: list[isl.Aff] = []
        low.coalesce().foreach_piece(lambda _set, aff: pieces.append(aff))
        if len(pieces) != 1:
            return None
        size = high.sub(low).max_val()
        if not size.is_int():
            return None
        offsets.append(pieces[0])
        sizes.append(size.to_python() + 1)
    return tuple(offsets), tuple(sizes)
