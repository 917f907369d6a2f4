"""Two "nodes" on one machine (127.0.0.1 and 127.0.0.2) behind a private sshd started by the test.

The sshd gets its own host key, authorized_keys and config in a temp dir (root login by key only), listens on a
free loopback port, runs as `sshd -f cfg -D -e` and is stopped at the end. Every runner reaches it through an ssh
client config passed with --launcher_args / plm_rsh_args / PDSH_SSH_ARGS_APPEND; nothing in ~/.ssh is touched.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from launcher_util import (ALLREDUCE_WORKER, SLEEP_WORKER, cleanup, cpu_env, free_port, read_pids, results, run,
                           start, wait_gone)

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
HOSTFILE = "127.0.0.1 slots=1\n127.0.0.2 slots=2\n"  # node 1 holds ranks 1 and 2 (local ranks 0 and 1)
MSG = """two words; "quoted" 'single' $(echo PWNED)"""


def _loopback_alias_works():
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    missing = [t for t, p in (("sshd (openssh-server)", SSHD), ("ssh", shutil.which("ssh")),
                              ("ssh-keygen", shutil.which("ssh-keygen"))) if p is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install openssh-server openssh-client)")
    if not _loopback_alias_works():
        pytest.skip("127.0.0.2 is not usable as a second loopback address here")
    d = tmp_path_factory.mktemp("sshd")
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True, timeout=30)
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    os.chmod(d / "authorized_keys", 0o600)
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\nHostKey {d}/host_key\n"
        f"PidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "StrictModes no\n")
    client_cfg = d / "ssh_config"
    client_cfg.write_text(
        f"Host *\n  Port {port}\n  IdentityFile {d}/client_key\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
        "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n")
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen([SSHD, "-f", str(d / "sshd_config"), "-D", "-e"], stdout=log, stderr=log,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while True:
            ok = subprocess.run(["ssh", "-F", str(client_cfg), "127.0.0.2", "true"], capture_output=True,
                                timeout=15).returncode == 0
            if ok:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"the test sshd did not come up: {(d / 'sshd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield client_cfg
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture
def job(tmp_path):
    (tmp_path / "hf").write_text(HOSTFILE)
    (tmp_path / "worker.py").write_text(ALLREDUCE_WORKER)
    (tmp_path / "sleep.py").write_text(SLEEP_WORKER)
    (tmp_path / ".deepspeed_env").write_text(f"DS_TEST_MSG={MSG}\n")
    return tmp_path


def check_three_ranks(out, port):
    res = results(out)
    assert sorted(res) == [0, 1, 2], out
    local = {0: 0, 1: 0, 2: 1}
    for r, rec in res.items():
        assert rec["world"] == 3 and rec["sum"] == 6.0
        assert rec["argv"] == [f"--local_rank={local[r]}", "--v"]
        env = rec["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(r), str(local[r]), "3")
        assert env["LOCAL_WORLD_SIZE"] == ("1" if r == 0 else "2")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(port))
        assert env["DS_TEST_MSG"] == MSG


def test_ssh_two_nodes(sshd, job):
    port = free_port()
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "-H", "hf", "--master_port", str(port),
                        "--launcher_args", f"-F {sshd}", "worker.py", "--v"], job, env=cpu_env(), timeout=60)
    assert rc == 0, err
    check_three_ranks(out, port)


def test_openmpi_two_nodes(sshd, job):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    if "Open MPI" not in subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                                        timeout=30).stdout:
        pytest.skip("the mpirun on PATH is not Open MPI")
    port = free_port()
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "-H", "hf", "--launcher", "openmpi",
                        "--master_port", str(port), "--launcher_args", f"--mca plm_rsh_args '-F {sshd}'",
                        "worker.py", "--v"], job, env=cpu_env(), timeout=60)
    assert rc == 0, err
    check_three_ranks(out, port)


def test_pdsh_two_nodes(sshd, job):
    if shutil.which("pdsh") is None:
        pytest.skip("pdsh not installed (apt-get install pdsh)")
    port = free_port()
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "-H", "hf", "--launcher", "pdsh",
                        "--master_port", str(port), "worker.py", "--v"], job,
                       env=cpu_env(PDSH_SSH_ARGS_APPEND=f"-F {sshd}"), timeout=60)
    assert rc == 0, err
    check_three_ranks(out, port)


def runner_args(launcher, sshd):
    """(extra dsfast options, extra environment) to reach the test sshd with each runner."""
    tool = {"ssh": "ssh", "pdsh": "pdsh", "openmpi": "mpirun"}[launcher]
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed")
    if launcher == "ssh":
        return ["--launcher_args", f"-F {sshd}"], {}
    if launcher == "pdsh":
        return ["--launcher", "pdsh"], {"PDSH_SSH_ARGS_APPEND": f"-F {sshd}"}
    return ["--launcher", "openmpi", "--launcher_args", f"--mca plm_rsh_args '-F {sshd}'"], {}


@pytest.mark.parametrize("launcher", ["ssh", "pdsh", "openmpi"])
def test_failing_rank_on_one_node_stops_all_nodes(sshd, job, launcher):
    opts, extra_env = runner_args(launcher, sshd)
    (job / ".dsfast_env").write_text("FAIL=2:3\nFAIL_AFTER=1.5\n")  # reaches remote ranks only via the env file
    t0 = time.monotonic()
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "-H", "hf"] + opts + ["sleep.py"], job,
                       env=cpu_env(**extra_env), timeout=40)
    elapsed = time.monotonic() - t0
    assert rc == 3, err
    assert elapsed < 20, f"took {elapsed:.1f}s"
    pids = [int(p) for line in out.splitlines() if "PID " in line for p in line.split("PID ")[1].split()]
    assert len(pids) == 6 and wait_gone(pids, 8) == []
    assert "rank 2 exited with code 3" in err


def test_ssh_sigterm_stops_every_node(sshd, job):
    proc, pids = start([sys.executable, "-m", "dsfast.launcher", "-H", "hf", "--launcher_args", f"-F {sshd}",
                        "sleep.py"], job, env=cpu_env()), []
    try:
        pids = read_pids(proc, 3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
        assert wait_gone(pids, 8) == []
    finally:
        cleanup(proc, pids)


def test_ssh_unreachable_node_is_reported(job):
    if shutil.which("ssh") is None:
        pytest.skip("ssh not installed")
    closed = free_port()  # nothing listens there: ssh fails at once with 255
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "-H", "hf", "--ssh_port", str(closed),
                        "--launcher_args", "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                        "sleep.py"], job, env=cpu_env(), timeout=40)
    assert rc == 255
    assert "exited with code 255; ssh could not connect or authenticate" in err
