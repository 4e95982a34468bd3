"""Compilation options: one validated, immutable record passed from the API to every stage."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from polyc.errors import PolycError
from polyc.target import named_device

FUSION_STRATEGIES = ("min", "smart", "max")
GPU_BACKENDS = ("opencl", "cuda")
BACKENDS = ("c", "interpreter", *GPU_BACKENDS)
#: Most threads in a block the ``block`` option may ask for (CUDA's limit; OpenCL devices report theirs).
MAX_BLOCK_THREADS = 1024


@dataclass(frozen=True)
class Options:
    """What ``polyc.define(source, **options)`` accepts.

    - ``backend``: ``"c"`` (compiled C/OpenMP), ``"interpreter"`` (the numpy reference),
      ``"opencl"`` (OpenCL C through pyopencl) or ``"cuda"`` (CUDA C through pycuda): see
      :mod:`polyc.schedule.gpu_mapping` and :mod:`polyc.codegen.gpu`.
    - ``block``: for the GPU back ends, threads per block along x, y, z (x first; one entry per
      mapped loop, at most three; None: 256 threads shaped by the number of mapped loops).
    - ``device``: for the GPU back ends, the device model the mapping's defaults come from:
      ``"sm_80"``, ``"sm_90"`` or ``"pocl"`` (None: the device this machine runs the back end
      on, else ``sm_80`` for CUDA and ``pocl`` for OpenCL).
    - ``grid``: for the GPU back ends, the most blocks along x, y, z (None: as many as the
      domain needs); with fewer, each thread runs several rounds (a grid-stride loop).
    - ``gpu_tiles``: for the GPU back ends (TC's tile sizes): per member of a launch's first band,
      what one block covers of a mapped member (its threads times the values each keeps in a
      register tile) and the shared-memory slice of the sequential one.  None: a model picks
      (4 x 4 register tiles where a reduction reuses its operands, slices of 32).
    - ``unroll`` on the GPU back ends: also unroll the sequential loop around a register tile
      when the unrolled body has at most this many statements (register tiles are always unrolled).
    - ``use_shared_memory``, ``max_shared_memory``: for the GPU back ends, copy tiles a block
      reuses into shared memory (default True), using at most that many bytes per launch
      (None: 48 KiB).
    - ``use_private_memory``: for the GPU back ends, keep the elements each thread alone writes
      (a matmul's accumulator) in registers from the start of a launch to its end (default True).
    - ``double_buffer``: for the GPU back ends, give each shared tile two buffers and copy the
      next slice while the block computes this one (one barrier per slice instead of two), where
      there are several slices and both buffers fit ``max_shared_memory`` (default True).
    - ``fusion``: ``"min"`` (no fusion), ``"smart"`` (fuse where outer parallelism is kept), ``"max"``.
    - ``loop_tiles``: on the generic loop-nest path, None (a model of the caches picks them),
      ``()`` (no tiling) or sizes for the outermost band, outermost first.
    - ``register_tiles``: on the generic loop-nest path, the register tile of a reduction's
      target, ``(rows, columns)``: that block of the target stays in registers while the
      reduction loops run (:mod:`polyc.schedule.register_tiling`).  None: sized from the
      build's vector registers; ``()``: no register tiles.
    - ``tile_sizes``: deprecated; the path a def compiles on reads it as its own option
      (``loop_tiles``, ``gemm_blocks``, the first entry as ``conv_block``, or ``gpu_tiles``), with
      a DeprecationWarning naming what it became.
    - ``parallel``, ``vectorize``: OpenMP parallel loops and SIMD pragmas on or off.
    - ``unroll``: unroll factor of the innermost loop (1: none).
    - ``specialize``: compile for the concrete sizes of each call (fast), or once for all sizes.
    - ``cc``, ``cflags``: the C compiler and its flags (None: ``$POLYC_CC``/``$CC`` and defaults).
    - ``blas_contractions``: compile a def that is one tensor contraction (matmul up to index
      permutation, plus elementwise epilogues) to a BLIS-style kernel (:mod:`polyc.codegen.gemm`)
      instead of the generic polyhedral path.
    - ``gemm_blocks``: the gemm kernel's cache blocks ``(MC, NC, KC)`` (rounded by the kernel to
      its register block); None: chosen from the caches.
    - ``micro_kernel``: the register block of a contraction kernel: None (chosen for each call's
      sizes by how many of its lanes and rows are real columns and rows), or n >= 1, the
      instruction set's n-th block, widest first, or its last where it has fewer (AVX-512,
      float: 6 x 64, 8 x 32, 8 x 16; AVX2: 6 x 16, 8 x 8; :func:`polyc.codegen.gemm.micro_kernel_shapes`).
    - ``loop_order``: None (the scheduler's order), or TC index names, outermost first: on the
      generic polyhedral path of the C back end, the loops of each nest's outermost band run in
      this order (its tile loops, when tiled; ``loop_tiles`` then follow this order).  Loops it
      does not name follow, in the scheduler's order.  A parallel loop still goes outermost, and
      the loop whose accesses are most often stride-1 innermost among the point loops.
    - ``direct_convolutions``: compile a def that is one convolution (any strides, dilations,
      groups, depthwise, 1-D to 3-D, plus elementwise epilogues) to the direct convolution
      kernel (:mod:`polyc.codegen.conv`) instead of the generic polyhedral path; and an
      integer depthwise convolution with its requantization (a depthwise QLinearConv) to the
      integer depthwise kernel (:mod:`polyc.codegen.integer_depthwise`).
    - ``conv_block``: the direct convolution kernel's output channels per work item (or output
      points, where it blocks points); None: chosen from the register blocks.
    - ``transpose_kernels``: compile a def that is one transposition (an input copied with its
      dimensions permuted so that the innermost one moves, e.g. NCHW -> NHWC) to the transpose
      kernel (:mod:`polyc.codegen.transpose`: tiles moved through vector registers) instead of
      the generic polyhedral path.
    - ``winograd``: compile a 3 x 3 stride-1 convolution in a channels-last layout whose
      channels are multiples of 16 (float32, known sizes) by Winograd's F(2x2, 3x3)
      (:mod:`polyc.codegen.winograd`) where it pays (fewer multiplications; measured in
      ``benchmarks/results/*_onnx*.json``): equal up to rounding on finite values, but an
      infinite input or weight may give NaN in outputs near it.  Off by default; ONNX sessions
      turn it on.
    - ``cache_sizes``: the data caches tile and block sizes are chosen for, ``(L1, L2, L3)`` in
      bytes (L1 and L2 per core); None reads this machine's.  Exports for another machine use
      that target's (:mod:`polyc.target`).
    - ``threads``: the most threads a parallel kernel uses (None: OpenMP's default, all cores).
    - ``schedule``: a schedule of your own for the C back end: isl text of a union map from
      statement instances to time vectors, named as ``kernel.check_schedule`` and
      ``kernel.explain`` name them (``"{ S0[m, n, r_k] -> [m, n, K - r_k]; S0_init[m, n] -> [m, n, 0] }"``),
      or an ``isl.Schedule``/``isl.UnionMap``.  Each compile checks it as ``check_schedule`` does
      (a reduction's updates may be reordered) at the call's sizes (every size when
      ``specialize=False``) and refuses one that breaks a dependence with a
      :class:`polyc.IllegalScheduleError` naming it and a witness pair; otherwise the C runs the
      instances in that order, a loop parallel (and vectorised) only where it carries no
      dependence.  The def then compiles on the ``user_schedule`` path: no gemm, convolution or
      other dedicated kernel, no fusion, tiling or loop reordering (:mod:`polyc.schedule.user`).
      None: polyc schedules.  The interpreter back end ignores it.
    - ``tuning``: compile each call's sizes with the fastest options :func:`polyc.tune` recorded
      for this def, these sizes and dtypes, this compiler and this machine, when there is such a
      record; only options left at their defaults take the recorded values.  False: never.
    """

    backend: str = "c"
    fusion: str = "smart"
    loop_tiles: tuple[int, ...] | None = None
    register_tiles: tuple[int, ...] | None = None
    tile_sizes: tuple[int, ...] | None = None
    parallel: bool = True
    vectorize: bool = True
    unroll: int = 1
    specialize: bool = True
    cc: str | None = None
    cflags: tuple[str, ...] | None = None
    blas_contractions: bool = True
    direct_convolutions: bool = True
    transpose_kernels: bool = True
    winograd: bool = False
    cache_sizes: tuple[int, int, int] | None = None
    threads: int | None = None
    micro_kernel: int | None = None
    loop_order: tuple[str, ...] | None = None
    tuning: bool = True
    block: tuple[int, ...] | None = None
    grid: tuple[int, ...] | None = None
    device: str | None = None
    use_shared_memory: bool = True
    use_private_memory: bool = True
    double_buffer: bool = True
    max_shared_memory: int | None = None
    gemm_blocks: tuple[int, int, int] | None = None
    conv_block: int | None = None
    gpu_tiles: tuple[int, ...] | None = None
    schedule: str | None = None

    @staticmethod
    def from_kwargs(**kwargs) -> Options:
        """Validate keyword options; an unknown name or a bad value is a PolycError."""
        known = {f.name for f in dataclasses.fields(Options)}
        for name in kwargs:
            if name not in known:
                raise PolycError(f"unknown option '{name}'; the options are: {', '.join(sorted(known))}")
        for name in ("tile_sizes", *(n for n, _ in BLOCK_OPTIONS.items() if n != "conv_block")):
            if isinstance(kwargs.get(name), list):
                kwargs[name] = tuple(kwargs[name])
        for name in ("block", "grid"):
            if isinstance(kwargs.get(name), (list, int)) and not isinstance(kwargs.get(name), bool):
                kwargs[name] = tuple(kwargs[name]) if isinstance(kwargs[name], list) else (kwargs[name],)
        if isinstance(kwargs.get("loop_order"), list):
            kwargs["loop_order"] = tuple(kwargs["loop_order"])
        if isinstance(kwargs.get("register_tiles"), list):
            kwargs["register_tiles"] = tuple(kwargs["register_tiles"])
        if "cache_sizes" in kwargs and isinstance(kwargs["cache_sizes"], list):
            kwargs["cache_sizes"] = tuple(kwargs["cache_sizes"])
        if "cflags" in kwargs and kwargs["cflags"] is not None:
            flags = kwargs["cflags"]
            kwargs["cflags"] = tuple(flags.split()) if isinstance(flags, str) else tuple(flags)
        schedule = kwargs.get("schedule")
        if schedule is not None and type(schedule).__module__.startswith("islpy"):
            # An isl.Schedule or union map: kept as text, so options stay hashable and the cache key names it.
            kwargs["schedule"] = str(schedule.get_map() if hasattr(schedule, "get_map") else schedule)
        options = Options(**kwargs)
        options.validate()
        return options

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise PolycError(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.fusion not in FUSION_STRATEGIES:
            raise PolycError(f"fusion must be one of {', '.join(FUSION_STRATEGIES)}, not {self.fusion!r}")
        for name in ("tile_sizes", "loop_tiles", "gpu_tiles"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, tuple) and all(_positive_int(t) for t in value)):
                raise PolycError(f"{name} must be positive integers, not {value!r}")
        if self.register_tiles is not None and not (
            isinstance(self.register_tiles, tuple)
            and len(self.register_tiles) in (0, 2)
            and all(map(_positive_int, self.register_tiles))
        ):
            raise PolycError(
                f"register_tiles must be two positive integers (rows, columns) or () for none, "
                f"not {self.register_tiles!r}"
            )
        if self.gpu_tiles == ():
            raise PolycError("gpu_tiles must name at least one size (None: the mapping's model picks them)")
        if self.gemm_blocks is not None and not (
            isinstance(self.gemm_blocks, tuple)
            and len(self.gemm_blocks) == 3
            and all(map(_positive_int, self.gemm_blocks))
        ):
            raise PolycError(f"gemm_blocks must be three positive integers (MC, NC, KC), not {self.gemm_blocks!r}")
        if self.conv_block is not None and not _positive_int(self.conv_block):
            raise PolycError(
                f"conv_block must be a positive integer (output channels per work item), not {self.conv_block!r}"
            )
        if self.backend in GPU_BACKENDS:
            for name, used_by in BLOCK_OPTIONS.items():
                if name != "gpu_tiles" and getattr(self, name) is not None:
                    raise PolycError(
                        f"{name} sets {used_by}, which the {self.backend!r} back end does not have; it takes gpu_tiles"
                    )
        if self.cache_sizes is not None and not (
            isinstance(self.cache_sizes, tuple)
            and len(self.cache_sizes) == 3
            and all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in self.cache_sizes)
        ):
            raise PolycError(f"cache_sizes must be three positive byte counts (L1, L2, L3), not {self.cache_sizes!r}")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise PolycError(f"threads must be None or an integer >= 1, not {self.threads!r}")
        if self.micro_kernel is not None and (
            isinstance(self.micro_kernel, bool) or not isinstance(self.micro_kernel, int) or self.micro_kernel < 1
        ):
            raise PolycError(
                f"micro_kernel must be None or an integer >= 1 (the instruction set's n-th "
                f"register block, widest first), not {self.micro_kernel!r}"
            )
        if self.loop_order is not None and not (
            isinstance(self.loop_order, tuple)
            and self.loop_order
            and all(isinstance(name, str) and name.isidentifier() for name in self.loop_order)
            and len(set(self.loop_order)) == len(self.loop_order)
        ):
            raise PolycError(
                f"loop_order must be None or distinct index names, outermost first, not {self.loop_order!r}"
            )
        if self.block is not None:
            if not (
                isinstance(self.block, tuple)
                and 1 <= len(self.block) <= 3
                and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in self.block)
            ):
                raise PolycError(
                    f"block must be one to three positive integers (threads along x, y, z), not {self.block!r}"
                )
            if math.prod(self.block) > MAX_BLOCK_THREADS:
                raise PolycError(
                    f"block {self.block} has {math.prod(self.block)} threads; at most {MAX_BLOCK_THREADS} are allowed"
                )
        if self.grid is not None and not (
            isinstance(self.grid, tuple)
            and 1 <= len(self.grid) <= 3
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in self.grid)
        ):
            raise PolycError(
                f"grid must be one to three positive integers (most blocks along x, y, z), not {self.grid!r}"
            )
        if self.schedule is not None and not isinstance(self.schedule, str):
            raise PolycError(f"schedule must be isl text or an isl.Schedule, not {self.schedule!r}")
        if self.schedule is not None and self.backend in GPU_BACKENDS:
            raise PolycError(
                f"schedule= gives the C back end's loop order; the {self.backend!r} back end maps loops to "
                "blocks and threads itself"
            )
        if self.device is not None:
            named_device(self.device if isinstance(self.device, str) else repr(self.device))
        if not isinstance(self.unroll, int) or self.unroll < 1:
            raise PolycError(f"unroll must be an integer >= 1, not {self.unroll!r}")
        if self.max_shared_memory is not None and (
            isinstance(self.max_shared_memory, bool)
            or not isinstance(self.max_shared_memory, int)
            or self.max_shared_memory < 0
        ):
            raise PolycError(
                f"max_shared_memory must be None or a number of bytes >= 0, not {self.max_shared_memory!r}"
            )
        for name in (
            "parallel",
            "vectorize",
            "specialize",
            "blas_contractions",
            "direct_convolutions",
            "transpose_kernels",
            "winograd",
            "tuning",
            "use_shared_memory",
            "use_private_memory",
            "double_buffer",
        ):
            if not isinstance(getattr(self, name), bool):
                raise PolycError(f"{name} must be True or False, not {getattr(self, name)!r}")

    def replace(self, **changes) -> Options:
        return Options.from_kwargs(**{**dataclasses.asdict(self), **changes})


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


#: The options that size one kind of kernel's blocks, and which kernels they size.  Each kernel
#: path lists the ones it reads (:attr:`polyc.paths.KernelPath.options`); a def that compiles on
#: a path that reads none of those given is refused.
BLOCK_OPTIONS = {
    "loop_tiles": "the generic loop nest's tiles",
    "gemm_blocks": "the gemm kernel's cache blocks",
    "conv_block": "the direct convolution kernel's work items",
    "gpu_tiles": "the GPU back ends' block tiles",
}


def options_reference(indent: str = "") -> str:
    """The description of every option, as :class:`Options`' docstring gives it (its list of
    ``- ``name``: ...`` items), each line prefixed with ``indent``."""
    lines = (Options.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("- ``"))
    items = [line[4:] if line.startswith("    ") else line.strip() for line in lines[start:]]
    return "\n".join(indent + line if line else "" for line in ["Options:", ""] + items).rstrip() + "\n"
