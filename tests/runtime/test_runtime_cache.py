"""The on-disk kernel cache: where it lives, hits, corruption recovery and concurrent builders."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import polyc
from polyc.errors import CompilationError
from polyc.runtime import CompilerOptions, cache_dir, cache_key, get_or_build
from polyc.runtime import cache as cache_module


def entry_dirs(cache: Path) -> list[Path]:
    """The entry directories in a cache (lock files and build directories are not entries)."""
    return sorted(path for path in cache.glob("??/*") if path.is_dir())


def build_dirs(cache: Path) -> list[Path]:
    return sorted(cache.glob(cache_module.BUILD_DIR_PREFIX + "*"))


@pytest.fixture
def build_count(monkeypatch) -> list[int]:
    """Counts calls of the compiler by the cache: ``build_count[0]``."""
    count = [0]
    real_compile = cache_module.compile_shared_library

    def counting_compile(*args, **kwargs):
        count[0] += 1
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(cache_module, "compile_shared_library", counting_compile)
    return count


# --- where the cache lives ------------------------------------------------------------------------


def test_cache_dir_order(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("POLYC_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "polyc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "polyc"
    assert cache_dir().is_dir()


def _unwritable(monkeypatch, directory: Path) -> None:
    """``directory`` as a read-only file system shows it to this process (root ignores
    permission bits, so access() is faked)."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != directory and real_access(path, mode))


def test_cache_dir_that_is_a_file_falls_back_to_a_temporary_cache(tmp_path, monkeypatch, axpy_source, check_axpy):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("POLYC_CACHE_DIR", str(blocker / "polyc"))
    with pytest.warns(RuntimeWarning, match="cannot be created.*private temporary cache"):
        library = get_or_build(axpy_source)
    assert not library.is_relative_to(tmp_path)
    check_axpy(library)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="permission bits do not bind root")
def test_read_only_cache_dir(tmp_path, monkeypatch, axpy_source, check_axpy):
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o500)
    monkeypatch.setenv("POLYC_CACHE_DIR", str(read_only))
    try:
        with pytest.warns(RuntimeWarning, match="is not writable"):
            check_axpy(get_or_build(axpy_source))
    finally:
        read_only.chmod(0o700)


def test_unwritable_cache_dir_falls_back_with_a_warning_once(kernel_cache, monkeypatch, axpy_source, check_axpy):
    """A build goes to a private temporary cache, warned about once per process; the warning
    names the directory and the way out."""
    _unwritable(monkeypatch, kernel_cache)
    with pytest.warns(RuntimeWarning, match=f"{kernel_cache} cannot be written .*not writable.*Set POLYC_CACHE_DIR"):
        library = get_or_build(axpy_source)
    fallback = cache_dir()
    assert fallback != kernel_cache and library.is_relative_to(fallback)
    assert entry_dirs(kernel_cache) == []
    check_axpy(library)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_or_build(axpy_source + "\n") != library  # another build, no second warning


def test_kernels_already_in_a_read_only_cache_are_used(kernel_cache, monkeypatch, axpy_source, check_axpy, build_count):
    library = get_or_build(axpy_source)
    _unwritable(monkeypatch, kernel_cache)
    with pytest.warns(RuntimeWarning, match="not writable"):
        assert get_or_build(axpy_source) == library
    assert build_count[0] == 1
    check_axpy(library)


def test_a_cache_that_fills_up_falls_back(kernel_cache, monkeypatch, axpy_source, check_axpy):
    """A write that fails while an entry is made (a full disk): the build is made again in a
    temporary cache, and later builds go there too."""
    real_replace = os.replace

    def full_disk(source, destination):
        if Path(destination).is_relative_to(kernel_cache):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(source, destination)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        library = get_or_build(axpy_source)
    assert not library.is_relative_to(kernel_cache)
    check_axpy(library)
    assert cache_dir() == library.parents[2]


# --- keys, hits and misses ------------------------------------------------------------------------


def test_key_depends_on_source_options_and_version(axpy_source, monkeypatch):
    options = CompilerOptions(cc="gcc", flags=("-O2",))
    key = cache_key(axpy_source, options)
    assert key == cache_key(axpy_source, CompilerOptions(cc="gcc", flags=("-O2",)))
    assert key != cache_key(axpy_source + "\n", options)
    assert key != cache_key(axpy_source, CompilerOptions(cc="gcc", flags=("-O1",)))
    monkeypatch.setattr(cache_module, "POLYC_VERSION", "999")
    assert key != cache_key(axpy_source, options)


def test_build_then_hit(kernel_cache, axpy_source, check_axpy, build_count):
    library = get_or_build(axpy_source)
    key = cache_key(axpy_source, CompilerOptions())
    assert library == kernel_cache / key[:2] / key / "kernel.so"
    assert sorted(path.name for path in library.parent.iterdir()) == ["kernel.c", "kernel.so", "meta.json"]
    meta = json.loads((library.parent / "meta.json").read_text())
    assert meta["size"] == library.stat().st_size and meta["key"] == key
    stat_before = library.stat()

    assert get_or_build(axpy_source) == library
    assert get_or_build(axpy_source, rehash=True) == library
    assert build_count[0] == 1
    assert (library.stat().st_ino, library.stat().st_mtime_ns) == (stat_before.st_ino, stat_before.st_mtime_ns)
    assert build_dirs(kernel_cache) == []
    check_axpy(library)


def test_other_options_get_another_entry(kernel_cache, axpy_source, build_count):
    first = get_or_build(axpy_source, CompilerOptions(flags=("-O1",)))
    second = get_or_build(axpy_source, CompilerOptions(flags=("-O2",)))
    assert first != second and build_count[0] == 2
    assert len(entry_dirs(kernel_cache)) == 2


def test_verified_entry_is_not_rehashed(axpy_source, monkeypatch):
    get_or_build(axpy_source)
    hashed = []
    real_sha256 = cache_module._file_sha256
    monkeypatch.setattr(cache_module, "_file_sha256", lambda file: hashed.append(1) or real_sha256(file))
    get_or_build(axpy_source)
    assert hashed == []  # verified when built, and the file has not changed since
    get_or_build(axpy_source, rehash=True)
    assert hashed == [1]


INTRINSICS_AXPY = """#include <immintrin.h>
void axpy(long n, float a, const float *x, float *y)
{
    long i = 0;
#ifdef __AVX2__
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(_mm256_set1_ps(a), _mm256_loadu_ps(x + i))));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}
"""


def _intrinsics_headers(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"{cache_module.HEADERS_DIR}/*/*.gch"))


@pytest.mark.skipif(not CompilerOptions().uses_gcc(), reason="precompiled headers are made for GCC only")
def test_kernels_with_intrinsics_read_a_precompiled_header(kernel_cache, check_axpy, build_count, monkeypatch):
    headers = []
    real_compile = cache_module.compile_shared_library
    monkeypatch.setattr(
        cache_module,
        "compile_shared_library",
        lambda *args, **kwargs: headers.append(kwargs.get("header")) or real_compile(*args, **kwargs),
    )
    check_axpy(get_or_build(INTRINSICS_AXPY))
    (made,) = _intrinsics_headers(kernel_cache)
    assert headers == [made.with_suffix("")] and made.stat().st_size > 1_000_000
    check_axpy(get_or_build(INTRINSICS_AXPY.replace("long i = 0;", "long i = 0;  /* another */")))
    assert _intrinsics_headers(kernel_cache) == [made] and headers[1] == headers[0]


@pytest.mark.skipif(not CompilerOptions().uses_gcc(), reason="precompiled headers are made for GCC only")
def test_a_damaged_precompiled_header_is_made_again(kernel_cache, check_axpy, monkeypatch):
    get_or_build(INTRINSICS_AXPY)
    (made,) = _intrinsics_headers(kernel_cache)
    made.write_bytes(made.read_bytes()[:1000])  # GCC fails on this one (a garbage file it ignores)
    monkeypatch.setattr(cache_module, "_intrinsics_headers", {})  # as a new process finds it
    check_axpy(get_or_build(INTRINSICS_AXPY.replace("long i = 0;", "long i = 0;  /* second */")))
    assert not made.exists()
    check_axpy(get_or_build(INTRINSICS_AXPY.replace("long i = 0;", "long i = 0;  /* third */")))
    assert made.stat().st_size > 1_000_000


def test_failed_build_leaves_nothing(kernel_cache):
    with pytest.raises(CompilationError, match="no_such_function"):
        get_or_build("void f(void) { no_such_function(1, 2); }\n", CompilerOptions(extra_flags=("-Werror",)))
    assert entry_dirs(kernel_cache) == [] and build_dirs(kernel_cache) == []


def test_missing_compiler_through_the_cache(axpy_source):
    with pytest.raises(CompilationError, match="/nonexistent/cc"):
        get_or_build(axpy_source, CompilerOptions(cc="/nonexistent/cc"))


# --- corrupt entries ------------------------------------------------------------------------------


def truncate_library(entry: Path) -> None:
    library = entry / "kernel.so"
    os.truncate(library, library.stat().st_size // 2)


def garble_meta(entry: Path) -> None:
    (entry / "meta.json").write_text("{ this is not json")


def meta_with_wrong_hash(entry: Path) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    meta["sha256"] = "0" * 64
    (entry / "meta.json").write_text(json.dumps(meta))


def same_size_other_bytes(entry: Path) -> None:
    library = entry / "kernel.so"
    library.write_bytes(b"\0" * library.stat().st_size)


def remove_meta(entry: Path) -> None:
    (entry / "meta.json").unlink()


def remove_library(entry: Path) -> None:
    (entry / "kernel.so").unlink()


@pytest.mark.parametrize(
    "corrupt",
    [truncate_library, garble_meta, meta_with_wrong_hash, same_size_other_bytes, remove_meta, remove_library],
)
def test_corrupt_entry_is_rebuilt(kernel_cache, axpy_source, check_axpy, build_count, corrupt, monkeypatch):
    library = get_or_build(axpy_source)
    corrupt(library.parent)
    # As in a new process: an in-place rewrite within one clock tick can keep the file's stat.
    monkeypatch.setattr(cache_module, "_verified_entries", {})
    assert get_or_build(axpy_source) == library
    assert build_count[0] == 2
    meta = json.loads((library.parent / "meta.json").read_text())
    assert meta["size"] == library.stat().st_size
    assert len(entry_dirs(kernel_cache)) == 1 and build_dirs(kernel_cache) == []
    check_axpy(library)  # loaded only now: the corrupt file was never dlopened


def test_change_in_this_process_is_noticed(axpy_source, build_count):
    library = get_or_build(axpy_source)
    truncate_library(library.parent)
    assert get_or_build(axpy_source) == library  # no rehash asked for, but the size changed
    assert build_count[0] == 2


# --- concurrent builders --------------------------------------------------------------------------

# Each worker reports ready, waits for "go" on stdin so that all start together, then builds.
WORKER = """
import json, sys
from pathlib import Path
from polyc.runtime import cache
builds = 0
real_compile = cache.compile_shared_library
def counting_compile(*args, **kwargs):
    global builds
    builds += 1
    return real_compile(*args, **kwargs)
cache.compile_shared_library = counting_compile
if sys.argv[2] == "without-lock":
    cache.fcntl = None
source = Path(sys.argv[1]).read_text()
print("ready", flush=True)
sys.stdin.readline()
path = cache.get_or_build(source)
print(json.dumps({"path": str(path), "builds": builds}), flush=True)
"""


@pytest.mark.parametrize("locking", ["with-lock", "without-lock"])
def test_eight_processes_build_one_kernel(tmp_path, kernel_cache, axpy_source, check_axpy, locking):
    """With the lock one process builds; without it several may, but all must agree and succeed."""
    source_file = tmp_path / "new_kernel.c"
    source_file.write_text("/* a kernel no process has built yet */\n" + axpy_source)
    package_root = str(Path(polyc.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]))
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(source_file), locking],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(8)
    ]
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready", worker.stderr.read()
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        results = []
        for worker in workers:
            stdout, stderr = worker.communicate(timeout=300)
            assert worker.returncode == 0, stderr
            results.append(json.loads(stdout))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()

    paths = {result["path"] for result in results}
    assert len(paths) == 1
    builds = sum(result["builds"] for result in results)
    assert builds == 1 if locking == "with-lock" else 1 <= builds <= 8
    library = Path(paths.pop())
    assert entry_dirs(kernel_cache) == [library.parent]
    assert build_dirs(kernel_cache) == []
    assert get_or_build(source_file.read_text(), rehash=True) == library
    check_axpy(library)
