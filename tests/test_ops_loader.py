"""dsfast.ops.load with a tiny op of our own (plain Python C API: compiles in ~1 s, no torch headers).

Each test gets its own csrc root, cache dir and op registration, so nothing here depends on the
real kernels or on the user's ~/.cache.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from dsfast.ops import DsfastOpError, DsfastOpLockTimeout, DsfastOpWarning, OpSpec, jit, loader
from dsfast.ops import registry, toolchain

OP = "dsfast_test_tiny"
REF = "dsfast_test_tiny_ref"
TIMEOUT = 120  # seconds for any subprocess here: a hang fails the test instead of the suite

TINY_CPP = r"""
#include <Python.h>
#include "dsfast/tiny_value.h"
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define STR2(a) #a
#define STR(a) STR2(a)
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(TINY_VALUE + TINY_OFFSET); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "the value"}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef def = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};
PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&def); }
"""


def write_op(root, value, offset=0, broken=False):
    (root / "include" / "dsfast").mkdir(parents=True, exist_ok=True)
    (root / "test").mkdir(exist_ok=True)
    (root / "include" / "dsfast" / "tiny_value.h").write_text(f"#pragma once\n#define TINY_VALUE {value}\n")
    body = TINY_CPP.replace("TINY_OFFSET", str(offset))
    if broken:
        body += "\nthis_is_not_cpp dsfast_broken_line;\n"
    (root / "test" / "tiny.cpp").write_text(body)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A registered tiny op in a private csrc root and cache; returns a small namespace."""
    root = tmp_path / "csrc"
    cache = tmp_path / "cache"
    # A distinct value per test makes every test's binary (and module name) distinct.
    value = abs(hash(str(tmp_path))) % 100000
    write_op(root, value)
    (tmp_path / f"{REF}.py").write_text("def answer():\n    return -1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in ("DSFAST_REQUIRE_OPS", "DSFAST_DISABLE_OPS", "DSFAST_BUILD_LOCK_TIMEOUT", "DSFAST_BUILD_VERBOSE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DSFAST_CSRC_DIR", str(root))
    monkeypatch.setenv("DSFAST_CACHE_DIR", str(cache))
    spec = OpSpec(OP, ("test/tiny.cpp",), REF)
    monkeypatch.setitem(registry.OPS, OP, spec)
    reset_memory(monkeypatch)

    class Tiny:
        pass
    t = Tiny()
    t.root, t.cache, t.value, t.spec, t.tmp = root, cache, value, spec, tmp_path
    return t


def reset_memory(monkeypatch):
    """Forget what this process loaded/announced, as a fresh process would."""
    monkeypatch.setattr(loader, "_loaded", {})
    monkeypatch.setattr(loader, "_failed", {})
    monkeypatch.setattr(loader, "_announced", set())


SUBPROCESS_LOAD = textwrap.dedent("""
    import json, os, sys, time
    from dsfast.ops import OpSpec, load, loaded_from, registry
    registry.register(OpSpec({op!r}, ("test/tiny.cpp",), {ref!r}))
    if len(sys.argv) > 1:                      # barrier: start loading together
        print("ready", flush=True)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.01)
    t = time.monotonic()
    m = load({op!r})
    print(json.dumps({{"answer": m.answer(), "origin": loaded_from({op!r}), "s": time.monotonic() - t}}))
""").format(op=OP, ref=REF)


def child_env(tiny, **extra):
    env = dict(os.environ)
    env.update(DSFAST_CSRC_DIR=str(tiny.root), DSFAST_CACHE_DIR=str(tiny.cache),
               PYTHONPATH=os.pathsep.join([str(tiny.tmp), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def test_jit_build_then_cache_hit_without_rebuild(tiny, monkeypatch, capfd):
    mod = loader.load(OP)
    assert mod.answer() == tiny.value
    assert loader.loaded_from(OP) == "jit"
    assert "building op" in capfd.readouterr().err
    build_dir = jit.plan(tiny.spec).build_dir
    info = json.loads((build_dir / jit.MARKER).read_text())
    so = build_dir / info["file"]
    mtime = so.stat().st_mtime_ns
    # The flags torch actually used: optimised, OpenMP, never locked to the build machine's CPU.
    ninja = (build_dir / "build.ninja").read_text()
    assert "-O3" in ninja and "-fopenmp" in ninja and "-march" not in ninja

    # Same process, memory forgotten: imported from the cache, nothing compiled.
    reset_memory(monkeypatch)
    t = time.monotonic()
    assert loader.load(OP).answer() == tiny.value
    assert time.monotonic() - t < 2.0
    assert "building op" not in capfd.readouterr().err
    # A fresh process too.
    out = subprocess.run([sys.executable, "-c", SUBPROCESS_LOAD], env=child_env(tiny), capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["answer"] == tiny.value
    assert "building op" not in out.stderr
    assert so.stat().st_mtime_ns == mtime


def test_cache_is_keyed_by_source_content(tiny, monkeypatch):
    first = jit.plan(tiny.spec).build_dir
    assert loader.load(OP).answer() == tiny.value
    # A header under csrc/include changes: a new cache entry, a new binary, the new value.
    write_op(tiny.root, tiny.value + 1)
    reset_memory(monkeypatch)
    second = jit.plan(tiny.spec).build_dir
    assert second != first
    assert loader.load(OP).answer() == tiny.value + 1
    # The op's own source changes: again.
    write_op(tiny.root, tiny.value + 1, offset=10)
    reset_memory(monkeypatch)
    assert jit.plan(tiny.spec).build_dir not in (first, second)
    assert loader.load(OP).answer() == tiny.value + 11
    assert (first / jit.MARKER).exists()     # the old build stays valid for its own sources


def test_cache_is_keyed_by_headers_beside_the_sources(tiny, monkeypatch):
    # Kernels keep private headers next to their .cpp/.cu files (csrc/cpu/simd_*.h, csrc/cuda/*.cuh).
    (tiny.root / "test" / "private.h").write_text("#define PRIVATE 1\n")
    first = jit.plan(tiny.spec).build_dir
    (tiny.root / "test" / "private.h").write_text("#define PRIVATE 2\n")
    assert jit.plan(tiny.spec).build_dir != first
    second = jit.plan(tiny.spec).build_dir
    assert second != first
    (tiny.root / "test" / "notes.txt").write_text("not a header")   # not a build input
    assert jit.plan(tiny.spec).build_dir == second


def test_corrupt_cached_binary_is_rebuilt(tiny, monkeypatch):
    loader.load(OP)
    build_dir = jit.plan(tiny.spec).build_dir
    info = json.loads((build_dir / jit.MARKER).read_text())
    so = build_dir / info["file"]
    so.unlink()                        # a new inode: this process still maps the old one
    so.write_bytes(b"not an ELF file")
    reset_memory(monkeypatch)
    assert loader.load(OP).answer() == tiny.value


HOLD_LOCK = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    open(sys.argv[2], "w").close()          # torch's own baton file, as a killed torch build leaves it
    print("locked", flush=True)
    time.sleep(600)
""")


def test_lock_held_waits_bounded_then_stale_lock_of_killed_build_is_ignored(tiny, monkeypatch):
    build_dir = jit.plan(tiny.spec).build_dir
    build_dir.mkdir(parents=True)
    lock = build_dir / jit.LOCK
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock), str(build_dir / "lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        # A live holder: we wait at most DSFAST_BUILD_LOCK_TIMEOUT, then an error naming the lock file.
        monkeypatch.setenv("DSFAST_BUILD_LOCK_TIMEOUT", "1")
        t = time.monotonic()
        with pytest.raises(DsfastOpLockTimeout) as err:
            loader.load(OP)
        assert 0.9 < time.monotonic() - t < 10
        msg = str(err.value)
        assert str(lock) in msg and "DSFAST_BUILD_LOCK_TIMEOUT" in msg and OP in msg
    finally:
        holder.kill()         # SIGKILL: the build died mid-way and left both lock files behind
        holder.wait(timeout=TIMEOUT)
    assert lock.exists() and (build_dir / "lock").exists()
    # The flock died with its holder and torch's stale baton is cleared: the build proceeds.
    # (In a child with a timeout, so a regression to torch's wait-forever fails instead of hanging.)
    out = subprocess.run([sys.executable, "-c", SUBPROCESS_LOAD], env=child_env(tiny), capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["answer"] == tiny.value
    # In this process a lock timeout was not remembered as a failure: retrying now works.
    assert loader.load(OP).answer() == tiny.value


def test_two_processes_starting_together_build_once(tiny):
    go = tiny.tmp / "go"
    procs = [subprocess.Popen([sys.executable, "-c", SUBPROCESS_LOAD, str(go)], env=child_env(tiny),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        results = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        assert json.loads(out)["answer"] == tiny.value
    assert sum("building op" in err for _, err in results) == 1


def test_two_processes_with_a_broken_op_compile_it_once_and_both_explain(tiny):
    write_op(tiny.root, tiny.value, broken=True)
    go = tiny.tmp / "go"
    procs = [subprocess.Popen([sys.executable, "-c", SUBPROCESS_LOAD, str(go)], env=child_env(tiny),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        results = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, results):
        assert p.returncode != 0
        assert "DsfastOpError" in err and "this_is_not_cpp" in err
    # The second one reused the first one's fresh failure instead of compiling it again.
    assert sum("building op" in err for _, err in results) == 1


def test_build_failure_is_a_clear_error_at_first_use_and_every_use(tiny, monkeypatch):
    write_op(tiny.root, tiny.value, broken=True)
    with pytest.raises(DsfastOpError) as err:
        loader.load(OP)
    msg = str(err.value)
    assert f"op {OP!r} failed to build" in msg
    assert "this_is_not_cpp" in msg and "error" in msg   # the compiler's own complaint...
    assert "-isystem" not in msg                         # ...without its kilobytes of flags
    assert "DSFAST_REQUIRE_OPS=0" in msg and f"DSFAST_DISABLE_OPS={OP}" in msg
    log = jit.plan(tiny.spec).build_dir / jit.FAILED
    assert str(log) in msg and "this_is_not_cpp" in log.read_text()
    with pytest.raises(DsfastOpError, match="failed to build"):   # never an AttributeError later
        loader.load(OP)


def test_build_failure_falls_back_when_require_is_0(tiny, monkeypatch):
    write_op(tiny.root, tiny.value, broken=True)
    monkeypatch.setenv("DSFAST_REQUIRE_OPS", "0")
    with pytest.warns(DsfastOpWarning, match="this_is_not_cpp"):
        assert loader.load(OP).answer() == -1
    assert loader.loaded_from(OP) == "reference"


def test_missing_toolchain_falls_back_announced_once(tiny, monkeypatch):
    monkeypatch.setenv("CXX", str(tiny.tmp / "no-such-compiler"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert loader.load(OP).answer() == -1
        monkeypatch.setattr(loader, "_loaded", {})   # ask again without the module memo
        assert loader.load(OP).answer() == -1
    ours = [w for w in caught if issubclass(w.category, DsfastOpWarning)]
    assert len(ours) == 1
    msg = str(ours[0].message)
    assert OP in msg and REF in msg and "no C++ compiler" in msg
    assert "DSFAST_BUILD_OPS=1" in msg and "DSFAST_REQUIRE_OPS=1" in msg
    assert loader.loaded_from(OP) == "reference"
    assert not tiny.cache.exists()                        # nothing was built


def test_require_ops_turns_fallback_into_error(tiny, monkeypatch):
    monkeypatch.setenv("CXX", str(tiny.tmp / "no-such-compiler"))
    monkeypatch.setenv("DSFAST_REQUIRE_OPS", "1")
    with pytest.raises(DsfastOpError) as err:
        loader.load(OP)
    msg = str(err.value)
    assert OP in msg and "no C++ compiler" in msg and "DSFAST_REQUIRE_OPS=1" in msg


def test_invalid_require_value_is_rejected(tiny, monkeypatch):
    monkeypatch.setenv("DSFAST_REQUIRE_OPS", "maybe")
    with pytest.raises(ValueError, match="DSFAST_REQUIRE_OPS='maybe'"):
        loader.load(OP)


def test_disabled_op_uses_reference_without_building(tiny, monkeypatch):
    monkeypatch.setenv("DSFAST_DISABLE_OPS", f"other,{OP}")
    with pytest.warns(DsfastOpWarning, match="DSFAST_DISABLE_OPS"):
        assert loader.load(OP).answer() == -1
    assert not tiny.cache.exists()


def test_unknown_op_names_the_registered_ones(tiny):
    with pytest.raises(DsfastOpError, match=f"unknown dsfast op 'nope'.*{OP}"):
        loader.load("nope")


def test_cuda_op_states(tiny, monkeypatch):
    import torch
    monkeypatch.setattr(toolchain, "cpu_build_problem", lambda: None)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "no CUDA torch" in toolchain.cuda_problem()
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(toolchain, "nvcc_path", lambda: None)
    assert "no CUDA toolkit" in toolchain.cuda_problem()
    monkeypatch.setattr(toolchain, "nvcc_path", lambda: "/usr/bin/true")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no GPU visible" in toolchain.cuda_problem()
    # A CUDA op where CUDA is missing falls back with the reason, without trying to build.
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setitem(registry.OPS, OP, OpSpec(OP, ("test/tiny.cpp",), REF, with_cuda=True))
    with pytest.warns(DsfastOpWarning, match="no CUDA torch"):
        assert loader.load(OP).answer() == -1


def test_prebuilt_is_preferred_unless_built_for_another_torch(tiny, monkeypatch):
    import torch
    from dsfast.ops import prebuilt
    pkg = tiny.tmp / "fake_prebuilt_ops"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / f"{OP}.py").write_text("def answer():\n    return 'prebuilt'\n")
    monkeypatch.setattr(prebuilt, "PACKAGE", "fake_prebuilt_ops")
    monkeypatch.setattr(prebuilt, "_ops_dir", lambda: pkg)
    from dsfast.ops import cache_key
    digest = cache_key.sources_digest(tiny.spec, tiny.root)
    (pkg / prebuilt.INFO_FILE).write_text(json.dumps({"torch": torch.__version__, "sources": {OP: digest}}))
    assert loader.load(OP).answer() == "prebuilt"
    assert loader.loaded_from(OP) == "prebuilt"
    assert not tiny.cache.exists()
    # Built for another torch: skipped (it could crash); the JIT build takes over.
    (pkg / prebuilt.INFO_FILE).write_text(json.dumps({"torch": "1.0.0"}))
    reset_memory(monkeypatch)
    assert loader.load(OP).answer() == tiny.value
    assert loader.loaded_from(OP) == "jit"
    # Built from other sources (an editable checkout edited after its AOT build): skipped too.
    (pkg / prebuilt.INFO_FILE).write_text(json.dumps({"torch": torch.__version__, "sources": {OP: "0" * 64}}))
    reset_memory(monkeypatch)
    assert loader.load(OP).answer() == tiny.value
    assert loader.loaded_from(OP) == "jit"


def test_unwritable_cache_names_the_variable(tiny, monkeypatch):
    blocker = tiny.tmp / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DSFAST_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(DsfastOpError, match="cannot write its build cache.*DSFAST_CACHE_DIR"):
        loader.load(OP)


def test_import_dsfast_builds_and_imports_nothing(tmp_path):
    code = ("import sys, dsfast, dsfast.ops, dsfast.ops.registry; "
            "assert 'torch' not in sys.modules, 'dsfast.ops imported torch'")
    env = dict(os.environ, DSFAST_CACHE_DIR=str(tmp_path / "cache"), DSFAST_CSRC_DIR=str(tmp_path / "none"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "cache").exists()


def test_status_follows_the_op_through_its_states(tiny, monkeypatch):
    from dsfast.ops import status
    state, detail = status.op_status(tiny.spec)
    assert state == "buildable" and str(tiny.cache) in detail
    loader.load(OP)
    state, detail = status.op_status(tiny.spec)
    assert state == "cached" and "built in" in detail
    monkeypatch.setenv("CXX", str(tiny.tmp / "no-such-compiler"))
    write_op(tiny.root, tiny.value + 5)            # new sources, not in the cache, no compiler
    state, detail = status.op_status(tiny.spec)
    assert state == "unavailable" and "no C++ compiler" in detail
    monkeypatch.setenv("DSFAST_DISABLE_OPS", OP)
    assert status.op_status(tiny.spec)[0] == "disabled"


def test_cuda_home_sees_through_nvcc_wrappers_and_symlinks(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    kit = tmp_path / "cuda-99.0"
    (kit / "bin").mkdir(parents=True)
    (kit / "include").mkdir()
    (kit / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (kit / "bin" / "nvcc").chmod(0o755)
    (kit / "include" / "cuda_runtime.h").write_text("")
    # A symlink on PATH: torch's dirname(dirname(nvcc)) guess would be tmp/links, which has no headers.
    (tmp_path / "links" / "bin").mkdir(parents=True)
    (tmp_path / "links" / "bin" / "nvcc").symlink_to(kit / "bin" / "nvcc")
    monkeypatch.setenv("PATH", str(tmp_path / "links" / "bin"))
    assert toolchain.cuda_home() == str(kit)
    assert toolchain.nvcc_path() == str(kit / "bin" / "nvcc")
    # An explicit CUDA_HOME wins.
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "mine"))
    assert toolchain.cuda_home() == str(tmp_path / "mine")


def test_missing_sources_fall_back_with_the_reason(tiny, monkeypatch):
    (tiny.root / "test" / "tiny.cpp").unlink()
    with pytest.warns(DsfastOpWarning, match="source file.*missing.*tiny.cpp"):
        assert loader.load(OP).answer() == -1
    monkeypatch.setenv("DSFAST_CSRC_DIR", str(tiny.tmp / "nowhere"))
    reset_memory(monkeypatch)
    with pytest.raises(ValueError, match="DSFAST_CSRC_DIR"):
        loader.load(OP)


def test_ninja_from_the_pip_package_is_used_when_not_on_path(tiny, monkeypatch):
    ninja = pytest.importorskip("ninja")
    if not os.path.isfile(os.path.join(getattr(ninja, "BIN_DIR", ""), "ninja")):
        pytest.skip("the ninja package has no BIN_DIR binary")
    compiler = toolchain.cxx_path()
    bare = tiny.tmp / "bare-bin"          # PATH with the compiler but no ninja
    bare.mkdir()
    for tool in ("c++", "cc", "g++", "gcc", "ld", "as"):
        found = shutil.which(tool)
        if found:
            (bare / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.setenv("CXX", compiler)
    assert toolchain.ninja_path() is not None
    assert loader.load(OP).answer() == tiny.value
