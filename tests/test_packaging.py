"""Installing dsfast: a plain `pip install .` (build isolation, no torch at build time) and the
ahead-of-time op build, each into a fresh venv that sees the running interpreter's torch, used from outside the repo.

The source tree is copied first so that the installs never write build/ into the shared checkout.
"""
import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsfast.ops.registry import OPS

REPO = Path(__file__).resolve().parent.parent
TREE = ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "CMakeLists.txt", "csrc", "dsfast")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", "build", "*.egg-info", "_ops")
TIMEOUT = 240

TINY_CPP = r"""
#include <Python.h>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define STR2(a) #a
#define STR(a) STR2(a)
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(7); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef def = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};
PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&def); }
"""


def copy_tree(dst):
    dst.mkdir()
    for name in TREE:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=IGNORE)
        elif src.exists():
            shutil.copy2(src, dst / name)
    (dst / "dsfast" / "_ops").mkdir()
    (dst / "dsfast" / "_ops" / "__init__.py").write_text("")
    return dst


def make_venv(path):
    """A fresh venv that sees the packages this interpreter sees (torch, pip, setuptools), wherever they live.

    `--system-site-packages` is not that: when this interpreter is itself a venv (a newcomer's), "system" is the
    base interpreter, which has no torch. So a .pth in the new venv adds this interpreter's own site directories
    (processing their .pth files, as its own start-up does), after the new venv's site-packages, so what is
    installed into the new venv wins. --without-pip: pip and setuptools come from this interpreter too (a bundled
    setuptools 65 would shadow them and lacks bdist_wheel for --no-build-isolation); it is also faster.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=TIMEOUT)
    python = path / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=path).strip()
    outer = [d for d in site_dirs() if Path(d).is_dir()]
    (Path(purelib) / "_dsfast_test_outer_site.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in outer) + "\n")
    return python


def site_dirs():
    """This interpreter's site directories: its own (a venv's, a conda env's or the global one) and the user's."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def run(cmd, cwd, env=None):
    out = subprocess.run([str(c) for c in cmd], cwd=str(cwd), env=env, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def clean_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSFAST_", "PYTHON"))}
    env.update(DSFAST_CACHE_DIR=str(tmp_path / "cache"), **extra)
    return env


INSPECT = textwrap.dedent("""
    import json, dsfast, torch
    from dsfast.ops import paths
    from dsfast.ops.registry import OPS
    root = paths.csrc_root()
    print(json.dumps({"dsfast": dsfast.__file__, "torch": torch.__file__, "csrc": str(root),
                      "missing": [s for spec in OPS.values() for s in spec.sources if not (root / s).is_file()],
                      "include": sorted(p.name for p in (root / "include" / "dsfast").iterdir())}))
""")


def test_plain_pip_install_ships_sources_and_imports_outside_the_repo(tmp_path):
    src = copy_tree(tmp_path / "src")
    python = make_venv(tmp_path / "venv")
    env = clean_env(tmp_path)
    # Build isolation on, torch absent from the isolated build env, no deps (torch comes from the system).
    run([python, "-m", "pip", "install", "-q", "--no-deps", src], cwd=tmp_path, env=env)
    info = json.loads(run([python, "-c", INSPECT], cwd=tmp_path, env=env))
    site = tmp_path / "venv" / "lib"
    assert Path(info["dsfast"]).is_relative_to(site), info          # the installed copy, not the repo
    import torch
    # the very torch this interpreter runs (a venv's own, not its base interpreter's, which may have none or another)
    assert Path(info["torch"]).resolve() == Path(torch.__file__).resolve(), info
    assert Path(info["csrc"]).is_relative_to(site) and info["csrc"].endswith("dsfast/csrc")
    assert info["missing"] == []
    expected = sorted(p.name for p in (REPO / "csrc" / "include" / "dsfast").iterdir())
    assert info["include"] == expected
    # The report runs from the installed package and finds every op's sources.
    report = run([python, "-m", "dsfast.report"], cwd=tmp_path, env=env)
    assert f"kernel sources        {info['csrc']}" in report
    for name in OPS:
        assert name in report
    assert "source file(s) missing" not in report


@pytest.mark.slow
def test_aot_build_installs_prebuilt_ops_used_without_jit(tmp_path):
    src = copy_tree(tmp_path / "src")
    # This tree's registry holds only a tiny op, so the ahead-of-time build takes seconds.
    (src / "csrc" / "test").mkdir()
    (src / "csrc" / "test" / "tiny.cpp").write_text(TINY_CPP)
    (src / "dsfast" / "ops" / "registry.py").write_text(textwrap.dedent("""
        from .spec import OpSpec
        OPS = {}
        def register(spec):
            OPS[spec.name] = spec
            return spec
        register(OpSpec(name="tiny", sources=("test/tiny.cpp",), reference="json"))
    """))
    python = make_venv(tmp_path / "venv")
    env = clean_env(tmp_path, DSFAST_BUILD_OPS="1", DSFAST_REQUIRE_OPS="1")
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", src], cwd=tmp_path, env=env)
    code = ("import json, torch; from dsfast.ops import load, loaded_from, prebuilt; m = load('tiny'); "
            "print(json.dumps([m.answer(), loaded_from('tiny'), m.__name__, prebuilt.build_info()]))")
    answer, origin, module_name, info = json.loads(run([python, "-c", code], cwd=tmp_path, env=env))
    import torch
    assert (answer, origin, module_name) == (7, "prebuilt", "dsfast._ops.tiny")
    assert info["torch"] == torch.__version__ and info["ops"] == ["tiny"] and len(info["sources"]["tiny"]) == 64
    assert not (tmp_path / "cache").exists()            # nothing was JIT-built
    report = run([python, "-m", "dsfast.report"], cwd=tmp_path, env=env)
    assert any(ln.split()[:2] == ["tiny", "prebuilt"] for ln in report.splitlines())


def run_setup(tmp_path, build_ops, hide_torch=False):
    """Run this repo's setup.py (`--name`, writes nothing) the way pip would, with DSFAST_BUILD_OPS set."""
    lines = ["import runpy, sys",
             "sys.modules['torch'] = None" if hide_torch else "",       # `import torch` now fails
             "sys.argv = ['setup.py', '--name']",
             f"runpy.run_path({str(REPO / 'setup.py')!r}, run_name='__main__')"]
    return subprocess.run([sys.executable, "-c", "\n".join(lines)], cwd=str(REPO),
                          env=clean_env(tmp_path, DSFAST_BUILD_OPS=build_ops),
                          capture_output=True, text=True, timeout=TIMEOUT)


def test_aot_build_without_torch_says_how(tmp_path):
    out = run_setup(tmp_path, "1", hide_torch=True)
    assert out.returncode != 0
    assert "needs torch importable" in out.stderr and "--no-build-isolation" in out.stderr


def test_aot_build_of_an_unknown_op_lists_the_known_ones(tmp_path):
    out = run_setup(tmp_path, "no_such_op")
    assert out.returncode != 0
    assert "unknown op(s) ['no_such_op']" in out.stderr
    for name in OPS:
        assert name in out.stderr
