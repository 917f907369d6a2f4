"""Swap-file ownership (zero/nvme/files.py) and the start checks (zero/nvme/checks.py): each job and rank writes
only under its own directory, which goes when the job ends (normally or by an exception); a SIGKILLed job's
directory is removed by the next start, never while its owner lives; a bad nvme_path or too little host memory is
refused with the numbers and what to change."""
import os
import signal
import subprocess
import sys

import pytest

from dsfast.zero.nvme.checks import check_host_memory, check_nvme_path
from dsfast.zero.nvme.files import LOCK_SUFFIX, SWAP_ROOT, SwapDir
from _nvme_helpers import mounted_tmpfs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _owner(nvme_path, then):
    """A child process that owns a SwapDir with one file, prints its path, then runs `then`."""
    code = ("import sys, time; from dsfast.zero.nvme.files import SwapDir\n"
            f"d = SwapDir({str(nvme_path)!r}, rank=1); open(d.file('unit0.swap'), 'w').write('x')\n"
            "print(d.path, flush=True)\n" + then)
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def test_two_owners_get_their_own_directories_removed_on_close(tmp_path):
    a, b = SwapDir(tmp_path, rank=0), SwapDir(tmp_path, rank=0)
    assert a.path != b.path and os.path.dirname(a.path) == str(tmp_path / SWAP_ROOT)
    open(a.file("unit0.swap"), "w").write("a")
    open(b.file("unit0.swap"), "w").write("b")
    assert open(a.file("unit0.swap")).read() == "a"
    with pytest.raises(ValueError, match="plain file name"):
        a.file("../b")
    a.close()
    a.close()   # idempotent
    assert not os.path.exists(a.path) and not os.path.exists(a.path + LOCK_SUFFIX)
    assert os.path.exists(b.file("unit0.swap"))
    with b:
        pass
    assert os.listdir(tmp_path / SWAP_ROOT) == []


@pytest.mark.parametrize("end", ["sys.exit(0)", "raise RuntimeError('boom')"], ids=["normal", "exception"])
def test_a_job_leaves_no_files_behind(tmp_path, end):
    p = _owner(tmp_path, end)
    out, err = p.communicate(timeout=60)
    assert os.path.isabs(out.strip()) and ("boom" in err) == ("boom" in end)
    assert os.listdir(tmp_path / SWAP_ROOT) == []


def test_a_killed_jobs_files_go_at_the_next_start_never_a_living_ones(tmp_path):
    killed = _owner(tmp_path, "time.sleep(60)")
    living = _owner(tmp_path, "time.sleep(60)")
    try:
        dead_dir, live_dir = killed.stdout.readline().strip(), living.stdout.readline().strip()
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        assert os.path.exists(os.path.join(dead_dir, "unit0.swap"))   # SIGKILL ran no clean-up
        mine = SwapDir(tmp_path)
        assert mine.removed_stale == [os.path.basename(dead_dir)]
        assert not os.path.exists(dead_dir) and not os.path.exists(dead_dir + LOCK_SUFFIX)
        assert os.path.exists(os.path.join(live_dir, "unit0.swap"))   # its owner lives: untouched
        mine.close()
    finally:
        living.kill()
        living.wait(timeout=30)
    SwapDir(tmp_path).close()   # the second owner, killed too, is stale now
    assert os.listdir(tmp_path / SWAP_ROOT) == []


def test_nvme_path_checks_name_the_path_and_the_bytes(tmp_path):
    with pytest.raises(ValueError, match=r"offload_optimizer.nvme_path='.*nope' does not exist"):
        check_nvme_path(str(tmp_path / "nope"), 1)
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="is not a directory"):
        check_nvme_path(str(tmp_path / "f"), 1)
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    with pytest.raises(ValueError, match=rf"offload_param.nvme_path='{tmp_path}' has \d+ bytes .* free but the "
                                         rf"swap files need {free * 4} bytes"):
        check_nvme_path(str(tmp_path), free * 4, key="offload_param.nvme_path")
    assert check_nvme_path(str(tmp_path), 1) > 0


def test_a_read_only_nvme_path_is_refused(tmp_path):
    with mounted_tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        with pytest.raises(ValueError, match=r"nvme_path='.*ro' is not writable by this process \(Read-only"):
            check_nvme_path(str(ro), 1)


def test_host_memory_checks_say_how_much_and_what_to_lower():
    check_host_memory(10, pinned_bytes=10, shm_bytes=10, available=100, memlock=100, shm_free=100)
    with pytest.raises(ValueError, match=r"need 200 bytes .* only 100 bytes .* lower offload_param.max_in_cpu"):
        check_host_memory(200, available=100, lower="offload_param.max_in_cpu")
    with pytest.raises(ValueError, match=r"pinning 50 bytes .* exceeds `ulimit -l` \(40 bytes.*buffer_count.*"
                                         "pin_memory to false"):
        check_host_memory(50, pinned_bytes=50, available=100, memlock=40)
    with pytest.raises(ValueError, match=r"/dev/shm needs 30 bytes .* has 20 bytes"):
        check_host_memory(1, shm_bytes=30, available=100, shm_free=20)
    check_host_memory(1)   # the machine's own figures: one byte fits
