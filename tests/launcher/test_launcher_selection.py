"""--include / --exclude / --num_nodes / --num_gpus: every accepted and rejected form, as functions and via CLI."""
from collections import OrderedDict

import pytest

from dsfast.launcher.errors import LaunchError
from dsfast.launcher.selection import parse_node_spec, select_resources
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
