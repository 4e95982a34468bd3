"""The cache's compile requests: a process that finds a def's kernel in the cache skips its
dependences, scheduling and code generation, and a broken request file is only a miss."""

from __future__ import annotations

import json

import numpy as np
import pytest

import polyc
from polyc import driver
from polyc.runtime.cache import REQUESTS_DIR

SOURCE = "def scale(float(N) A) -> (B) { B(i) = A(i) * 3 }"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    return tmp_path


def fresh_kernel(**options):
    """A kernel object as a new process would have it: nothing compiled in memory."""
    return polyc.define(SOURCE, **options).scale


def forbid_generation(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the kernel was generated again")

    monkeypatch.setattr(driver, "compile_stages", fail)
    monkeypatch.setattr(driver, "analyse", fail)


def count_generation(monkeypatch) -> list[int]:
    """A one-element list counting the calls of code generation from now on."""
    calls = [0]
    generate = driver.compile_stages

    def counted(*args, **kwargs):
        calls[0] += 1
        return generate(*args, **kwargs)

    monkeypatch.setattr(driver, "compile_stages", counted)
    return calls


def request_files(cache):
    return sorted((cache / REQUESTS_DIR).rglob("*.json"))


def test_a_cached_request_skips_generation(cache, monkeypatch):
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(fresh_kernel()(x), x * 3)
    (request,) = request_files(cache)
    recorded = json.loads(request.read_text())
    assert recorded["call"]["function_name"] == "polyc_scale"
    forbid_generation(monkeypatch)
    np.testing.assert_array_equal(fresh_kernel()(x), x * 3)


def test_other_options_or_sizes_are_other_requests(cache, monkeypatch):
    x = np.arange(5, dtype=np.float32)
    fresh_kernel()(x)
    fresh_kernel(parallel=False)(x)
    fresh_kernel()(np.arange(7, dtype=np.float32))
    assert len(request_files(cache)) == 3


@pytest.mark.parametrize("damage", ["garbage", "wrong library", "library deleted", "source edited"])
def test_a_broken_request_is_a_miss(cache, damage, monkeypatch):
    x = np.arange(5, dtype=np.float32)
    fresh_kernel()(x)
    (request,) = request_files(cache)
    recorded = json.loads(request.read_text())
    entry = cache / recorded["library"][:2] / recorded["library"]
    if damage == "garbage":
        request.write_text("{not json")
    elif damage == "wrong library":
        request.write_text(json.dumps({"library": "0" * 64, "call": recorded["call"]}))
    elif damage == "library deleted":
        (entry / "kernel.so").unlink()
    else:  # a request must not run C that is not what it recorded
        (entry / "kernel.c").write_text((entry / "kernel.c").read_text() + "\n/* edited */\n")
    generated = count_generation(monkeypatch)
    np.testing.assert_array_equal(fresh_kernel()(x), x * 3)
    assert generated == [1]  # a miss: generated again (the request's kernel was not trusted)
    assert json.loads(request.read_text())["library"] == recorded["library"]  # recorded again
    assert (entry / "kernel.so").exists()  # built again where it was deleted
