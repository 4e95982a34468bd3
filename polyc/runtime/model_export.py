"""A whole model as a self-contained C project: its kernels, their calls, one arena, the weights.

A front end (the ONNX session: :mod:`polyc.frontends.onnx.export`) describes a model planned for
fixed shapes as a :class:`ModelExport`: the kernels (each a generated translation unit whose one
external symbol is its entry function, named after its def), the calls in order with where each
argument lives, the constants, and the inputs and outputs.  :meth:`ModelExport.write` turns it
into files that build with a C compiler alone:

``PREFIX.h``
    the API: ``PREFIX_create(weights_path)``, ``PREFIX_run(model, inputs, outputs)``,
    ``PREFIX_destroy``, ``PREFIX_set_threads``, ``PREFIX_error`` and ``PREFIX_error_message``;
    the inputs' and outputs' names, element types and shapes (``PREFIX_input(k)``).
``PREFIX.c``
    the arena (one block per instance, each tensor at its offset; nothing is allocated by a
    run), the weights loader, the call sequence.
``PREFIX_kN.c``
    one kernel each, as polyc generated it for the target: its helpers are ``static``, so every
    kernel is a translation unit of its own and the files link together.
``PREFIX.bin``
    the constants, little-endian, after a 64-byte header (magic, format, size, check sum and the
    model's id, which ``PREFIX.c`` holds too): a damaged file or another export's is refused.
``main.c``, ``Makefile``, ``CMakeLists.txt``
    a demo that reads inputs from ``.npy`` files and writes the outputs as ``.npy``, and two
    ways to build it.

Where a tensor lives is a :class:`Place`: an input or output the caller passes, the weights, or
the arena, at a byte offset.
"""

from __future__ import annotations

import hashlib
import re
import string
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyc.codegen.c import GeneratedKernel
from polyc.codegen.c_expr import c_type
from polyc.codegen.gemm import STATUS_OUT_OF_MEMORY
from polyc.errors import PolycError
from polyc.runtime.targets import kernel_prototype
from polyc.runtime.templates import export_template
from polyc.target import LANGUAGE_FLAGS, Target
from polyc.version import __version__

#: The weights file's format number (its header's second field).
WEIGHTS_FORMAT = 1
#: Bytes of the weights file's header; the constants start here.
WEIGHTS_HEADER_BYTES = 64
#: Every tensor in the arena and the weights starts at a multiple of this many bytes.
ALIGNMENT = 64
#: The error codes of the exported API (``PREFIX_OK``, ...), as ``PREFIX.h`` defines them.
ERROR_CODES = {"OK": 0, "ERROR_ARGUMENT": 1, "ERROR_WEIGHTS": 2, "ERROR_MEMORY": 3, "ERROR_KERNEL": 4}


@dataclass(frozen=True)
class Place:
    """Where a tensor's first byte is: ``space`` is ``input`` or ``output`` (the caller's
    ``index``-th pointer), ``weights`` or ``arena``; ``offset`` in bytes from there."""

    space: str
    offset: int = 0
    index: int = 0

    def moved(self, offset: int) -> Place:
        """The place ``offset`` bytes further."""
        return Place(self.space, self.offset + offset, self.index)

    def c_address(self) -> str:
        """The address as a C expression in the call sequence (``model``, ``inputs``, ``outputs``)."""
        base = {
            "input": f"(unsigned char *)inputs[{self.index}]",
            "output": f"(unsigned char *)outputs[{self.index}]",
            "weights": "model->weights",
            "arena": "model->arena",
        }[self.space]
        return f"{base} + {self.offset}" if self.offset else base


@dataclass(frozen=True)
class ExportTensor:
    """A model input or output: its name, element type and shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class ExportCall:
    """One kernel call: the kernel (an index into :attr:`ModelExport.kernels`), where each of its
    tensor arguments lives (in the kernel's argument order), the ranges to set to zero before
    (outputs and temporaries the kernel reads before it writes them all), and what it computes,
    for error messages (a group and its ONNX nodes)."""

    kernel: int
    arguments: tuple[Place, ...]
    zeroed: tuple[tuple[Place, int], ...]
    label: str


@dataclass(frozen=True)
class ModelExport:
    """A model for fixed shapes, ready to be written as C (see the module's docstring).

    ``outputs`` pairs each output with the place its value is at the end of a run: ``None``
    when its kernel wrote it into the caller's buffer, else a place copied from (an input passed
    through, a constant, a view of a tensor of the arena).  ``description`` lines go into the
    files' comments (where the model came from, its kernels' ONNX nodes)."""

    prefix: str
    target: Target
    kernels: tuple[GeneratedKernel, ...]
    calls: tuple[ExportCall, ...]
    inputs: tuple[ExportTensor, ...]
    outputs: tuple[tuple[ExportTensor, Place | None], ...]
    weights: bytes
    arena_bytes: int
    description: tuple[str, ...] = ()
    #: C files the kernels link with, by name (polyc's thread pool, which contraction kernels
    #: use instead of OpenMP on a crowded machine, through a weak symbol: without it, OpenMP).
    support: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.prefix):
            raise PolycError(
                f"export name {self.prefix!r} must be a C identifier (it prefixes the API's functions and names the files)"
            )

    @property
    def model_id(self) -> int:
        """A 64-bit id of this export, in ``PREFIX.c`` and in the weights file's header."""
        text = "\n".join([__version__, self.prefix, self.target.name, *(k.source for k in self.kernels)])
        digest = hashlib.sha256(text.encode() + self.weights).digest()
        return int.from_bytes(digest[:8], "little")

    def kernel_file(self, number: int) -> str:
        return f"{self.prefix}_k{number}.c"

    @property
    def sources(self) -> list[str]:
        """Every C file of the model (not the demo), in build order."""
        return [
            f"{self.prefix}.c",
            *(self.kernel_file(n) for n in range(len(self.kernels))),
            *(name for name, _ in self.support),
        ]

    # ------------------------------------------------------------------ the files
    def files(self) -> dict[str, str | bytes]:
        """Every file of the project by name: text, or bytes for the weights."""
        files: dict[str, str | bytes] = {
            f"{self.prefix}.h": self.header(),
            f"{self.prefix}.c": self.model_c(),
            f"{self.prefix}.bin": self.weights_file(),
            "main.c": self._template("model_demo.c"),
            "Makefile": self.makefile(),
            "CMakeLists.txt": self.cmake(),
        }
        for number, kernel in enumerate(self.kernels):
            files[self.kernel_file(number)] = self._kernel_c(number, kernel)
        files.update(self.support)
        return files

    def write(self, directory: str | Path) -> dict[str, Path]:
        """Writes :meth:`files` into ``directory`` (made if missing); their paths by name."""
        directory = Path(directory)
        paths = {}
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for name, content in self.files().items():
                path = directory / name
                if isinstance(content, bytes):
                    path.write_bytes(content)
                else:
                    path.write_text(content, encoding="utf-8")
                paths[name] = path
        except OSError as error:
            raise PolycError(f"cannot write the exported model to {directory}: {error}") from error
        return paths

    def weights_file(self) -> bytes:
        """``PREFIX.bin``: the 64-byte header, then the constants."""
        header = b"POLYCWTS" + b"".join(
            value.to_bytes(8, "little")
            for value in (WEIGHTS_FORMAT, len(self.weights), weights_checksum(self.weights), self.model_id)
        )
        return header.ljust(WEIGHTS_HEADER_BYTES, b"\0") + self.weights

    def _template(self, name: str) -> str:
        return string.Template(export_template(name)).substitute(
            prefix=self.prefix,
            PREFIX=self.prefix.upper(),
            default_weights=f"{self.prefix}.bin",
            num_inputs=len(self.inputs),
            out_of_memory=STATUS_OUT_OF_MEMORY,
        )

    def _comment(self, lines: list[str]) -> str:
        return "/*\n" + "\n".join(f" * {line}".rstrip() for line in lines).replace("*/", "* /") + "\n */"

    def _about(self) -> list[str]:
        return [
            f"polyc {__version__}: a model exported for target {self.target.name}: {self.target.description}.",
            *self.description,
        ]

    def header(self) -> str:
        """``PREFIX.h``: the API, the tensors' table type, the error codes."""
        p, P = self.prefix, self.prefix.upper()
        guard = f"POLYC_EXPORT_{P}_H"

        def tensor_lines(kind: str, tensors) -> list[str]:
            return [
                f"  {kind} {k}: {t.name!r} {t.dtype.name}[{']['.join(map(str, t.shape))}]"
                if t.shape
                else f"  {kind} {k}: {t.name!r} {t.dtype.name} (0-d: one element)"
                for k, t in enumerate(tensors)
            ]

        lines = [
            *self._about(),
            "",
            *tensor_lines("input", self.inputs),
            *tensor_lines("output", [t for t, _ in self.outputs]),
            "",
            f"Use: {p}_t *m = {p}_create(\"{p}.bin\");  if ({p}_error(m)) puts({p}_error_message(m));",
            f"     {p}_run(m, inputs, outputs);  /* pointers to C-order arrays, in the order above */",
            f"     {p}_destroy(m);",
            "",
            "An instance holds its own arena (every tensor between kernels, at offsets planned from",
            "their lifetimes) and its weights, so instances are independent and may run in different",
            "threads at once (one run at a time per instance); a run allocates nothing of the model's.",
            "The kernels keep process-wide caches in function statics, which all instances share:",
            "tables that depend only on the kernel's shapes, and scratch memory that each call takes",
            "and gives back atomically (a second call at the same time allocates its own).  They hold",
            "no instance's data and are kept for the life of the process.",
            "",
            "The weights are read at create time from the file exported beside this header; its header",
            "names the model it belongs to, its size and check sum: another export's file, a damaged",
            f"or truncated one is refused ({P}_ERROR_WEIGHTS, with a message).",
        ]
        codes = [f"#define {P}_{name} {value}" for name, value in ERROR_CODES.items()]
        return "\n".join(
            [
                self._comment(lines),
                f"#ifndef {guard}",
                f"#define {guard}",
                "",
                "#include <stddef.h>",
                "#include <stdint.h>",
                "",
                "#ifdef __cplusplus",
                'extern "C" {',
                "#endif",
                "",
                "/* Error codes: what create (through " + f"{p}_error) and run return. */",
                *codes,
                "",
                f"#define {P}_NUM_INPUTS {len(self.inputs)}",
                f"#define {P}_NUM_OUTPUTS {len(self.outputs)}",
                f"#define {P}_ARENA_BYTES {self.arena_bytes}",
                f"#define {P}_WEIGHTS_BYTES {len(self.weights)}",
                "",
                "/* An input or output: its ONNX name, element type (numpy's name, the C type, the .npy",
                "   descr), element size, rank, shape and size in bytes. */",
                "typedef struct {",
                "    const char *name;",
                "    const char *dtype;",
                "    const char *c_type;",
                "    const char *npy_descr;",
                "    int element_size;",
                "    int rank;",
                "    const int64_t *shape;",
                "    size_t bytes;",
                f"}} {p}_tensor_t;",
                "",
                f"typedef struct {p} {p}_t;",
                "",
                f"/* A new instance with the weights read from `weights_path` (NULL: \"{p}.bin\"); NULL only",
                f"   when its few bytes cannot be allocated.  Check {p}_error: nonzero when it cannot run. */",
                f"{p}_t *{p}_create(const char *weights_path);",
                "/* Runs the model: `inputs` and `outputs` point to one C-order array each, in the order of",
                f"   {p}_input(k) and {p}_output(k).  Returns {P}_OK or an error code (message: {p}_error_message). */",
                f"int {p}_run({p}_t *model, const void *const *inputs, void *const *outputs);",
                f"void {p}_destroy({p}_t *model);",
                "/* The threads a run uses (0: OpenMP's default).  Only with OpenMP; ignored otherwise. */",
                f"int {p}_set_threads({p}_t *model, int threads);",
                f"int {p}_error(const {p}_t *model);",
                f"const char *{p}_error_message(const {p}_t *model);",
                f"/* The k-th input or output (NULL outside 0 .. {P}_NUM_INPUTS - 1 or {P}_NUM_OUTPUTS - 1). */",
                f"const {p}_tensor_t *{p}_input(int index);",
                f"const {p}_tensor_t *{p}_output(int index);",
                "",
                "#ifdef __cplusplus",
                "}",
                "#endif",
                "",
                f"#endif /* {guard} */",
                "",
            ]
        )

    def model_c(self) -> str:
        """``PREFIX.c``: the kernels' prototypes, the tensors' tables, the API, the call sequence."""
        p, P = self.prefix, self.prefix.upper()
        lines = [
            self._comment(
                [
                    *self._about(),
                    "",
                    "The API, the weights loader and the call sequence; the kernels are in "
                    f"{p}_k0.c .. {p}_k{len(self.kernels) - 1}.c"
                    if self.kernels
                    else "The API (the model has no kernels).",
                    f"Arena: {self.arena_bytes} bytes per instance; weights: {len(self.weights)} bytes.",
                ]
            ),
            f'#include "{p}.h"',
            "",
            "#include <stdbool.h>",
            "",
            f"#define {P}_WEIGHTS_FORMAT {WEIGHTS_FORMAT}",
            f"#define {P}_MODEL_ID 0x{self.model_id:016x}ull",
            "",
            "/* The kernels (one per file). */",
            *(kernel_prototype(k.source, k.function_name) + ";" for k in self.kernels),
            "",
        ]
        for kind, tensors in (("inputs", self.inputs), ("outputs", [t for t, _ in self.outputs])):
            for k, tensor in enumerate(tensors):
                extents = ", ".join(map(str, tensor.shape)) or "0"
                lines.append(f"static const int64_t {p}_{kind}_shape{k}[] = {{{extents}}};")
            entries = [
                f"    {{{_c_string(t.name)}, \"{t.dtype.name}\", \"{c_type(t.dtype)}\", \"{t.dtype.str}\", "
                f"{t.dtype.itemsize}, {len(t.shape)}, {p}_{kind}_shape{k}, {t.nbytes}}},"
                for k, t in enumerate(tensors)
            ]
            lines += [f"static const {p}_tensor_t {p}_{kind}[] = {{", *(entries or ["    {0},"]), "};", ""]
        lines.append(self._template("model_api.c"))
        lines.append(self._call_sequence())
        return "\n".join(lines)

    def _call_sequence(self) -> str:
        p = self.prefix
        body = []
        for number, call in enumerate(self.calls):
            kernel = self.kernels[call.kernel]
            body.append(f"    /* call {number}: {call.label} */")
            for place, nbytes in call.zeroed:
                body.append(f"    memset({place.c_address()}, 0, {nbytes});")
            arguments = ", ".join(f"(void *)({place.c_address()})" for place in call.arguments)
            body.append(f"    if ((status = {kernel.function_name}({arguments})) != 0)")
            body.append(f"        return {p}_kernel_failed(model, status, {_c_string(call.label)});")
        for k, (tensor, source) in enumerate(self.outputs):
            if source is not None:
                body.append(f"    /* output {k} ({tensor.name}) is a copy */")
                body.append(f"    memmove(outputs[{k}], {source.c_address()}, {tensor.nbytes});")
        return "\n".join(
            [
                "",
                "/* ---- the call sequence ---- */",
                f"static int {p}_calls({p}_t *model, const void *const *inputs, void *const *outputs)",
                "{",
                "    int status = 0;",
                "    (void)inputs;",
                "    (void)outputs;",
                *body,
                "    return status;",
                "}",
                "",
            ]
        )

    def _kernel_c(self, number: int, kernel: GeneratedKernel) -> str:
        return "\n".join(
            [
                self._comment(
                    [
                        f"polyc {__version__}: kernel {number} of the model {self.prefix!r}, for target {self.target.name}.",
                        f"Its one external symbol: {kernel.function_name} (everything else is static).",
                    ]
                ),
                kernel.source,
            ]
        )

    def makefile(self) -> str:
        """A Makefile building ``PREFIX_demo`` (``make OPENMP=`` builds without OpenMP)."""
        p = self.prefix
        sources = " ".join(self.sources)
        flags = " ".join([*self.target.flags, *LANGUAGE_FLAGS])
        lines = [
            f"# polyc {__version__}: the model {p!r} for target {self.target.name}: {self.target.description}.",
            "# make                  builds the demo, " + f"{p}_demo (run: ./{p}_demo INPUT.npy ...)",
            "# make OPENMP=          without OpenMP (one thread)",
            "# make LDFLAGS=-static  a static program (to run on a board, or under qemu)",
            f"CC = {self.target.c_compiler()}",
            f"CFLAGS = {flags}",
            "OPENMP = -fopenmp",
            "LDFLAGS =",
            "LDLIBS = -lm -lpthread",
            f"SOURCES = {sources}",
            "OBJECTS = $(SOURCES:.c=.o)",
            "",
            f"all: {p}_demo",
            "",
            f"{p}_demo: main.o $(OBJECTS)",
            "\t$(CC) $(CFLAGS) $(OPENMP) $(LDFLAGS) -o $@ main.o $(OBJECTS) $(LDLIBS)",
            "",
            f"%.o: %.c {p}.h",
            "\t$(CC) $(CFLAGS) $(OPENMP) -c -o $@ $<",
            "",
            "clean:",
            f"\trm -f main.o $(OBJECTS) {p}_demo",
            "",
            ".PHONY: all clean",
            "",
        ]
        return "\n".join(lines)

    def cmake(self) -> str:
        """A CMakeLists.txt: the library ``PREFIX`` and the demo (``-DPOLYC_OPENMP=OFF``: no OpenMP)."""
        p = self.prefix
        sources = " ".join(self.sources)
        flags = " ".join(f for f in self.target.flags if not f.startswith("-std="))
        compiler = self.target.cc
        lines = [
            f"# polyc {__version__}: the model {p!r} for target {self.target.name}: {self.target.description}.",
            "cmake_minimum_required(VERSION 3.13)",
            *([f"# a cross build: cmake -DCMAKE_C_COMPILER={compiler} (set before project())"] if compiler else []),
            f"project({p} C)",
            "option(POLYC_OPENMP \"Build the kernels with OpenMP\" ON)",
            "set(CMAKE_C_STANDARD 11)",
            "set(CMAKE_C_EXTENSIONS ON)",
            f"add_library({p} STATIC {sources})",
            f"target_compile_options({p} PRIVATE {flags} -fno-math-errno -fno-trapping-math)",
            f"target_include_directories({p} PUBLIC ${{CMAKE_CURRENT_SOURCE_DIR}})",
            "if(POLYC_OPENMP)",
            "  find_package(OpenMP REQUIRED)",
            f"  target_link_libraries({p} PUBLIC OpenMP::OpenMP_C)",
            "endif()",
            "find_package(Threads REQUIRED)",
            f"target_link_libraries({p} PUBLIC m Threads::Threads)",
            f"add_executable({p}_demo main.c)",
            f"target_link_libraries({p}_demo PRIVATE {p})",
            "",
        ]
        return "\n".join(lines)


def weights_checksum(data: bytes) -> int:
    """The weights' check sum, as ``PREFIX.c`` computes it: CRC-32 (zlib's polynomial)."""
    return zlib.crc32(data)


def _c_string(text: str) -> str:
    """``text`` as a C string literal (UTF-8; quotes, backslashes and non-printing bytes escaped)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 32 <= byte < 127 and char != "?":  # (no trigraphs)
            out.append(char)
        else:
            out.append(f'\\{byte:03o}')
    return '"' + "".join(out) + '"'
