"""--include / --exclude / --num_nodes / --num_gpus: every accepted and rejected form, as functions and via CLI."""
import os
import socket
import subprocess
import sys
from collections import OrderedDict

import pytest

from dsfast.launcher.errors import LaunchError
from dsfast.launcher.selection import parse_node_spec, select_resources
from dsfast.launcher.this_machine import is_this_machine
from launcher_util import dry

HOSTS = OrderedDict([("worker-0", 4), ("worker-1", 4), ("worker-2", 2), ("worker-3", 2)])
HOSTFILE = "".join(f"{h} slots={n}\n" for h, n in HOSTS.items())


def sel(**kw):
    return {h: s for h, s in select_resources(HOSTS, **kw).items()}


@pytest.mark.parametrize("spec, expected", [
    ("worker-1", {"worker-1": None}),
    ("worker-2:0,1@worker-3", {"worker-2": [0, 1], "worker-3": None}),
    ("worker-0:3,1,1", {"worker-0": [1, 3]}),                       # repeated slots are fine, sorted
    ("worker-0:1@worker-0:0", {"worker-0": [0, 1]}),                # same host twice: union
    ("worker-0@worker-0:1", {"worker-0": None}),                    # all slots wins
    (" worker-0 : 2 ", {"worker-0": [2]}),
])
def test_parse_node_spec(spec, expected):
    assert dict(parse_node_spec(spec, "--include")) == expected


@pytest.mark.parametrize("kw, expected", [
    (dict(), {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [0, 1], "worker-3": [0, 1]}),
    (dict(include="worker-2:0,1"), {"worker-2": [0, 1]}),
    (dict(include="worker-3@worker-0:2"), {"worker-0": [2], "worker-3": [0, 1]}),  # hostfile order, not spec order
    (dict(include="worker-1:1,1,0"), {"worker-1": [0, 1]}),
    (dict(exclude="worker-2:0@worker-3:0,1"),
     {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [1]}),
    (dict(exclude="worker-0@worker-1:3"), {"worker-1": [0, 1, 2], "worker-2": [0, 1], "worker-3": [0, 1]}),
    (dict(num_nodes=2), {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}),
    (dict(num_gpus=2), {h: [0, 1] for h in HOSTS}),
    (dict(num_nodes=1, num_gpus=3), {"worker-0": [0, 1, 2]}),
])
def test_select_accepted(kw, expected):
    got = select_resources(HOSTS, **kw)
    assert dict(got) == expected and list(got) == list(expected)


@pytest.mark.parametrize("kw, needle", [
    (dict(include="worker-0", exclude="worker-1"), "--include and --exclude are mutually exclusive"),
    (dict(include="worker-0", num_nodes=1), "--include cannot be combined with --num_nodes"),
    (dict(include="worker-0", num_gpus=1), "--include cannot be combined with --num_gpus"),
    (dict(exclude="worker-0", num_nodes=1), "--exclude cannot be combined with --num_nodes"),
    (dict(exclude="worker-0", num_gpus=2), "--exclude cannot be combined with --num_gpus"),
    (dict(include="worker-9"), "--include names host 'worker-9', which is not in"),
    (dict(exclude="worker-9:0"), "--exclude names host 'worker-9'"),
    (dict(include="worker-2:2"), "--include names slot 2 of host 'worker-2', which has slots 0..1"),
    (dict(exclude="worker-0:4"), "--exclude names slot 4 of host 'worker-0'"),
    (dict(include="worker-0:x"), "slot 'x' of host 'worker-0' is not a non-negative integer"),
    (dict(include="worker-0:-1"), "slot '-1'"),
    (dict(include="worker-0:"), "slot ''"),
    (dict(include="worker-0:0,,1"), "slot ''"),
    (dict(include="@worker-0"), "empty host name"),
    (dict(include="worker-0@"), "empty host name"),
    (dict(include=":0"), "empty host name"),
    (dict(include=""), "--include is empty"),
    (dict(exclude="worker-0@worker-1@worker-2@worker-3"), "leaves no slots"),
    (dict(num_nodes=5), "--num_nodes 5 but the hostfile has only 4 host(s)"),
    (dict(num_nodes=0), "--num_nodes must be a positive integer"),
    (dict(num_gpus=3), "fewer slots in the hostfile: worker-2 (2), worker-3 (2)"),
    (dict(num_gpus=0), "--num_gpus/--num_procs must be a positive integer"),
])
def test_select_rejected(kw, needle):
    with pytest.raises(LaunchError) as e:
        select_resources(HOSTS, **kw)
    assert needle in str(e.value)


@pytest.mark.parametrize("argv, needle", [
    (["-i", "worker-0", "-e", "worker-1"], "mutually exclusive"),
    (["--include", "worker-0", "--num_nodes", "1"], "cannot be combined with --num_nodes"),
    (["--exclude", "worker-0:1", "--num_gpus", "1"], "cannot be combined with --num_gpus"),
    (["--include", "worker-0", "--num_procs", "1"], "cannot be combined with --num_gpus"),
    (["-i", "worker-7"], "host 'worker-7', which is not in hostfile"),
    (["-e", "worker-3:5"], "slot 5 of host 'worker-3'"),
    (["-i", "worker-0:a"], "slot 'a'"),
    (["--num_nodes", "9"], "--num_nodes 9"),
])
def test_rejected_via_dry_run_exit_2(tmp_path, capsys, argv, needle):
    (tmp_path / "hf").write_text(HOSTFILE)
    rc, plan, err = dry(["-H", "hf"] + argv + ["train.py"], capsys)
    assert rc == 2 and plan is None and err.startswith("dsfast: error: ") and needle in err


def test_seed_command_lines_via_dry_run(tmp_path, capsys):
    """The forms from the user seeds: hostfile order decides ranks, filters keep it."""
    (tmp_path / "hf").write_text(HOSTFILE)
    rc, plan, _ = dry(["-H", "hf", '--exclude=worker-2:0@worker-3:0,1', "train.py", "--deepspeed"], capsys)
    assert rc == 0
    assert plan["hosts"] == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [1]}
    assert list(plan["hosts"]) == ["worker-0", "worker-1", "worker-2"] and plan["world_size"] == 9
    rc, plan, _ = dry(["-H", "hf", "--include=worker-2:0,1", "train.py"], capsys)
    assert plan["hosts"] == {"worker-2": [0, 1]} and plan["launcher"] == "local" and plan["world_size"] == 2
    rc, plan, _ = dry(["-H", "hf", "--num_nodes=2", "train.py"], capsys)
    assert list(plan["hosts"]) == ["worker-0", "worker-1"] and plan["launcher"] == "ssh"
    assert plan["master_addr"] == "worker-0"


def test_filters_apply_to_this_machine_without_hostfile(capsys, monkeypatch):
    rc, plan, _ = dry(["--num_procs", "2", "train.py"], capsys)
    assert plan["hosts"] == {"localhost": [0, 1]}
    rc, _, err = dry(["--include", "localhost:1", "train.py"], capsys)   # CPU default: 1 process
    assert rc == 2 and "slot 1 of host 'localhost'" in err
    rc, _, err = dry(["--num_nodes", "2", "train.py"], capsys)
    assert rc == 2 and "has only 1 host" in err


# ------------------------------------------------------------------------------------------------ one remote host
def test_one_remote_host_left_runs_here_and_says_so(tmp_path, capsys):
    """As in DeepSpeed, a one-host selection runs locally; a host that is not this machine gets a warning."""
    (tmp_path / "hf").write_text(HOSTFILE)
    rc, plan, err = dry(["-H", "hf", "--include", "worker-2:0,1", "train.py"], capsys)
    assert rc == 0 and plan["launcher"] == "local" and plan["master_addr"] == "127.0.0.1"
    assert err.startswith("dsfast: warning: ") and "'worker-2', which is not this machine" in err
    assert "--force_multi" in err and socket.gethostname() in err
    rc, plan, err = dry(["-H", "hf", "--include", "worker-2:0,1", "--force_multi", "train.py"], capsys)
    assert rc == 0 and plan["launcher"] == "ssh" and plan["master_addr"] == "worker-2" and err == ""


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.2", socket.gethostname()])
def test_one_host_that_is_this_machine_runs_here_quietly(tmp_path, capsys, host):
    (tmp_path / "hf").write_text(f"{host} slots=2\nworker-1 slots=2\n")
    rc, plan, err = dry(["-H", "hf", "--include", host, "train.py"], capsys)
    assert rc == 0 and plan["launcher"] == "local" and plan["hosts"] == {host: [0, 1]} and err == ""


def test_this_machine_without_dns():
    own = socket.gethostname()
    for host in ("localhost", "LOCALHOST", own, own.split(".")[0], "127.1.2.3", "::1", "[::1]"):
        assert is_this_machine(host), host
    # a documentation address (never assigned) and names that only share a prefix
    for host in ("worker-2", "192.0.2.7", f"{own}x", f"x{own}"):
        assert not is_this_machine(host), host


@pytest.mark.parametrize("own, host, same", [("node7", "node7.cluster", True), ("node7.cluster", "node7", True),
                                             ("node7.a", "node7.b", False), ("node7", "node71", False)])
def test_short_and_full_hostnames(monkeypatch, own, host, same):
    monkeypatch.setattr(socket, "gethostname", lambda: own)
    assert is_this_machine(host) is same


def test_explicit_local_launcher_is_not_warned(tmp_path, capsys):
    (tmp_path / "hf").write_text(HOSTFILE)
    rc, plan, err = dry(["-H", "hf", "--include", "worker-2", "--no_ssh", "train.py"], capsys)
    assert rc == 0 and plan["launcher"] == "local" and err == ""


def test_the_warning_comes_before_the_local_run(tmp_path):
    (tmp_path / "hf").write_text(HOSTFILE)
    (tmp_path / "w.py").write_text("import os; print('ran rank', os.environ['RANK'], flush=True)\n")
    p = subprocess.run([sys.executable, "-m", "dsfast.launcher", "-H", "hf", "--include", "worker-2:1", "w.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 0, p.stderr
    assert "ran rank 0" in p.stdout
    assert p.stderr.startswith("dsfast: warning: the selection leaves one host, 'worker-2'"), p.stderr
