"""`import deepspeed` pointed at dsfast (sys.modules alias, a symlink, a shim package) loads each dsfast module once:
deepspeed.X.Y is dsfast.X.Y itself, not a second copy of its file (dsfast/_alias.py). Each case runs in a fresh
interpreter."""
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, tmp_path, path=()):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), REPO])}
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


CHECKS = """
    import dsfast, dsfast.optim, dsfast.zero
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    import deepspeed.runtime.zero.partition_parameters as pp
    from deepspeed.zero import GatheredParameters
    import deepspeed.utils.zero_to_fp32
    assert DeepSpeedCPUAdam is dsfast.optim.CPUAdam
    assert pp.ZeroParamStatus is dsfast.zero.ZeroParamStatus and GatheredParameters is dsfast.zero.GatheredParameters
    assert pp.__name__ == pp.__spec__.name == "dsfast.runtime.zero.partition_parameters", pp.__spec__
    assert sys.modules["deepspeed.ops.adam"] is sys.modules["dsfast.ops.adam"]
    copies = [m for m, mod in sys.modules.items() if m.startswith("deepspeed.") and mod.__name__ != "dsfast." + m[10:]]
    assert not copies, copies
    if deepspeed is not dsfast:   # a shim package: its own ModuleNotFoundError
        print("ALIAS OK")
        raise SystemExit
    try:
        import deepspeed.elasticity
    except ModuleNotFoundError as e:
        assert e.name == "deepspeed.elasticity" and "dsfast has no 'dsfast.elasticity' (elastic training" in str(e), e
    else:
        raise AssertionError("deepspeed.elasticity imported")
    print("ALIAS OK")
"""


def test_a_sys_modules_alias_gives_dsfast_s_own_modules(tmp_path):
    r = _run("import sys, dsfast\nsys.modules['deepspeed'] = dsfast\nimport deepspeed\n" + textwrap.dedent(CHECKS),
             tmp_path)
    assert r.returncode == 0 and "ALIAS OK" in r.stdout, r.stderr


def test_a_deepspeed_symlink_to_the_package_is_dsfast(tmp_path):
    (tmp_path / "links").mkdir()
    os.symlink(os.path.join(REPO, "dsfast"), tmp_path / "links" / "deepspeed")
    r = _run("import sys, deepspeed, dsfast\nassert deepspeed is dsfast\n" + textwrap.dedent(CHECKS), tmp_path,
             path=[tmp_path / "links"])
    assert r.returncode == 0 and "ALIAS OK" in r.stdout, r.stderr


def test_the_test_shim_package_maps_the_rest_too(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "tests", "distributed"))
    try:
        from deepspeed_shim import make_deepspeed_shim
    finally:
        sys.path.pop(0)
    shim = make_deepspeed_shim(tmp_path / "shim")
    r = _run("import sys, deepspeed\n" + textwrap.dedent(CHECKS), tmp_path, path=[shim])
    assert r.returncode == 0 and "ALIAS OK" in r.stdout, r.stderr


@pytest.mark.parametrize("with_dsfast", [False, True])
def test_a_real_deepspeed_package_is_left_alone(tmp_path, with_dsfast):
    pkg = tmp_path / "pkgs" / "deepspeed"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("REAL = True\n")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "adam.py").write_text("WHO = 'real deepspeed'\n")
    r = _run(("import dsfast\n" if with_dsfast else "") + "import deepspeed\nfrom deepspeed.ops import adam\n"
             "assert deepspeed.REAL and adam.WHO == 'real deepspeed' and adam.__file__.startswith(%r)\n"
             "print('REAL OK')\n" % str(pkg), tmp_path, path=[tmp_path / "pkgs"])
    assert r.returncode == 0 and "REAL OK" in r.stdout, r.stderr
