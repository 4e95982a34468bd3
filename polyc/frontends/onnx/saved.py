"""A saved session: a model compiled for this machine into one file that a new process loads
without a C compiler (``session.save(path)``, then ``polyc.onnx.InferenceSession(path)``).

Saving exports the session's plan for fixed shapes for the host (:mod:`.export`: the same
kernels, arena and call sequence), builds it into one shared library with the C compiler, and
writes one file::

    magic "POLYCSES" | format (u64) | manifest bytes (u64) | SHA-256 of the rest (32 bytes)
    manifest (JSON: polyc's version, the machine, the compiler, the inputs and outputs, the
              payloads' sizes) | the shared library | the weights file (model.bin)

Loading checks the magic, the format, the length and the digest (a truncated or damaged file
is refused), then the polyc version and the machine it was built for (a file made on another
processor or by another polyc is refused: its code was built with ``-march=native`` there),
writes the library and the weights to a private directory, loads the library with ctypes and
creates one instance of the model, whose arena and weights stay with the session.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from polyc.errors import PolycError, SignatureError
from polyc.runtime.model_export import ModelExport
from polyc.target import host, usable_cores
from polyc.version import __version__

MAGIC = b"POLYCSES"
FORMAT = 1
#: magic, format, manifest length, digest
HEADER_BYTES = 8 + 8 + 8 + 32
#: The C prefix of a saved session's library.
PREFIX = "model"


def is_saved_session(model) -> bool:
    """Whether ``model`` (what ``InferenceSession`` was given) is a saved session's path or bytes."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model[: len(MAGIC)]) == MAGIC
    if isinstance(model, (str, os.PathLike)):
        # Only a regular file is opened: opening a FIFO would wait for a writer, and what is
        # not a regular file gets its clear error from the model reader.
        try:
            if not stat.S_ISREG(os.stat(model).st_mode):
                return False
            with open(model, "rb") as file:
                return file.read(len(MAGIC)) == MAGIC
        except OSError:
            return False
    return False


def save(exported: ModelExport, path, flags: list[str], compiler: str) -> None:
    """Builds ``exported`` (for the host) into a shared library with ``compiler`` and ``flags``
    and writes the saved session to ``path``."""
    with tempfile.TemporaryDirectory(prefix="polyc-save-") as directory:
        exported.write(directory)
        sources = exported.sources

        def compile_one(source: str) -> str:
            target = source[:-2] + ".o"
            _run([*compiler.split(), *flags, "-fPIC", "-c", "-o", target, source], directory)
            return target

        with ThreadPoolExecutor(max_workers=usable_cores()) as pool:
            objects = list(pool.map(compile_one, sources))
        _run([*compiler.split(), *flags, "-shared", "-o", "model.so", *objects, "-lm", "-lpthread"], directory)
        library = (Path(directory) / "model.so").read_bytes()
        weights = (Path(directory) / f"{PREFIX}.bin").read_bytes()
    manifest = {
        "polyc": __version__,
        "machine": host().digest,
        "processor": host().model,
        "compiler": compiler,
        "flags": flags,
        "inputs": [_tensor(t) for t in exported.inputs],
        "outputs": [_tensor(t) for t, _ in exported.outputs],
        "library_bytes": len(library),
        "weights_bytes": len(weights),
    }
    text = json.dumps(manifest).encode()
    body = text + library + weights
    header = MAGIC + FORMAT.to_bytes(8, "little") + len(text).to_bytes(8, "little") + hashlib.sha256(body).digest()
    try:
        Path(path).write_bytes(header + body)
    except OSError as error:
        raise PolycError(f"cannot write the saved session to {path}: {error}") from error


def _tensor(tensor) -> dict:
    return {
        "name": tensor.name,
        "dtype": tensor.dtype.str,
        "shape": list(tensor.shape),
        "type": _type_name(tensor.dtype),
    }


def _run(command: list[str], directory: str) -> None:
    try:
        result = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    except OSError as error:
        raise PolycError(f"saving a session needs the C compiler: cannot run {command[0]} ({error})") from error
    if result.returncode != 0:
        raise PolycError(f"building the saved session failed ({' '.join(command[:3])} ...):\n{result.stderr[-3000:]}")


class SavedSession:
    """A session loaded from a file ``session.save`` wrote: onnxruntime's ``run``,
    ``get_inputs`` and ``get_outputs`` for the shapes it was saved with.  ``threads``: the
    most threads a run uses (None: OpenMP's default).  Runs of one session take turns."""

    def __init__(self, path, threads: int | None = None):
        from polyc.frontends.onnx.session import NodeArg

        data = _read(path)
        where = str(path) if not isinstance(path, (bytes, bytearray, memoryview)) else "saved session bytes"
        manifest, library, weights = _unpack(data, where)
        self._manifest = manifest
        self._inputs = [(t["name"], np.dtype(t["dtype"]), tuple(t["shape"])) for t in manifest["inputs"]]
        self._outputs = [(t["name"], np.dtype(t["dtype"]), tuple(t["shape"])) for t in manifest["outputs"]]
        self._types = {t["name"]: str(t["type"]) for t in manifest["inputs"] + manifest["outputs"]}
        self._node_args = (
            [NodeArg(n, list(s), self._types[n]) for n, _, s in self._inputs],
            [NodeArg(n, list(s), self._types[n]) for n, _, s in self._outputs],
        )
        directory = tempfile.mkdtemp(prefix="polyc-session-")
        try:
            (Path(directory) / "model.so").write_bytes(library)
            (Path(directory) / "model.bin").write_bytes(weights)
            self._library = ctypes.CDLL(str(Path(directory) / "model.so"))
            create = self._library[f"{PREFIX}_create"]
            create.restype, create.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
            self._handle = create(str(Path(directory) / "model.bin").encode())
        except OSError as error:
            raise PolycError(f"{where}: its library cannot be loaded ({error})") from error
        finally:
            shutil.rmtree(directory, ignore_errors=True)  # (mapped and read: the files can go)
        self._message = self._library[f"{PREFIX}_error_message"]
        self._message.restype, self._message.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        failed = self._library[f"{PREFIX}_error"]
        failed.restype, failed.argtypes = ctypes.c_int, [ctypes.c_void_p]
        if not self._handle or failed(self._handle):
            raise PolycError(f"{where}: the model cannot be created: {self._error_message()}")
        self._run = self._library[f"{PREFIX}_run"]
        self._run.restype = ctypes.c_int
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._destroy = self._library[f"{PREFIX}_destroy"]
        self._destroy.argtypes = [ctypes.c_void_p]
        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise PolycError(f"threads must be None or an integer >= 1, not {threads!r}")
            set_threads = self._library[f"{PREFIX}_set_threads"]
            set_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
            set_threads(self._handle, threads)
        self._lock = threading.Lock()

    def _error_message(self) -> str:
        text = self._message(self._handle) if self._handle else None
        return text.decode("utf-8", "replace") if text else "out of memory"

    def get_inputs(self) -> list:
        return list(self._node_args[0])

    def get_outputs(self) -> list:
        return list(self._node_args[1])

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def run(self, output_names, input_feed: dict, run_options=None) -> list[np.ndarray]:
        """The outputs named in ``output_names`` (None: all), in that order."""
        if not isinstance(input_feed, dict):
            raise SignatureError(f"input_feed must be a dict of input name -> array, not {type(input_feed).__name__}")
        known = [name for name, _, _ in self._outputs]
        names = known if output_names is None else list(output_names)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SignatureError(
                f"Invalid output name(s): {', '.join(map(repr, unknown))}; the model's outputs are "
                f"{', '.join(map(repr, known))}"
            )
        expected = [name for name, _, _ in self._inputs]
        missing = [n for n in expected if n not in input_feed]
        extra = [n for n in input_feed if n not in expected]
        if missing or extra:
            raise SignatureError(
                f"the saved session's inputs are {', '.join(map(repr, expected))}"
                + (f"; missing: {', '.join(map(repr, missing))}" if missing else "")
                + (f"; unknown: {', '.join(map(repr, extra))}" if extra else "")
            )
        arrays = []
        for name, dtype, shape in self._inputs:
            array = np.asarray(input_feed[name])
            if array.dtype != dtype:
                raise SignatureError(
                    f"Unexpected input data type for {name!r}. Actual: tensor({array.dtype}), expected: {self._types[name]}"
                )
            if array.shape != shape:
                raise SignatureError(
                    f"input {name!r} has shape {array.shape}; this session was saved for {shape} "
                    "(save a session for each set of shapes)"
                )
            arrays.append(np.ascontiguousarray(array))
        results = [np.empty(shape, dtype) for _, dtype, shape in self._outputs]
        inputs = (ctypes.c_void_p * max(1, len(arrays)))(*(a.ctypes.data for a in arrays))
        outputs = (ctypes.c_void_p * max(1, len(results)))(*(r.ctypes.data for r in results))
        with self._lock:
            status = self._run(self._handle, inputs, outputs)
            if status:
                raise PolycError(f"the saved session's run failed: {self._error_message()}")
        by_name = dict(zip(known, results))
        return [by_name[n] for n in names]

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and hasattr(self, "_destroy"):
            self._destroy(handle)


def _type_name(dtype: np.dtype) -> str:
    from onnx import helper

    from polyc.frontends.onnx.model import type_name

    return type_name(helper.np_dtype_to_tensor_dtype(dtype))


def _read(path) -> bytes:
    if isinstance(path, (bytes, bytearray, memoryview)):
        return bytes(path)
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise PolycError(f"cannot read the saved session {path}: {error}") from error


def _unpack(data: bytes, where: str) -> tuple[dict, bytes, bytes]:
    """The manifest, the library and the weights of a saved session, checked."""
    if len(data) < HEADER_BYTES or data[:8] != MAGIC:
        raise PolycError(f"{where}: not a saved polyc session (no POLYCSES header)")
    file_format = int.from_bytes(data[8:16], "little")
    if file_format != FORMAT:
        raise PolycError(f"{where}: a saved session of format {file_format}; this polyc reads format {FORMAT}")
    length = int.from_bytes(data[16:24], "little")
    body = data[HEADER_BYTES:]
    if length > len(body):
        raise PolycError(f"{where}: the saved session is truncated ({len(data)} bytes)")
    if hashlib.sha256(body).digest() != data[24:56]:
        raise PolycError(
            f"{where}: the saved session is damaged or truncated (its SHA-256 does not match its contents)"
        )
    try:
        manifest = json.loads(body[:length])
        library_bytes, weights_bytes = int(manifest["library_bytes"]), int(manifest["weights_bytes"])
        for tensor in manifest["inputs"] + manifest["outputs"]:
            tensor["name"], np.dtype(tensor["dtype"]), tuple(tensor["shape"]), tensor["type"]
    except (ValueError, KeyError, TypeError) as error:
        raise PolycError(f"{where}: the saved session's manifest is unreadable ({error})") from error
    if length + library_bytes + weights_bytes != len(body):
        raise PolycError(f"{where}: the saved session's sizes do not add up: damaged")
    if manifest.get("polyc") != __version__:
        raise PolycError(
            f"{where}: saved by polyc {manifest.get('polyc')}; this is polyc {__version__}: save the session again"
        )
    if manifest.get("machine") != host().digest:
        raise PolycError(
            f"{where}: saved on another machine ({manifest.get('processor')}, {manifest.get('machine')}); this is "
            f"{host().model} ({host().digest}): its code was built for that processor. Save the session on this "
            "machine, or export the model as C (session.export) for a portable build"
        )
    library = body[length : length + library_bytes]
    weights = body[length + library_bytes :]
    return manifest, library, weights
