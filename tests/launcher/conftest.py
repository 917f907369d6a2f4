"""Launcher test isolation: a per-test time limit, no real /job/hostfile, no GPUs, no stray env files."""
import signal

import pytest

TEST_TIME_LIMIT_S = 90


@pytest.fixture(autouse=True)
def _time_limit():
    def expired(signum, frame):
        raise TimeoutError(f"launcher test exceeded {TEST_TIME_LIMIT_S}s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_TIME_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DS_ENV_FILE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("dsfast.launcher.cli.DEFAULT_HOSTFILE", str(tmp_path / "no-default-hostfile"))
    monkeypatch.setattr("dsfast.launcher.devices.physical_gpu_count", lambda: 0)
    yield
