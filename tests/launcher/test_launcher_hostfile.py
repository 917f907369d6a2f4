"""Hostfile parsing: every accepted and rejected form, through the function and through `dsfast --dry_run`."""
import pytest

from dsfast.launcher.errors import LaunchError
from dsfast.launcher.hostfile import parse_hostfile_text, read_hostfile
from launcher_util import dry



@pytest.mark.parametrize("text, expected", [
    ("worker-1 slots=4\nworker-2 slots=4\n", {"worker-1": 4, "worker-2": 4}),
    ("# cluster\n\nb slots=2\n  \n\ta\tslots=1  \n", {"b": 2, "a": 1}),               # comments, blanks, tabs
    ("node-3 slots=8   # the big one\nnode-1 slots=16\n", {"node-3": 8, "node-1": 16}),  # inline comment
    ("10.0.0.5 slots=1", {"10.0.0.5": 1}),                                            # no final newline
])
def test_accepted_forms_keep_file_order(text, expected):
    got = parse_hostfile_text(text, "hf")
    assert got == expected and list(got) == list(expected)


@pytest.mark.parametrize("text, needle", [
    ("worker-1\n", "line 1 ('worker-1'): expected 'HOSTNAME slots=N'"),
    ("a slots=2\nworker-1 slots=4 gpus=2\n", "line 2"),
    ("worker-1 slots = 4\n", "expected 'HOSTNAME slots=N'"),
    ("worker-1 slot=4\n", "expected 'HOSTNAME slots=N'"),
    ("slots=4\n", "expected 'HOSTNAME slots=N'"),
    ("a=b slots=4\n", "expected 'HOSTNAME slots=N'"),
    ("worker-1 slots=0\n", "slots must be a positive integer, got '0'"),
    ("worker-1 slots=-2\n", "slots must be a positive integer, got '-2'"),
    ("worker-1 slots=four\n", "slots must be a positive integer, got 'four'"),
    ("worker-1 slots=1.5\n", "slots must be a positive integer, got '1.5'"),
    ("worker-1 slots=\n", "expected 'HOSTNAME slots=N'"),
    ("w1 slots=1\n# x\nw1 slots=2\n", "line 3 ('w1 slots=2'): host 'w1' is listed twice (first on line 1)"),
    ("", "lists no hosts"),
    ("# only a comment\n\n", "lists no hosts"),
])
def test_rejected_forms_name_the_line(text, needle):
    with pytest.raises(LaunchError) as e:
        parse_hostfile_text(text, "hf")
    assert needle in str(e.value)
    assert "hostfile hf" in str(e.value)


@pytest.mark.parametrize("text, needle", [
    ("worker-1\n", "line 1"),
    ("w slots=0\n", "positive integer"),
    ("w slots=1\nw slots=1\n", "listed twice"),
    ("\n", "lists no hosts"),
])
def test_rejected_forms_via_dry_run_exit_2(tmp_path, capsys, text, needle):
    hf = tmp_path / "hostfile"
    hf.write_text(text)
    rc, plan, err = dry(["-H", str(hf), "train.py"], capsys)
    assert rc == 2 and plan is None
    assert err.startswith("dsfast: error: hostfile ") and str(hf) in err and needle in err


def test_explicit_missing_hostfile_is_an_error(tmp_path, capsys):
    rc, _, err = dry(["--hostfile", str(tmp_path / "nope"), "train.py"], capsys)
    assert rc == 2 and "cannot read hostfile" in err and "nope" in err


def test_missing_default_hostfile_means_this_machine(capsys, monkeypatch):
    monkeypatch.setattr("dsfast.launcher.hostfile.DEFAULT_HOSTFILE", "/nonexistent/hostfile")
    monkeypatch.setattr("dsfast.launcher.cli.DEFAULT_HOSTFILE", "/nonexistent/hostfile")
    monkeypatch.setattr("dsfast.launcher.devices.physical_gpu_count", lambda: 0)
    rc, plan, _ = dry(["--num_procs", "3", "train.py"], capsys)
    assert rc == 0 and plan["hosts"] == {"localhost": [0, 1, 2]} and plan["world_size"] == 3
    assert plan["launcher"] == "local" and plan["master_addr"] == "127.0.0.1"


def test_read_hostfile_not_utf8(tmp_path):
    p = tmp_path / "hf"
    p.write_bytes(b"\xff\xfe slots=1\n")
    with pytest.raises(LaunchError, match="not UTF-8"):
        read_hostfile(str(p))
