"""Real local runs: gloo all_reduce over 2 and 4 ranks, env files, failing ranks, signals, no orphans."""
import os
import shutil
import signal
import sys
import time

import pytest

from launcher_util import (ALLREDUCE_WORKER, SLEEP_WORKER, cleanup, cpu_env, free_port, read_pids, results, run,
                           start, wait_gone)

TRICKY = """it's "quoted"; a  b $(echo PWNED) `id` & | > x"""


def dsfast_script():
    found = shutil.which("dsfast") or os.path.join(os.path.dirname(sys.executable), "dsfast")
    if not os.path.exists(found):
        pytest.skip("the `dsfast` console script is not installed (pip install -e .)")
    return found


def test_two_ranks_all_reduce_env_file_and_rank_logs(tmp_path):
    (tmp_path / "worker.py").write_text(ALLREDUCE_WORKER)
    (tmp_path / ".deepspeed_env").write_text(f"# propagated\nDS_TEST_MSG={TRICKY}\nDS_TEST_Q='  padded  '\n")
    port = free_port()
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "--num_procs", "2", "--master_port", str(port),
                        "--enable_each_rank_log", "logs", "worker.py", "--flag", "v w"], tmp_path, env=cpu_env())
    assert rc == 0, err
    res = results(out)
    assert sorted(res) == [0, 1]
    cores = len(os.sched_getaffinity(0))
    for r, rec in res.items():
        assert rec["world"] == 2 and rec["sum"] == 3.0
        assert rec["argv"] == [f"--local_rank={r}", "--flag", "v w"]
        assert rec["env"] == {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                              "OMP_NUM_THREADS": str(max(1, cores // 2)), "DS_TEST_MSG": TRICKY,
                              "DS_TEST_Q": "  padded  "}
        log = (tmp_path / "logs" / f"rank{r}.log").read_text()
        assert "RESULT " in log and f"[rank{r}]" not in log
    assert not (tmp_path / "x").exists()  # the value's `> x` was never run by a shell


def test_four_ranks_via_dsfast_script(tmp_path):
    (tmp_path / "worker.py").write_text(ALLREDUCE_WORKER)
    rc, out, err = run([dsfast_script(), "--num_procs=4", f"--master_port={free_port()}", "--no_local_rank",
                        "worker.py", "--", "--x"], tmp_path, env=cpu_env(OMP_NUM_THREADS="1"))
    assert rc == 0, err
    res = results(out)
    assert sorted(res) == [0, 1, 2, 3]
    for r, rec in res.items():
        assert rec["world"] == 4 and rec["sum"] == 10.0 and rec["argv"] == ["--", "--x"]
        assert rec["env"]["LOCAL_WORLD_SIZE"] == "4" and rec["env"]["OMP_NUM_THREADS"] == "1"


def test_failing_rank_stops_the_others_and_its_code_is_returned(tmp_path):
    (tmp_path / "w.py").write_text(SLEEP_WORKER)
    t0 = time.monotonic()
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "--num_procs", "3", "w.py"], tmp_path,
                       env=cpu_env(FAIL="1:3"), timeout=30)
    elapsed = time.monotonic() - t0
    pids = [int(p) for line in out.splitlines() if "PID " in line for p in line.split("PID ")[1].split()]
    assert rc == 3, err
    assert len(pids) == 6  # 3 ranks and a grandchild each
    assert elapsed < 10, f"took {elapsed:.1f}s"
    assert "rank 1 exited with code 3; stopping the other 2" in err
    assert wait_gone(pids, 5) == []


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_every_rank(tmp_path, sig, code):
    (tmp_path / "w.py").write_text(SLEEP_WORKER)
    proc, pids = start([sys.executable, "-m", "dsfast.launcher", "--num_procs", "2", "w.py"], tmp_path,
                       env=cpu_env()), []
    try:
        pids = read_pids(proc, 2)
        proc.send_signal(sig)
        assert proc.wait(timeout=15) == code
        assert wait_gone(pids, 5) == []
    finally:
        cleanup(proc, pids)


def test_sigkilled_launcher_leaves_no_rank_behind(tmp_path):
    (tmp_path / "w.py").write_text(SLEEP_WORKER)
    proc, pids = start([sys.executable, "-m", "dsfast.launcher", "--num_procs", "2", "w.py"], tmp_path,
                       env=cpu_env()), []
    try:
        pids = read_pids(proc, 2)
        proc.kill()
        proc.wait(timeout=10)
        ranks = pids[0::2]  # PDEATHSIG reaches the ranks themselves
        assert wait_gone(ranks, 5) == []
    finally:
        cleanup(proc, pids)


def test_module_launch_and_missing_script(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hello.py").write_text("import os, sys; print('HELLO', os.environ['RANK'], sys.argv[1:])\n")
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "-m", "pkg.hello", "a"], tmp_path, env=cpu_env())
    assert rc == 0, err
    assert "[rank0]: HELLO 0 ['--local_rank=0', 'a']" in out
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "nope.py"], tmp_path, env=cpu_env())
    assert rc == 2 and "user script 'nope.py' not found" in err


def test_bind_cores_and_stderr_prefix(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs at least 2 usable cores to give 2 ranks one each")
    (tmp_path / "aff.py").write_text(
        "import os, sys\n"
        "print('AFF', os.environ['RANK'], sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'])\n"
        "print('ERRLINE', os.environ['RANK'], file=sys.stderr)\n")
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "--num_procs", "2", "--bind_core_list",
                        f"{cores[0]},{cores[1]}", "aff.py"], tmp_path, env=cpu_env())
    assert rc == 0, err
    assert f"[rank0]: AFF 0 [{cores[0]}] 1" in out and f"[rank1]: AFF 1 [{cores[1]}] 1" in out
    assert "[rank0]: ERRLINE 0" in err and "[rank1]: ERRLINE 1" in err and "ERRLINE" not in out
