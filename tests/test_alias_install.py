"""`dsfast alias install | remove | status` (dsfast/alias_install.py): `deepspeed` made dsfast in an environment, with
the package metadata Lightning and accelerate look for, refused where a real DeepSpeed is, and fully reversible.

The environment case runs in a fresh virtualenv (made without pip, in seconds); it sees this checkout's dsfast and
the test environment's packages (torch, accelerate) through PYTHONPATH, and gets the alias in its own site-packages.
"""
import importlib.util
import os
import subprocess
import sys
import sysconfig

import pytest

from dsfast import alias_install
from dsfast.alias_install import VERSION, AliasError, install, remove, status

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = """
import importlib.metadata as md, json, sys
out = {}
try:
    out["version"] = md.version("deepspeed")
except md.PackageNotFoundError:
    out["version"] = None
try:
    from accelerate.utils import is_deepspeed_available
    out["accelerate"] = is_deepspeed_available()
except ImportError:
    out["accelerate"] = "not installed"
if out["version"]:
    import deepspeed, dsfast
    from deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME
    out["is_dsfast"] = deepspeed is dsfast
print(json.dumps(out))
"""


def _venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, sysconfig.get_paths()["purelib"]])}
    return python, site, env


def _run(python, env, *args):
    return subprocess.run([str(python), *args], capture_output=True, text=True, env=env, timeout=180)


def _listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_install_and_remove_in_a_fresh_virtualenv(tmp_path):
    import json
    python, site, env = _venv(tmp_path)
    venv_before = _listing(tmp_path / "venv")
    r = _run(python, env, "-c", CHECK)
    assert json.loads(r.stdout)["version"] is None, r.stderr
    r = _run(python, env, "-m", "dsfast.launcher", "alias", "install")
    assert r.returncode == 0 and f"deepspeed version {VERSION}" in r.stdout, r.stderr
    r = _run(python, env, "-c", CHECK)
    got = json.loads(r.stdout)
    assert got["version"] == VERSION and VERSION.startswith("0.19.8+dsfast.") and got["is_dsfast"], (got, r.stderr)
    if importlib.util.find_spec("accelerate") is not None:
        assert got["accelerate"] is True
    script = tmp_path / "venv" / "bin" / "deepspeed"            # DeepSpeed's command name: the dsfast launcher
    r = subprocess.run([str(script), "--num_procs", "2", "--dry_run", "train.py"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and '"world_size": 2' in r.stdout, r.stderr
    assert "installed:" in _run(python, env, "-m", "dsfast.launcher", "alias", "status").stdout
    r = _run(python, env, "-m", "dsfast.launcher", "alias", "remove")
    assert r.returncode == 0 and "removed" in r.stdout, r.stderr
    got = json.loads(_run(python, env, "-c", CHECK).stdout)
    assert got["version"] is None and got["accelerate"] in (False, None, "not installed")   # falsy: not found
    assert _listing(tmp_path / "venv") == venv_before            # nothing left behind
    r = _run(python, env, "-m", "dsfast.launcher", "alias", "remove")
    assert r.returncode == 0 and "nothing to remove" in r.stdout


def _fake_real_deepspeed(site, installer="pip"):
    info = os.path.join(site, "deepspeed-0.19.8.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n")
    with open(os.path.join(info, "INSTALLER"), "w") as f:
        f.write(installer + "\n")
    os.makedirs(os.path.join(site, "deepspeed"))
    with open(os.path.join(site, "deepspeed", "__init__.py"), "w") as f:
        f.write("REAL = True\n")


def test_refused_where_a_real_deepspeed_is_installed_and_it_is_left_alone(tmp_path):
    python, site, env = _venv(tmp_path)
    _fake_real_deepspeed(site)
    before = _listing(site)
    r = _run(python, env, "-m", "dsfast.launcher", "alias", "install")
    assert r.returncode == 2 and "DeepSpeed 0.19.8 is installed" in r.stderr and "pip uninstall deepspeed" in \
        r.stderr, r.stderr
    r = _run(python, env, "-m", "dsfast.launcher", "alias", "remove")
    assert r.returncode == 2 and "was not written by `dsfast alias install`" in r.stderr, r.stderr
    assert _listing(site) == before and not (tmp_path / "venv" / "bin" / "deepspeed").exists()


def test_target_directory_install_replaces_an_older_alias_and_removes_cleanly(tmp_path):
    target = tmp_path / "t"
    old = target / "deepspeed-0.19.8+dsfast.0.0.1.dist-info"
    old.mkdir(parents=True)
    (old / "INSTALLER").write_text(alias_install.INSTALLER + "\n")
    (old / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8+dsfast.0.0.1\n")
    (old / "RECORD").write_text("deepspeed-0.19.8+dsfast.0.0.1.dist-info/METADATA,,\n"
                                "deepspeed-0.19.8+dsfast.0.0.1.dist-info/INSTALLER,,\n"
                                "deepspeed-0.19.8+dsfast.0.0.1.dist-info/RECORD,,\n")
    written = install(str(target))
    assert not old.exists() and all(str(target) in p for p in written)      # no script with --target
    assert sorted(os.listdir(target)) == sorted(["deepspeed", alias_install.DIST_INFO])
    r = subprocess.run([sys.executable, "-c", "import importlib.metadata as m, deepspeed, dsfast; "
                        "print(m.version('deepspeed'), deepspeed is dsfast)"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(target), REPO])}, timeout=120)
    assert r.stdout.split() == [VERSION, "True"], r.stderr
    assert "installed:" in status(str(target))
    assert len(remove(str(target))) == 5 and os.listdir(target) == []     # 4 files + RECORD
    assert status(str(target)).startswith("not installed in")


def test_refused_when_a_deepspeed_module_is_importable_elsewhere(tmp_path, monkeypatch):
    other = tmp_path / "other"
    (other / "deepspeed").mkdir(parents=True)
    (other / "deepspeed" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(other))
    with pytest.raises(AliasError, match=r"a `deepspeed` module is importable from .*other"):
        install(str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_refused_over_a_deepspeed_command_it_did_not_write(tmp_path, monkeypatch):
    monkeypatch.setattr(alias_install, "default_target", lambda: str(tmp_path / "site"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "deepspeed").write_text("#!/bin/sh\n")
    with pytest.raises(AliasError, match=r"bin/deepspeed exists and was not written by dsfast"):
        install(script_dir=str(tmp_path / "bin"))


def test_an_unwritable_environment_says_what_to_do(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(alias_install.os, "makedirs", refuse)
    with pytest.raises(AliasError, match=r"cannot write into .*Permission denied.*virtualenv, or with --target"):
        install(str(tmp_path / "t"))


def test_pip_uninstall_removes_it_too(tmp_path):
    # the RECORD lists every file the alias wrote, so pip can take it away as any distribution
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": REPO}
    r = _run(venv / "bin" / "python", env, "-m", "dsfast.launcher", "alias", "install")
    assert r.returncode == 0, r.stderr
    r = _run(venv / "bin" / "python", env, "-m", "pip", "uninstall", "-y", "deepspeed")
    assert r.returncode == 0 and f"Successfully uninstalled deepspeed-{VERSION}" in r.stdout, r.stdout + r.stderr
    assert not [p for p in _listing(venv) if "deepspeed" in p.lower()]


def test_lightning_s_deepspeed_strategy_accepts_the_alias(tmp_path):
    # Lightning is not a test dependency: this runs where it is installed (checked with lightning 2.6.6; its
    # training itself needs CUDA GPUs, as with DeepSpeed). Without the alias its constructor refuses.
    pytest.importorskip("lightning")
    code = ("import logging, deepspeed\n"
            "from lightning.pytorch.strategies import DeepSpeedStrategy\n"
            "DeepSpeedStrategy(stage=3, logging_level=logging.ERROR)\n"
            "print(deepspeed.__name__, deepspeed.utils.logging.logger.level)\n")
    install(str(tmp_path / "alias"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "alias"), REPO])})
    assert r.returncode == 0 and r.stdout.split() == ["dsfast", "40"], r.stderr[-3000:]


def test_a_target_that_is_a_file_and_a_bad_action_are_errors(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert alias_install.main(["install", "--target", str(tmp_path / "file")]) == 2
    assert "dsfast alias: error: cannot write into" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        alias_install.main(["instal"])
    assert info.value.code == 2 and "invalid choice: 'instal'" in capsys.readouterr().err
