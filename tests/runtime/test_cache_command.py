"""The kernel cache's room (polyc/runtime/cache_space.py): sizes, the limit and its
least-recently-used eviction, and ``polyc cache info | clear | prune`` on a temporary
``POLYC_CACHE_DIR`` (tests/runtime/conftest.py gives every test its own)."""

from __future__ import annotations

import fcntl
import io
import json
import os
from pathlib import Path

import pytest

from polyc import cli
from polyc.errors import CacheError
from polyc.runtime import cache as cache_module
from polyc.runtime import cache_space
from polyc.runtime.cache import get_or_build, load_kernel_library, write_record
from polyc.runtime.compiler import CompilerOptions
from polyc.runtime.loader import load_library, loaded_library_paths

#: Quick builds: no optimisation, no OpenMP.
QUICK = CompilerOptions(flags=("-O0",), openmp=False)


def source(number: int) -> str:
    """A distinct small library per number."""
    return f"int polyc_test_entry_{number}(int x) {{ return x + {number}; }}\n"


def entry_of(library: Path) -> Path:
    return library.parent


def counted(cache: Path) -> int:
    return cache_space.evictable_size(cache_space.inventory(cache))


def entries(cache: Path) -> set[Path]:
    return {item.path for item in cache_space.inventory(cache) if item.kind == "kernel entries"}


def entry_size(entry: Path) -> int:
    return sum(file.stat().st_size for file in entry.iterdir())


# ----------------------------------------------------------------------------- sizes
@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1048576", 1048576),
        ("500M", 500 * 1024**2),
        ("2G", 2 * 1024**3),
        ("2g", 2 * 1024**3),
        ("1.5GiB", int(1.5 * 1024**3)),
        ("64 KB", 64 * 1024),
        ("0", None),
        ("none", None),
        ("Unlimited", None),
    ],
)
def test_sizes_are_read(text, size):
    assert cache_space.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "abc", "-5M", "2X", "1e9", "M", "5 M B"])
def test_what_is_not_a_size_is_refused(text):
    with pytest.raises(ValueError, match="is not a size: give bytes, or a number with K, M, G or T"):
        cache_space.parse_size(text)


def test_the_limit_defaults_to_two_gibibytes(monkeypatch):
    monkeypatch.delenv("POLYC_CACHE_MAX_SIZE", raising=False)
    assert cache_space.size_limit() == cache_space.DEFAULT_MAX_SIZE == 2 * 1024**3
    monkeypatch.setenv("POLYC_CACHE_MAX_SIZE", "none")
    assert cache_space.size_limit() is None


def test_a_bad_limit_is_an_error_naming_the_variable_before_any_build(kernel_cache, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_MAX_SIZE", "lots")
    with pytest.raises(CacheError, match=r"POLYC_CACHE_MAX_SIZE='lots' is not a size: give bytes"):
        get_or_build(source(0), QUICK)
    assert not entries(kernel_cache)
    assert cli.main(["cache", "info"]) == 1


# ----------------------------------------------------------------------------- eviction
def test_builds_keep_the_cache_under_its_limit_plus_the_entry_just_built(kernel_cache, monkeypatch):
    first = entry_of(get_or_build(source(0), QUICK))
    size = entry_size(first)
    limit = int(2.5 * size)
    monkeypatch.setenv("POLYC_CACHE_MAX_SIZE", str(limit))
    for number in range(1, 7):
        built = entry_of(get_or_build(source(number), QUICK))
        assert built in entries(kernel_cache)  # never the entry just built
        assert counted(kernel_cache) <= limit + entry_size(built)
    assert len(entries(kernel_cache)) < 7


def test_the_least_recently_used_go_first(kernel_cache, monkeypatch):
    a, b, c = (entry_of(get_or_build(source(n), QUICK)) for n in range(3))
    for age, entry in enumerate((a, b, c)):
        os.utime(entry, (1000.0 + age, 1000.0 + age))
    assert entry_of(get_or_build(source(0), QUICK)) == a  # taken from the cache: used now
    monkeypatch.setenv("POLYC_CACHE_MAX_SIZE", str(int(2.5 * entry_size(a))))
    d = entry_of(get_or_build(source(3), QUICK))
    assert entries(kernel_cache) == {a, d}


def test_what_this_process_loaded_or_another_builds_is_never_evicted(kernel_cache, monkeypatch):
    loaded, locked = (entry_of(get_or_build(source(n), QUICK)) for n in (10, 11))
    load_library(loaded / "kernel.so")
    for entry in (loaded, locked):
        os.utime(entry, (1000.0, 1000.0))
    monkeypatch.setenv("POLYC_CACHE_MAX_SIZE", "1")
    with open(locked.parent / f"{locked.name}.lock", "a") as lock:  # as a builder holds it
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = entry_of(get_or_build(source(12), QUICK))
    kept = entries(kernel_cache)
    assert {loaded, locked, built} <= kept
    assert kept - {locked, built} <= {path.parent for path in loaded_library_paths()}  # (the thread pool's too)
    removed = cache_space.evict(kernel_cache, 0)
    assert loaded not in entries(kernel_cache) and removed.count >= 1  # (only eviction by a build keeps it)


def test_an_entry_evicted_between_lookup_and_load_is_built_again(kernel_cache, monkeypatch):
    calls = []

    def evicted_after_lookup(c_source, options=None, *, name=""):
        path = cache_module.fetch_library(c_source, options, name=name).path
        if not calls:
            cache_space.evict(kernel_cache, 0)  # another process evicts it meanwhile
        calls.append(path)
        return path

    monkeypatch.setattr(cache_module, "get_or_build", evicted_after_lookup)
    library = load_kernel_library(source(20), QUICK)
    assert library.polyc_test_entry_20(1) == 21
    assert len(calls) == 2 and calls[0].is_file()


def test_records_are_evicted_too_and_tuning_records_never(kernel_cache, monkeypatch):
    write_record("requests", "ab" * 32, {"library": "cd" * 32, "call": {}})
    write_record("proofs", "ef" * 32, {"bounds": []})
    tuning = kernel_cache / "tuning" / "records.jsonl"
    tuning.parent.mkdir()
    tuning.write_text('{"a": 1}\n{"a": 2}\n')
    removed = cache_space.evict(kernel_cache, 0)
    assert removed.count == 2
    assert tuning.is_file()
    assert cache_space.usage(cache_space.inventory(kernel_cache))["tuning records"] == (2, tuning.stat().st_size)


# ----------------------------------------------------------------------------- polyc cache
@pytest.fixture
def filled(kernel_cache, tmp_path) -> dict:
    """A cache holding two kernels, a request, a proof record, tuning records, a file polyc did
    not make, and a link to a directory outside the cache that looks like a shard."""
    libraries = [get_or_build(source(n), QUICK) for n in (30, 31)]
    write_record("requests", "12" * 32, {"library": libraries[0].parent.name, "call": {}})
    write_record("proofs", "34" * 32, {"bounds": []})
    tuning = kernel_cache / "tuning" / "records.jsonl"
    tuning.parent.mkdir()
    tuning.write_text('{"a": 1}\n')
    foreign = kernel_cache / "notes.txt"
    foreign.write_text("mine\n")
    outside = tmp_path / "outside"
    (outside / ("56" * 32)).mkdir(parents=True)
    (outside / ("56" * 32) / "kernel.so").write_bytes(b"not the cache's")
    (kernel_cache / "56").symlink_to(outside)
    return {"libraries": libraries, "tuning": tuning, "foreign": foreign, "outside": outside}


def test_info_gives_the_directory_and_each_kind(filled, kernel_cache, capsys, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_MAX_SIZE", "500M")
    assert cli.main(["cache", "info"]) == 0
    text = capsys.readouterr().out
    assert f"kernel cache: {kernel_cache}" in text
    for kind, count in [("kernel libraries", 2), ("kernel sources", 2), ("compile requests", 1), ("tuning records", 1)]:
        assert any(line.split()[-3:-2] == [str(count)] and kind in line for line in text.splitlines()), kind
    assert "of a limit of 500.0 MiB" in text
    assert cli.main(["cache", "info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["directory"] == str(kernel_cache) and report["limit"] == 500 * 1024**2
    libraries = sum(path.stat().st_size + (path.parent / "meta.json").stat().st_size for path in filled["libraries"])
    assert report["kinds"]["kernel libraries"] == {"entries": 2, "bytes": libraries}
    assert report["kinds"]["proof records"]["entries"] == 1


def test_info_on_a_cache_not_made_yet(kernel_cache, capsys):
    assert cli.main(["cache", "info"]) == 0
    assert "does not exist yet" in capsys.readouterr().out


def test_clear_asks_first(filled, kernel_cache, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    assert cli.main(["cache", "clear"]) == 1
    assert "nothing removed" in capsys.readouterr().err
    assert all(library.is_file() for library in filled["libraries"])
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert cli.main(["cache", "clear"]) == 0
    assert "(tuning records kept)" in capsys.readouterr().out
    assert not any(library.exists() for library in filled["libraries"])
    assert not (kernel_cache / "requests" / "12").exists() or not any((kernel_cache / "requests" / "12").iterdir())
    assert filled["tuning"].is_file() and filled["foreign"].is_file()  # kept: asked to keep, or not polyc's
    assert (filled["outside"] / ("56" * 32) / "kernel.so").is_file()  # outside the cache, behind a link


def test_clear_yes_with_tuning(filled, kernel_cache, capsys):
    assert cli.main(["cache", "clear", "--yes", "--tuning"]) == 0
    assert not filled["tuning"].exists()
    assert filled["foreign"].is_file()
    assert cache_space.usage(cache_space.inventory(kernel_cache))["kernel libraries"] == (0, 0)


def test_prune_to_a_size_least_recently_used_first(filled, kernel_cache, capsys):
    old, new = (library.parent for library in filled["libraries"])
    os.utime(old, (1000.0, 1000.0))
    assert cli.main(["cache", "prune", "--max-size", str(entry_size(new) + 4096)]) == 0
    assert "least recently used" in capsys.readouterr().out
    assert entries(kernel_cache) == {new}
    assert cli.main(["cache", "prune", "--max-size", "0"]) == 0
    assert entries(kernel_cache) == set() and counted(kernel_cache) == 0
    assert filled["tuning"].is_file()


@pytest.mark.parametrize("value", ["big", "-1G", "10Q"])
def test_prune_refuses_a_bad_size(value, capsys):
    assert cli.main(["cache", "prune", f"--max-size={value}"]) == 2
    assert f"argument --max-size: {value!r} is not a size" in capsys.readouterr().err


def test_prune_needs_a_size(capsys):
    assert cli.main(["cache", "prune"]) == 2
    assert "--max-size" in capsys.readouterr().err
