"""The ``polyc`` command line: compile TC files to each stage's text, or run a def on random data.

    polyc --version
    polyc compile FILE.tc [--entry NAME] [--emit ast|ranges|isl|schedule|c] [-o OUT] [options]
    polyc compile FILE.tc [--entry NAME] --target host|avx512|avx2|generic|neon|neon-dotprod [--shape ...] -o OUTDIR
    polyc compile FILE.tc [--entry NAME] --target cuda|opencl --shape ... -o OUTDIR
    polyc run FILE.tc [--entry NAME] --shape NAME=SIZE ... [--check] [--repeat N] [--seed S] [options]
    polyc onnx MODEL.onnx [--shape INPUT=D0,D1,...] [--emit tc|groups|c] [--tune B] [--run [--check] [--bench] [--profile]] [options]
    polyc onnx export MODEL.onnx [--shape INPUT=D0,D1,...] [--target host|avx512|avx2|generic|neon|neon-dotprod] -o OUTDIR [--name NAME] [options]
    polyc tune FILE.tc [--entry NAME] --shape NAME=SIZE ... [--budget B] [--strategy model|random]
               [--records FILE] [--start-from FILE] [--scheduler ADDRESS] [options]
    polyc tune --list [--records FILE]   |   polyc tune --merge FILE ... [--records FILE]
    polyc cache info [--json]   |   polyc cache clear [--yes] [--tuning]   |   polyc cache prune --max-size SIZE

Exit status: 0 on success; 1 for an error in the TC file, in compilation or in a run, for a
missing file, and for a ``--check`` mismatch; 2 for a command-line usage error and for a stage
polyc does not offer yet.  User errors are one ``polyc: error: ...`` message on stderr (source
errors add the offending line and a caret), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import polyc
from polyc.codegen.gpu import DIALECTS as GPU_DIALECTS
from polyc.codegen.gpu import STATUS_ARGUMENT
from polyc.errors import PolycError
from polyc.interpreter import interpret
from polyc.lang import checked as ir
from polyc.lang.printer import format_def
from polyc.lang.symbolic import Affine
from polyc.options import BACKENDS, FUSION_STRATEGIES
from polyc.target import DEVICE_MODELS, TARGET_NAMES

#: ``--emit`` stage -> the Kernel method giving its text (None: the front end answers directly).
EMIT_METHODS = {"ast": None, "ranges": None, "isl": "isl_model_text", "schedule": "schedule_text", "c": "c_source"}
DEFAULT_EMIT = "ranges"  # becomes "c" once the compiled pipeline is in place
DEFAULT_REPEAT = 5

EXIT_ERROR = 1
EXIT_USAGE = 2


class CommandLineError(Exception):
    """A request that argparse cannot reject by itself (a missing ``--shape``, an unknown def);
    ``exit_code`` is 2 for usage errors and 1 for everything else."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["onnx", "export"]:  # (a model file named "export": polyc onnx ./export)
        argv = ["onnx-export", *argv[2:]]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # --help, --version and usage errors
        return _exit_status(exit_request.code)
    try:
        return args.handler(args)
    except PolycError as error:
        return _report(str(error), EXIT_ERROR)
    except CommandLineError as error:
        return _report(str(error), error.exit_code)
    except ModuleNotFoundError as error:
        return _report(_missing_module_message(error), EXIT_USAGE if _is_polyc_module(error) else EXIT_ERROR)
    except KeyboardInterrupt:
        return _report("interrupted", 130)


def _exit_status(code) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else EXIT_ERROR


def _report(message: str, status: int) -> int:
    print(f"polyc: error: {message}", file=sys.stderr)
    return status


def _is_polyc_module(error: ModuleNotFoundError) -> bool:
    return (error.name or "").split(".")[0] == "polyc"


def _missing_module_message(error: ModuleNotFoundError) -> str:
    if _is_polyc_module(error):
        return f"the compiled backend is not available yet (no module {error.name}); use --backend interpreter"
    return f"polyc needs the Python package '{error.name}', which is not installed (pip install {error.name})"


# ----------------------------------------------------------------------------- the parser
_COMPILE_EXAMPLES = """\
examples:
  polyc compile examples/matmul.tc                      ranges of every def
  polyc compile examples/matmul.tc --emit ast           the syntax tree, printed back as TC
  polyc compile examples/conv.tc --entry conv2d --emit isl -o conv2d.isl
  polyc compile examples/matmul.tc --entry matmul --emit c --shape M=512 --shape K=512 --shape N=512
  polyc compile examples/matmul.tc --entry matmul --target neon --shape M=64,K=64,N=64 -o out
                                                        out/matmul.c and out/matmul.h for aarch64

--emit stages: ast (parsed syntax, as TC text), ranges (checked def: shapes and index ranges;
the default), isl (polyhedral model), schedule (schedule tree), c (generated C).
"""

_RUN_EXAMPLES = """\
examples:
  polyc run examples/matmul.tc --entry matmul --shape M=256 --shape K=256 --shape N=256 --check
  polyc run examples/conv.tc --entry maxpool2x2 --shape N=1,C=3,H=32,W=32 --backend interpreter

Every size of the def needs a value (--shape NAME=SIZE, repeated or comma-separated); 0-d
integer inputs used as sizes take theirs from --shape too.  Other inputs are random: normal
floats, small integers (kept inside the tensor when they index one), random booleans.
--check compares with the reference interpreter within TC's tolerance,
|error| <= ops * eps * max(|inputs|, |expected outputs|), ops being the most terms any one
element reduces over.
"""

_TUNE_EXAMPLES = """\
examples:
  polyc tune examples/matmul.tc --entry matmul --shape M=1024,K=1024,N=1024 --budget 60s
  polyc tune examples/matmul.tc --entry matmul --shape M=1024,K=1024,N=1024 --budget 40 --strategy random
  polyc tune examples/conv.tc --entry conv2d --shape N=8,C=64,H=56,W=56,F=64,KH=3,KW=3 --scheduler tcp://head:8786
  polyc tune --list
  polyc tune --merge other-node.jsonl

Interrupt with Ctrl-C at any time: what was measured is kept, and a later run with the same
arguments continues from it.
"""


_CACHE_EXAMPLES = """\
examples:
  polyc cache info                     where the cache is, and its size per kind of entry
  polyc cache prune --max-size 500M    remove the least recently used entries down to 500 MiB
  polyc cache clear --yes              remove every kernel and record (tuning records kept)

Tuning records are never evicted or pruned; 'polyc cache clear --tuning' removes them too.
Nothing outside the cache directory, nor anything polyc did not make inside it, is removed.
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``polyc`` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="polyc",
        description="polyc: a polyhedral compiler for Tensor Comprehensions (TC) kernels.",
        epilog="Run 'polyc compile --help' or 'polyc run --help' for each command's options.",
    )
    parser.add_argument("--version", action="version", version=f"polyc {polyc.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    compile_parser = commands.add_parser(
        "compile",
        help="check a TC file and print a compilation stage",
        description="Parse and check a TC file, then print one stage of its compilation.",
        epilog=_COMPILE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compile_parser.add_argument("file", metavar="FILE.tc", help="TC source file")
    compile_parser.add_argument("--entry", metavar="NAME", help="the def to emit (default: every def)")
    compile_parser.add_argument(
        "--emit", choices=tuple(EMIT_METHODS), default=None, help=f"what to print (default: {DEFAULT_EMIT})"
    )
    compile_parser.add_argument("-o", "--output", metavar="OUT", help="write to OUT instead of stdout")
    compile_parser.add_argument(
        "--target",
        choices=(*TARGET_NAMES, *GPU_DIALECTS),
        help="export C for this machine: without --emit, write NAME.c and NAME.h "
        "into the directory -o OUTDIR; with --emit c, print the C.  cuda and "
        "opencl (every size given with --shape): NAME.cu or NAME.cl and "
        "NAME.launch.json (the kernels in launch order, grid and block sizes)",
    )
    _add_shape_argument(compile_parser, "a size to specialise for (--emit isl, schedule or c; default: for all sizes)")
    _add_option_arguments(compile_parser)
    compile_parser.set_defaults(handler=run_compile)

    run_parser = commands.add_parser(
        "run",
        help="run a def on random inputs: shapes, time, and a check",
        description="Run one def of a TC file on random inputs; print output shapes and the\n"
        "median time, and with --check compare with the reference interpreter.",
        epilog=_RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run_parser.add_argument("file", metavar="FILE.tc", help="TC source file")
    run_parser.add_argument("--entry", metavar="NAME", help="the def to run (may be left out if the file has one)")
    _add_shape_argument(run_parser, "the value of a size of the def (every size needs one)")
    run_parser.add_argument(
        "--check", action="store_true", help="compare the outputs with the reference interpreter; exit 1 on a mismatch"
    )
    run_parser.add_argument(
        "--repeat",
        type=_positive_int,
        default=DEFAULT_REPEAT,
        metavar="N",
        help=f"timed runs after a first, untimed one (default: {DEFAULT_REPEAT})",
    )
    run_parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the random inputs (default: 0)")
    _add_option_arguments(run_parser)
    run_parser.set_defaults(handler=run_run)

    onnx_parser = commands.add_parser(
        "onnx",
        help="compile an ONNX model: print it as TC, its kernels, or run and check it",
        description="Compile an ONNX model with polyc for given input shapes; print the model as TC\n"
        "(one def per fused kernel), the nodes of each kernel, or their C; or run it on\n"
        "random inputs, compare with onnxruntime (--check), time it (--bench) and each of\n"
        "its kernels inside the runs (--profile).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    onnx_parser.add_argument("model", metavar="MODEL.onnx", help="ONNX model file")
    onnx_parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="INPUT=D0,D1,...",
        help="an input's shape (symbolic dimensions default to 1)",
    )
    onnx_parser.add_argument("--emit", choices=("tc", "groups", "c"), help="what to print")
    onnx_parser.add_argument("--run", action="store_true", help="run on random inputs")
    onnx_parser.add_argument("--check", action="store_true", help="with --run: compare with onnxruntime")
    onnx_parser.add_argument("--bench", action="store_true", help="with --run: time polyc (and onnxruntime)")
    onnx_parser.add_argument(
        "--profile", action="store_true", help="with --run: each kernel's median time inside the runs, costliest first"
    )
    onnx_parser.add_argument(
        "--tune",
        type=_parse_budget,
        metavar="B",
        help="first tune every kernel for these shapes, sharing the budget B (seconds "
        "like 600s, or trials) by the kernels' times; later runs use the results",
    )
    onnx_parser.add_argument(
        "--no-graph-fusion", dest="graph_fusion", action="store_false", help="one kernel per operator"
    )
    _add_option_arguments(onnx_parser)
    onnx_parser.set_defaults(handler=run_onnx)

    export_parser = commands.add_parser(
        "onnx-export",
        help="write an ONNX model as a C project (polyc onnx export MODEL.onnx ...)",
        description="Plan an ONNX model for given input shapes and write it as a C project for a target:\n"
        "NAME.c (the API, one arena, the call sequence), NAME_kN.c (one kernel each), NAME.h,\n"
        "the weights NAME.bin, a main.c demo reading and writing .npy files, a Makefile and a\n"
        "CMakeLists.txt.  `make && ./NAME_demo INPUT.npy` needs a C compiler only.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export_parser.add_argument("model", metavar="MODEL.onnx", help="ONNX model file")
    export_parser.add_argument(
        "--shape", action="append", default=[], metavar="INPUT=D0,D1,...", help="an input's shape (every symbolic one)"
    )
    export_parser.add_argument(
        "--target", default="host", metavar="|".join(TARGET_NAMES), help="what to build for (default: host)"
    )
    export_parser.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="the directory to write")
    export_parser.add_argument("--name", default="model", help="the C prefix and file names (default: model)")
    export_parser.add_argument(
        "--no-graph-fusion", dest="graph_fusion", action="store_false", help="one kernel per operator"
    )
    _add_option_arguments(export_parser)
    export_parser.set_defaults(handler=run_onnx_export)

    tune_parser = commands.add_parser(
        "tune",
        help="search a def's options for given sizes on this machine; list or merge tuning records",
        description="Measure candidate options of one def for the given sizes on random inputs and record\n"
        "them; later compilations of that def at those sizes on this machine use the best.",
        epilog=_TUNE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tune_parser.add_argument("file", metavar="FILE.tc", nargs="?", help="TC source file")
    tune_parser.add_argument("--entry", metavar="NAME", help="the def to tune (may be left out if the file has one)")
    _add_shape_argument(tune_parser, "the value of a size of the def (every size needs one)")
    tune_parser.add_argument(
        "--budget",
        type=_parse_budget,
        default=60.0,
        metavar="B",
        help="seconds (60s, 2.5m, or a number with a dot) or trials (an integer); default 60s",
    )
    tune_parser.add_argument(
        "--strategy",
        choices=("model", "random"),
        default="model",
        help="cost-model-guided search (default) or random search",
    )
    tune_parser.add_argument(
        "--records",
        metavar="FILE",
        help="the tuning records file (default: $POLYC_TUNING_FILE, else in the kernel cache)",
    )
    tune_parser.add_argument(
        "--start-from", metavar="FILE", help="measure these records' options first (records from another machine, say)"
    )
    tune_parser.add_argument("--scheduler", metavar="ADDRESS", help="measure on the workers of this Dask scheduler")
    tune_parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of inputs and search (default 0)")
    tune_parser.add_argument("--list", action="store_true", help="list the best record of every key and exit")
    tune_parser.add_argument("--merge", nargs="+", metavar="FILE", help="add these files' records and exit")
    _add_option_arguments(tune_parser)
    tune_parser.set_defaults(handler=run_tune)

    cache_parser = commands.add_parser(
        "cache",
        help="see, clear or prune the kernel cache",
        description="The kernel cache ($POLYC_CACHE_DIR, else $XDG_CACHE_HOME/polyc, else ~/.cache/polyc):\n"
        "what it holds, clearing it, pruning it to a size (least recently used first).  Builds\n"
        "keep it under $POLYC_CACHE_MAX_SIZE (default 2G; 0 or none: no limit) the same way.",
        epilog=_CACHE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cache_commands = cache_parser.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    info_parser = cache_commands.add_parser("info", help="the cache directory, and the size and entries of each kind")
    info_parser.add_argument("--json", action="store_true", help="print it as JSON")
    info_parser.set_defaults(handler=run_cache_info)
    clear_parser = cache_commands.add_parser(
        "clear", help="remove everything polyc made in the cache, tuning records kept unless --tuning"
    )
    clear_parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    clear_parser.add_argument("--tuning", action="store_true", help="remove the tuning records too")
    clear_parser.set_defaults(handler=run_cache_clear)
    prune_parser = cache_commands.add_parser(
        "prune", help="remove the least recently used entries until the cache takes at most SIZE"
    )
    prune_parser.add_argument(
        "--max-size",
        required=True,
        type=_parse_size,
        metavar="SIZE",
        help="bytes, or a number with K, M, G or T (powers of 1024), such as 500M or 2G",
    )
    prune_parser.set_defaults(handler=run_cache_prune)
    return parser


def _add_shape_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument(
        "--shape",
        action="append",
        type=_parse_shape,
        default=[],
        metavar="NAME=SIZE",
        help=help_text + "; repeat it or separate pairs with commas",
    )


def _add_option_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that map to ``polyc.define()`` options; each is passed only when given."""
    group = parser.add_argument_group("compilation options (see polyc.options.Options)")
    group.add_argument("--backend", choices=BACKENDS, help="compiled C, or the numpy reference interpreter")
    group.add_argument("--fusion", choices=FUSION_STRATEGIES, help="loop fusion strategy")
    tiling = group.add_mutually_exclusive_group()
    tiling.add_argument(
        "--loop-tiles",
        type=_parse_tile_sizes,
        metavar="T0,T1,...",
        help="the generic loop nest's tile sizes of the outermost band, outermost first (default: from a cache model)",
    )
    tiling.add_argument("--no-tiling", dest="loop_tiles", action="store_const", const=(), help="do not tile loops")
    tiling.add_argument(
        "--tile-sizes", type=_parse_tile_sizes, metavar="T0,T1,...", help="deprecated: the path's own option instead"
    )
    group.add_argument(
        "--gemm-blocks", type=_parse_tile_sizes, metavar="MC,NC,KC", help="the gemm kernel's cache blocks"
    )
    group.add_argument(
        "--conv-block", type=_positive_int, metavar="N", help="a direct convolution's output channels per work item"
    )
    group.add_argument(
        "--no-parallel", dest="parallel", action="store_const", const=False, help="no OpenMP parallel loops"
    )
    group.add_argument("--no-vectorize", dest="vectorize", action="store_const", const=False, help="no SIMD pragmas")
    group.add_argument("--unroll", type=_positive_int, metavar="N", help="unroll factor of the innermost loop")
    group.add_argument("--threads", type=_positive_int, metavar="N", help="at most N threads (default: all cores)")
    group.add_argument(
        "--micro-kernel",
        type=_positive_int,
        metavar="N",
        help="a contraction kernel's register block: the instruction set's N-th, widest first "
        "(default: chosen for the sizes)",
    )
    group.add_argument(
        "--loop-order",
        type=_parse_names,
        metavar="I,J,...",
        help="index names, outermost first: the order of each nest's outermost loops (default: the scheduler's)",
    )
    group.add_argument(
        "--no-specialize",
        dest="specialize",
        action="store_const",
        const=False,
        help="compile once for all sizes instead of for each call's sizes",
    )
    group.add_argument("--cc", metavar="CC", help="C compiler (default: $POLYC_CC, $CC, then cc)")
    group.add_argument(
        "--cflags", metavar="FLAGS", help='C compiler flags, as one string: --cflags "-O3 -march=native"'
    )
    gpu = parser.add_argument_group("GPU mapping options (backend opencl or cuda, --target cuda or opencl)")
    gpu.add_argument("--block", type=_parse_tile_sizes, metavar="X[,Y[,Z]]", help="threads per block, x first")
    gpu.add_argument(
        "--gpu-tiles",
        type=_parse_tile_sizes,
        metavar="T0,T1,...",
        help="what one block covers of each member of a launch's first band (TC's tile sizes)",
    )
    gpu.add_argument(
        "--grid",
        type=_parse_tile_sizes,
        metavar="X[,Y[,Z]]",
        help="at most this many blocks along x, y, z (more work: grid-stride rounds)",
    )
    gpu.add_argument(
        "--device",
        choices=sorted(DEVICE_MODELS),
        help="the device model the defaults come from (default: this machine's device)",
    )
    gpu.add_argument(
        "--no-shared-memory", dest="use_shared_memory", action="store_const", const=False, help="no shared-memory tiles"
    )
    gpu.add_argument(
        "--no-private-memory",
        dest="use_private_memory",
        action="store_const",
        const=False,
        help="no register tiles or accumulators in registers",
    )
    gpu.add_argument(
        "--no-double-buffer",
        dest="double_buffer",
        action="store_const",
        const=False,
        help="one buffer per shared tile (copy, barrier, compute, barrier in every slice)",
    )


_OPTION_NAMES = (
    "backend",
    "fusion",
    "loop_tiles",
    "tile_sizes",
    "gemm_blocks",
    "conv_block",
    "gpu_tiles",
    "parallel",
    "vectorize",
    "unroll",
    "threads",
    "micro_kernel",
    "loop_order",
    "specialize",
    "cc",
    "cflags",
    "block",
    "grid",
    "device",
    "use_shared_memory",
    "use_private_memory",
    "double_buffer",
)


def _define_options(args: argparse.Namespace) -> dict:
    """The ``define()`` keyword options the user gave; the others keep their defaults."""
    return {name: getattr(args, name) for name in _OPTION_NAMES if getattr(args, name) is not None}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {value}")
    return value


def _parse_tile_sizes(text: str) -> tuple[int, ...]:
    return tuple(_positive_int(part.strip()) for part in text.split(","))


def _parse_names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(","))
    if not all(name.isidentifier() for name in names):
        raise argparse.ArgumentTypeError(f"expected index names separated by commas, not {text!r}")
    return names


def _parse_shape(text: str) -> dict[str, int]:
    """``M=64`` or ``M=64,N=32`` -> {name: size}."""
    pairs = {}
    for item in text.split(","):
        name, equals, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not equals or not name.isidentifier():
            raise argparse.ArgumentTypeError(f"expected NAME=SIZE, as in M=64, not {item!r}")
        try:
            size = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"the size of {name} must be an integer, not {value!r}") from None
        if size < 0:
            raise argparse.ArgumentTypeError(f"the size of {name} must not be negative, not {size}")
        pairs[name] = size
    return pairs


def _merge_shapes(shape_arguments: list[dict[str, int]]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for pairs in shape_arguments:
        for name, size in pairs.items():
            if sizes.get(name, size) != size:
                raise CommandLineError(f"--shape gives {name} twice, as {sizes[name]} and {size}")
            sizes[name] = size
    return sizes


# ----------------------------------------------------------------------------- loading
def _read_source(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except FileNotFoundError:
        raise CommandLineError(f"{path}: no such file", EXIT_ERROR) from None
    except UnicodeDecodeError as error:
        raise CommandLineError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})", EXIT_ERROR) from None
    except OSError as error:
        raise CommandLineError(f"{path}: cannot read: {error.strerror or error}", EXIT_ERROR) from None


def _load(path: str, options: dict) -> polyc.Module:
    return polyc.define(_read_source(path), filename=path, **options)


def _select(module: polyc.Module, path: str, entry: str | None) -> list[polyc.Kernel]:
    """The kernel named ``entry``, or every kernel of the module when ``entry`` is None."""
    if entry is None:
        return [module[name] for name in module.names]
    if entry not in module.names:
        raise CommandLineError(f"no def named '{entry}' in {path} (defs: {', '.join(module.names)})")
    return [module[entry]]


# ----------------------------------------------------------------------------- polyc compile
def run_compile(args: argparse.Namespace) -> int:
    """``polyc compile``: print (or write to ``-o``) one stage for the chosen defs."""
    options = _define_options(args)
    shapes = _merge_shapes(args.shape)
    exporting = args.target is not None and args.emit is None  # NAME.c and NAME.h into -o OUTDIR
    if args.target is not None and args.emit not in (None, "c"):
        raise CommandLineError(
            f"--target applies to C, not to --emit {args.emit}: use --emit c, or leave "
            "out --emit to write NAME.c and NAME.h into -o OUTDIR"
        )
    if exporting and args.output is None:
        raise CommandLineError(
            "--target without --emit writes files (NAME.c and NAME.h; NAME.cu or NAME.cl and NAME.launch.json): give their directory "
            "with -o OUTDIR (or print the C with --emit c)"
        )
    args.emit = "c" if args.target is not None else args.emit or DEFAULT_EMIT
    method = EMIT_METHODS[args.emit]
    if shapes and method is None:
        raise CommandLineError(f"--shape is not used with --emit {args.emit}, only with isl, schedule and c")
    if method is None:
        # The front end's answers need neither isl nor a C compiler: check the options, but
        # build the kernels on the interpreter.
        options = {**options, "backend": "interpreter"}
    elif getattr(polyc.Kernel, method, None) is None:
        raise CommandLineError(f"--emit {args.emit} is not available yet")

    module = _load(args.file, options)
    kernels = _select(module, args.file, args.entry)
    if shapes:
        known = {size for kernel in kernels for size in kernel.definition.sizes}
        unknown = sorted(set(shapes) - known)
        if unknown:
            raise CommandLineError(
                f"--shape names {', '.join(unknown)}, not a size of "
                f"{_describe_kernels(kernels)} (sizes: {', '.join(sorted(known)) or 'none'})"
            )

    if args.target in GPU_DIALECTS:
        texts = _gpu_exports(kernels, shapes, args.target, args.output if exporting else None)
        if exporting:
            return 0
    elif args.target is not None:
        exports = [kernel.exported_c(_kernel_sizes(kernel, shapes), args.target) for kernel in kernels]
        if exporting:
            for exported in exports:
                exported.write(args.output)
            return 0
        texts = [exported.c_source for exported in exports]
    else:
        texts = [_emit(kernel, args.emit, shapes) for kernel in kernels]
    text = "\n\n".join(t.rstrip("\n") for t in texts) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        _write(args.output, text)
    return 0


def _describe_kernels(kernels: list[polyc.Kernel]) -> str:
    return ", ".join(kernel.name for kernel in kernels)


def _emit(kernel: polyc.Kernel, emit: str, shapes: dict[str, int]) -> str:
    if emit == "ast":
        return format_def(kernel.syntax)
    if emit == "ranges":
        return kernel.describe()
    method = EMIT_METHODS[emit]
    assert method is not None, f"--emit {emit} prints no method's text"
    return getattr(kernel, method)(_kernel_sizes(kernel, shapes))


def _gpu_exports(kernels: list[polyc.Kernel], shapes: dict[str, int], dialect: str, directory: str | None) -> list[str]:
    """The GPU code of each kernel; with ``directory``, written there as NAME.cu / NAME.cl and
    NAME.launch.json."""
    texts = []
    for kernel in kernels:
        missing = [name for name in kernel.definition.sizes if name not in shapes]
        if missing:
            raise CommandLineError(
                f"--target {dialect} compiles for concrete sizes: give {', '.join(missing)} "
                f"with --shape (def {kernel.name})"
            )
        code = kernel.gpu_stages(_kernel_sizes(kernel, shapes) or {}, dialect).gpu_source
        texts.append(code.source)
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            suffix = ".cu" if dialect == "cuda" else ".cl"
            _write(str(Path(directory) / f"{kernel.name}{suffix}"), code.source)
            launches = {
                "dialect": dialect,
                "arguments": [*code.tensor_arguments, STATUS_ARGUMENT],
                "sizes": {name: shapes[name] for name in kernel.definition.sizes},
                "launches": [
                    {"kernel": launch.function_name, "grid": list(launch.grid), "block": list(launch.block)}
                    for launch in code.launches
                ],
            }
            _write(str(Path(directory) / f"{kernel.name}.launch.json"), json.dumps(launches, indent=2) + "\n")
    return texts


def _kernel_sizes(kernel: polyc.Kernel, shapes: dict[str, int]) -> dict[str, int] | None:
    """The compiled stages are specialised to the sizes given for this def (None: for all sizes)."""
    sizes = {name: shapes[name] for name in kernel.definition.sizes if name in shapes}
    return sizes or None


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as error:
        raise CommandLineError(f"{path}: cannot write: {error.strerror or error}", EXIT_ERROR) from None


# ----------------------------------------------------------------------------- polyc run
def run_run(args: argparse.Namespace) -> int:
    """``polyc run``: random inputs, timed runs, output shapes and an optional check."""
    module = _load(args.file, _define_options(args))
    kernel = _single_kernel(module, args.file, args.entry)
    definition = kernel.definition
    sizes = _sizes_for(definition, _merge_shapes(args.shape))
    inputs = random_inputs(definition, sizes, np.random.default_rng(args.seed))

    start = time.perf_counter()
    outputs = _as_tuple(kernel(*inputs))
    first_call = time.perf_counter() - start
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        outputs = _as_tuple(kernel(*inputs))
        times.append(time.perf_counter() - start)

    print(f"{definition.name}: " + (", ".join(f"{name}={sizes[name]}" for name in definition.sizes) or "no sizes"))
    for name, output in zip(definition.outputs, outputs):
        print(f"output {name}: {output.dtype.name}{tuple(output.shape)}")
    print(
        f"time: median {_format_seconds(statistics.median(times))} over {args.repeat} run(s) "
        f"(first call {_format_seconds(first_call)})"
    )

    if not args.check:
        return 0
    expected = interpret(definition, inputs)
    report = compare_outputs(definition, sizes, inputs, outputs, expected)
    print(report.text)
    return 0 if report.ok else EXIT_ERROR


def run_tune(args: argparse.Namespace) -> int:
    """``polyc tune``: search one def's options, or list or merge the tuning records."""
    from polyc.runtime.tuning_records import default_records_path, merge_records, read_records

    records = args.records or default_records_path()
    if args.merge:
        added = merge_records(args.merge, records)
        print(f"{added} record(s) added to {records}")
        return 0
    if args.list:
        return _list_records(read_records(records), records)
    if args.file is None:
        raise CommandLineError("polyc tune needs FILE.tc (or --list, or --merge FILE ...)")
    module = _load(args.file, _define_options(args))
    kernel = _single_kernel(module, args.file, args.entry)
    sizes = _sizes_for(kernel.definition, _merge_shapes(args.shape))
    inputs = random_inputs(kernel.definition, sizes, np.random.default_rng(args.seed))
    client = None
    if args.scheduler:
        try:
            from dask.distributed import Client
        except ImportError as error:
            raise PolycError("--scheduler needs dask.distributed: pip install 'polyc[tune]'") from error
        client = Client(args.scheduler)
    try:
        result = polyc.tune(
            kernel,
            *inputs,
            **_budget_arguments(args.budget),
            strategy=args.strategy,
            records=records,
            start_from=args.start_from,
            client=client,
            seed=args.seed,
            progress=sys.stderr.isatty(),
        )
    finally:
        if client is not None:
            client.close()
    print(
        f"{kernel.name}: "
        + ", ".join(f"{n}={sizes[n]}" for n in kernel.definition.sizes)
        + f" ({result.space.path} path); {result.trials} trial(s) measured, {result.measured} in all"
        + (" (interrupted)" if result.interrupted else "")
    )
    if result.best_seconds is None:
        print("no candidate ran correctly")
        return EXIT_ERROR
    default = _format_seconds(result.default_seconds) if result.default_seconds else "not measured"
    print(f"default options: {default}")
    print(
        f"best: {_format_seconds(result.best_seconds)} with {result.best_options or 'the default options'}"
        + (f" ({result.speedup:.2f}x)" if result.speedup else "")
    )
    print(f"records: {result.records_path}")
    return 0


def _list_records(records, path) -> int:
    from polyc.runtime.machine import this_machine
    from polyc.runtime.tuning_records import chosen_records

    best = chosen_records(records)
    print(f"{len(records)} record(s) in {path}; the chosen of {len(best)} key(s):")
    here = this_machine().id
    for key, record in best.items():
        name = record.tc.split("(", 1)[0].replace("def ", "").strip() or key.definition
        sizes = ",".join(f"{n}={v}" for n, v in key.sizes)
        where = (
            "this machine"
            if key.machine == here
            else f"machine {key.machine}{_machine_described(record.machine)} (not used here)"
        )
        print(
            f"  {name} {sizes} {'/'.join(key.dtypes)}: {_format_seconds(record.timed_seconds)} "
            f"with {record.options or 'the defaults'} [{where}]"
        )
    return 0


def _machine_described(fingerprint) -> str:
    """``: <what the machine was>`` from a record's fingerprint (a JSON dict), or "" where the
    record has none that reads (hand-written or damaged records still list)."""
    from polyc.runtime.machine import MachineFingerprint

    try:
        return f": {MachineFingerprint.from_json(fingerprint).describe()}"
    except (KeyError, TypeError, ValueError, AttributeError):
        return ""


def _budget_arguments(budget: float | int) -> dict:
    """``polyc.tune``'s arguments for a ``--budget``: seconds (a float) or trials (an int)."""
    return {"trials": budget} if isinstance(budget, int) else {"seconds": budget}


def _parse_budget(text: str) -> float | int:
    """``60s``, ``2.5m`` and ``60.0`` are seconds; ``40`` is a number of trials."""
    try:
        if text.endswith("s"):
            value: float | int = float(text[:-1])
        elif text.endswith("m"):
            value = float(text[:-1]) * 60
        elif "." in text:
            value = float(text)
        else:
            value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a budget: {text!r} (seconds like 60s or 2.5m, or trials like 40)"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the budget must be positive, not {text!r}")
    return value


def _onnx_shapes(texts: list[str]) -> dict[str, tuple[int, ...]]:
    """``--shape INPUT=D0,D1,...`` options as input name -> shape."""
    given = {}
    for text in texts:
        name, _, dims = text.partition("=")
        try:
            given[name] = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise CommandLineError(f"--shape {text!r}: expected INPUT=D0,D1,... with integer extents") from None
    return given


def run_onnx_export(args: argparse.Namespace) -> int:
    """``polyc onnx export``: write a model as a C project (InferenceSession.export)."""
    import polyc.onnx as ponnx

    options = {k: v for k, v in _define_options(args).items() if k != "backend"}
    session = ponnx.InferenceSession(args.model, graph_fusion=args.graph_fusion, **options)
    given = _onnx_shapes(args.shape)
    shapes = {
        i.name: given.get(i.name, tuple(d if isinstance(d, int) else -1 for d in (i.shape or ())))
        for i in session.get_inputs()
    }
    for name in given:
        if name not in shapes:
            raise CommandLineError(f"--shape names no input of the model: {name}")
    symbolic = [n for n, s in shapes.items() if any(d < 0 for d in s)]
    if symbolic:
        raise CommandLineError(f"give --shape for the inputs with symbolic dimensions: {', '.join(symbolic)}")
    exported = session.export(args.output, target=args.target, shapes=shapes, name=args.name)
    print(
        f"wrote {args.output}: {exported.prefix}.c, {len(exported.kernels)} kernel file(s), {exported.prefix}.h, "
        f"{exported.prefix}.bin ({len(exported.weights)} bytes of weights), main.c, Makefile, CMakeLists.txt; "
        f"arena {exported.arena_bytes} bytes; target {exported.target.name}"
    )
    print(f"build and run: cd {args.output} && make && ./{exported.prefix}_demo INPUT.npy ...")
    return 0


def _parse_size(text: str) -> int:
    """``--max-size``: bytes (``0`` empties the cache of what the limit counts)."""
    from polyc.runtime.cache_space import parse_size

    try:
        return parse_size(text) or 0
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run_cache_info(args: argparse.Namespace) -> int:
    """``polyc cache info``: the cache directory, its limit, and entries and bytes per kind."""
    from polyc.runtime import cache_space
    from polyc.runtime.cache import configured_cache_dir

    root = configured_cache_dir()
    items = cache_space.inventory(root)
    kinds = cache_space.usage(items)
    limit = cache_space.size_limit()
    counted = cache_space.evictable_size(items)
    if args.json:
        report = {
            "directory": str(root),
            "exists": root.is_dir(),
            "limit": limit,
            "counted": counted,
            "total": sum(size for _, size in kinds.values()),
            "kinds": {kind: {"entries": count, "bytes": size} for kind, (count, size) in kinds.items()},
        }
        print(json.dumps(report, indent=2))
        return 0
    print(f"kernel cache: {root}{'' if root.is_dir() else ' (does not exist yet)'}")
    width = max(len(kind) for kind in kinds)
    for kind, (count, size) in kinds.items():
        print(f"  {kind:<{width}}  {count:>7}  {cache_space.format_size(size):>10}")
    limit_text = f"of a limit of {cache_space.format_size(limit)}" if limit is not None else "(no limit)"
    print(
        f"  {'total':<{width}}  {'':>7}  {cache_space.format_size(sum(s for _, s in kinds.values())):>10}"
        f"  ({cache_space.format_size(counted)} counted {limit_text}, {cache_space.SIZE_VARIABLE})"
    )
    return 0


def run_cache_clear(args: argparse.Namespace) -> int:
    """``polyc cache clear``: remove what polyc made in the cache (asking first unless --yes)."""
    from polyc.runtime import cache_space
    from polyc.runtime.cache import configured_cache_dir

    root = configured_cache_dir()
    items = [item for item in cache_space.inventory(root) if args.tuning or item.kind != "tuning records"]
    if not items:
        print(f"nothing to clear in {root}")
        return 0
    size = cache_space.format_size(sum(item.size for item in items))
    what = "every kernel and record" + (", the tuning records included" if args.tuning else " (tuning records kept)")
    if not args.yes:
        try:
            answer = input(f"remove {what} from {root}, {size}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            return _report("nothing removed (answer y, or pass --yes)", EXIT_ERROR)
    removed = cache_space.clear(root, tuning=args.tuning)
    busy = f"; {removed.busy} being built by another process were kept" if removed.busy else ""
    print(f"removed {removed.count} entries ({cache_space.format_size(removed.size)}) from {root}{busy}")
    return 0


def run_cache_prune(args: argparse.Namespace) -> int:
    """``polyc cache prune --max-size SIZE``: the least recently used entries go first."""
    from polyc.runtime import cache_space
    from polyc.runtime.cache import configured_cache_dir

    root = configured_cache_dir()
    removed = cache_space.evict(root, args.max_size)
    left = cache_space.evictable_size(cache_space.inventory(root))
    busy = f"; {removed.busy} being built by another process were kept" if removed.busy else ""
    print(
        f"removed {removed.count} least recently used entries ({cache_space.format_size(removed.size)}) from "
        f"{root}; {cache_space.format_size(left)} left{busy}"
    )
    return 0


def run_onnx(args: argparse.Namespace) -> int:
    """``polyc onnx``: compile a model for given shapes; print, run, check or time it."""
    import polyc.onnx as ponnx

    options = {k: v for k, v in _define_options(args).items() if k != "backend"}
    session = ponnx.InferenceSession(args.model, graph_fusion=args.graph_fusion, **options)
    given = {}
    for text in args.shape:
        name, _, dims = text.partition("=")
        try:
            given[name] = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise CommandLineError(f"--shape {text!r}: expected INPUT=D0,D1,... with integer extents") from None
    unknown = set(given) - {i.name for i in session.get_inputs()}
    if unknown:
        raise CommandLineError(f"--shape names no input of the model: {', '.join(sorted(unknown))}")
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in session.get_inputs():
        shape = given.get(arg.name) or tuple(d if isinstance(d, int) else 1 for d in (arg.shape or ()))
        dtype = np.dtype({"tensor(float)": np.float32, "tensor(double)": np.float64}.get(arg.type, np.int64))
        feeds[arg.name] = rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
    start = time.perf_counter()
    outputs = session.run(None, feeds)
    first_call = time.perf_counter() - start
    if args.tune is not None:
        tuning = polyc.tune(session, feeds, **_budget_arguments(args.tune))
        for tuned_kernel in tuning.kernels:
            found = tuned_kernel.result
            what = (
                "not tuned (too small a share)"
                if found is None
                else f"best {_format_seconds(found.best_seconds)} with {found.best_options or 'the defaults'} "
                f"after {found.trials} trial(s)"
                if found.best_seconds
                else "no candidate ran correctly"
            )
            print(f"{', '.join(tuned_kernel.groups)}: {_format_seconds(tuned_kernel.seconds)} per run; {what}")
        print(
            f"kernels' time per run: {_format_seconds(tuning.default_seconds)} with the defaults, "
            f"{_format_seconds(tuning.tuned_seconds)} tuned (as the searches measured them)"
        )
    if args.emit == "tc":
        print(session.tc_source(), end="")
    elif args.emit == "groups":
        for number, nodes in enumerate(session.groups):
            print(f"group{number}: {', '.join(nodes)}")
    elif args.emit == "c":
        for kernel in session.kernels():
            print(kernel.c_source({}))
    if not args.run and args.emit is not None:
        return 0
    for arg, output in zip(session.get_outputs(), outputs):
        print(f"output {arg.name}: {output.dtype.name}{tuple(output.shape)}")
    print(
        f"first run (planning and compiling included): {_format_seconds(first_call)}; {len(session.groups)} kernel(s)"
    )
    if args.bench:
        times = []
        for _ in range(DEFAULT_REPEAT * 2):
            start = time.perf_counter()
            session.run(None, feeds)
            times.append(time.perf_counter() - start)
        print(f"polyc: median {_format_seconds(statistics.median(times))} over {len(times)} runs")
    if args.profile:
        kernels = session.profile(feeds, repeat=DEFAULT_REPEAT)
        total = sum(k.seconds for k in kernels)
        print(f"kernels inside the runs (median of {DEFAULT_REPEAT}): {_format_seconds(total)} in all")
        for kernel in sorted(kernels, key=lambda k: -k.seconds):
            print(
                f"  {kernel.name:>8} {_format_seconds(kernel.seconds):>10} {100 * kernel.seconds / (total or 1):5.1f}%  "
                f"{', '.join(kernel.nodes)}"
            )
    if args.check or args.bench:
        try:
            import onnxruntime
        except ImportError:
            print("onnxruntime is not installed: no comparison")
            return 0
        reference = onnxruntime.InferenceSession(args.model, providers=["CPUExecutionProvider"])
        expected = reference.run(None, feeds)
        if args.bench:
            times = []
            for _ in range(DEFAULT_REPEAT * 2):
                start = time.perf_counter()
                reference.run(None, feeds)
                times.append(time.perf_counter() - start)
            print(f"onnxruntime: median {_format_seconds(statistics.median(times))}")
        if args.check:
            worst = max(
                float(np.max(np.abs(g.astype(np.float64) - e) / (np.abs(e) + 1e-6), initial=0.0))
                if g.dtype.kind == "f"
                else float(np.any(g != e))
                for g, e in zip(outputs, expected)
            )
            ok = all(
                g.shape == e.shape
                and (np.allclose(g, e, rtol=1e-3, atol=1e-5) if g.dtype.kind == "f" else np.array_equal(g, e))
                for g, e in zip(outputs, expected)
            )
            print(
                f"outputs {'match onnxruntime' if ok else 'DIFFER from onnxruntime'} (rtol 1e-3, atol 1e-5; "
                f"worst relative difference {worst:.2g})"
            )
            return 0 if ok else EXIT_ERROR
    return 0


def _single_kernel(module: polyc.Module, path: str, entry: str | None) -> polyc.Kernel:
    if entry is None and len(module.names) > 1:
        raise CommandLineError(f"{path} has several defs ({', '.join(module.names)}); choose one with --entry")
    return _select(module, path, entry)[0]


def _as_tuple(result) -> tuple[np.ndarray, ...]:
    return result if isinstance(result, tuple) else (result,)


def _format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def _sizes_for(definition: ir.CheckedDef, shapes: dict[str, int]) -> dict[str, int]:
    """Every size of ``definition`` from ``--shape``; a missing or unknown name is an error."""
    missing = [name for name in definition.sizes if name not in shapes]
    if missing:
        example = " ".join(f"--shape {name}=..." for name in missing)
        raise CommandLineError(f"{definition.name} needs a value for {', '.join(missing)} ({example})")
    unknown = sorted(set(shapes) - set(definition.sizes))
    if unknown:
        raise CommandLineError(
            f"--shape names {', '.join(unknown)}, not a size of {definition.name} "
            f"(sizes: {', '.join(definition.sizes) or 'none'})"
        )
    return {name: shapes[name] for name in definition.sizes}


# ----------------------------------------------------------------------------- random inputs
def random_inputs(definition: ir.CheckedDef, sizes: dict[str, int], rng: np.random.Generator) -> list[np.ndarray]:
    """One random array per input, with the def's dtypes and the shapes ``sizes`` give.

    0-d integer inputs that bind a size get that size; integer inputs read inside a subscript
    (gathers such as ``LUT(I(b), d)``) stay inside the extent they index.
    """
    size_inputs = {b.tensor: b.size for b in definition.size_bindings if b.dim is None}
    index_limits = _gather_limits(definition, sizes)
    inputs = []
    for name in definition.inputs:
        tensor = definition.tensor(name)
        if name in size_inputs:
            inputs.append(np.asarray(sizes[size_inputs[name]], dtype=tensor.dtype))
        else:
            shape = tensor.concrete_shape(sizes)
            inputs.append(_random_array(tensor.dtype, shape, rng, index_limits.get(name)))
    return inputs


def _gather_limits(definition: ir.CheckedDef, sizes: dict[str, int]) -> dict[str, int]:
    """Input name -> the smallest extent it is used to index, for integer inputs read in subscripts."""
    limits: dict[str, int] = {}
    for statement in definition.statements:
        for read in ir.reads(statement.rhs):
            for dim, subscript in enumerate(read.subscripts):
                if isinstance(subscript, Affine):
                    continue
                extent = definition.tensor(read.tensor).concrete_shape(sizes)[dim]
                for inner in ir.reads(subscript):
                    if inner.tensor in definition.inputs:
                        limits[inner.tensor] = min(extent, limits.get(inner.tensor, extent))
    return limits


def _random_array(
    dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator, index_limit: int | None
) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if index_limit is not None:
        low, high = 0, max(index_limit, 1)
    else:
        low, high = (0, 9) if dtype.kind == "u" else (-8, 9)
    return rng.integers(low, high, size=shape).astype(dtype)


# ----------------------------------------------------------------------------- checking
@dataclass(frozen=True)
class CheckReport:
    ok: bool
    text: str


def compare_outputs(definition: ir.CheckedDef, sizes: dict[str, int], inputs, actual, expected) -> CheckReport:
    """Compare ``actual`` outputs with the interpreter's ``expected`` ones, TC style.

    Floating-point outputs may differ by ``ops * eps * scale``: ``ops`` is the most terms any
    element reduces over (1 without reductions), ``eps`` the output type's machine epsilon and
    ``scale`` the largest magnitude among the inputs and the expected outputs.  Integer and
    boolean outputs must be equal; non-finite values must match exactly.
    """
    ops = _reduction_terms(definition, sizes)
    input_scale = max(
        (float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) for a in inputs if a.dtype.kind == "f"), default=0.0
    )
    worst_error, worst_tolerance, failures = 0.0, 0.0, []
    for name, got, want in zip(definition.outputs, actual, expected):
        if got.shape != want.shape:
            failures.append(f"{name} has shape {got.shape}, expected {want.shape}")
            continue
        if want.dtype.kind != "f":
            wrong = int(np.count_nonzero(got != want))
            if wrong:
                failures.append(f"{name} differs at {wrong} of {want.size} element(s) (exact comparison)")
            continue
        got64, want64 = got.astype(np.float64), want.astype(np.float64)
        finite = np.isfinite(want64)
        nonfinite_ok = np.array_equal(got64[~finite], want64[~finite], equal_nan=True)
        scale = max(input_scale, float(np.max(np.abs(want64[finite]), initial=0.0)), 1e-30)
        tolerance = ops * float(np.finfo(want.dtype).eps) * scale
        error = float(np.max(np.abs(got64[finite] - want64[finite]), initial=0.0))
        if np.isnan(error):
            error = float("inf")  # a NaN where a finite value was expected
        worst_error, worst_tolerance = max(worst_error, error), max(worst_tolerance, tolerance)
        if error > tolerance or not nonfinite_ok:
            detail = (
                "non-finite values differ"
                if not nonfinite_ok
                else f"max abs error {error:.3g} > tolerance {tolerance:.3g}"
            )
            failures.append(f"{name}: {detail}")
    if failures:
        return CheckReport(False, "check: MISMATCH " + "; ".join(failures))
    return CheckReport(True, f"check: OK (max abs error {worst_error:.3g}, tolerance {worst_tolerance:.3g}, ops {ops})")


def _reduction_terms(definition: ir.CheckedDef, sizes: dict[str, int]) -> int:
    """The most terms one element of any statement reduces over; 1 without reductions."""
    most = 1
    for statement in definition.statements:
        terms = 1
        for index in statement.reduction_indices:
            bounds = statement.range_of(index)
            terms *= max(bounds.hi.evaluate(sizes) - bounds.lo.evaluate(sizes), 0)
        most = max(most, terms)
    return most
