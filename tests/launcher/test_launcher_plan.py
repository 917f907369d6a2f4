"""--dry_run plans for every launcher, quoting, GPU slot handling, per-rank environment, subcommand dispatch."""
import base64
import json
import os
import shlex
import subprocess
import sys
import types

import pytest

from dsfast.launcher import cli, node
from dsfast.launcher.devices import physical_gpu_count as REAL_GPU_COUNT  # before conftest's "no GPU" patch
from dsfast.launcher.errors import LaunchError
from launcher_util import dry

TWO_NODES = "127.0.0.1 slots=2\n127.0.0.2 slots=2\n"


def node_argv(cmd):
    """The node launcher argv inside an ssh command (checks the remote shell line round-trips)."""
    line = cmd[-1]
    assert line.startswith("cd ") and " && exec " in line
    return shlex.split(line.split(" && exec ", 1)[1])


def decoded_env(argv):
    (blob,) = [a.split("=", 1)[1] for a in argv if a.startswith("--env_b64=")]
    return json.loads(base64.urlsafe_b64decode(blob))


def test_dry_run_prints_one_json_object_and_starts_nothing(tmp_path):
    (tmp_path / "boom.py").write_text("open('started', 'w').write('x')\n")
    p = subprocess.run([sys.executable, "-m", "dsfast.launcher", "--dry_run", "--num_procs", "2", "boom.py", "--lr",
                        "0.1"], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)  # the whole stdout is exactly one JSON object
    assert set(plan) == {"hosts", "world_size", "master_addr", "master_port", "launcher", "env", "commands"}
    assert plan["hosts"] == {"localhost": [0, 1]} and plan["world_size"] == 2 and plan["master_port"] == 29500
    cmd = plan["commands"][0]
    assert cmd[1:4] == ["-u", "-m", "dsfast.launcher.node"] and cmd[-4:] == ["--", "boom.py", "--lr", "0.1"]
    assert not (tmp_path / "started").exists()


def test_dry_run_into_a_closed_pipe_is_quiet(tmp_path):
    # `dsfast --dry_run ... | head -1`: the reader leaves early; no traceback, exit 0
    many_args = " ".join(["--arg"] * 15000)     # a plan larger than the pipe's buffer
    p = subprocess.run(f"{sys.executable} -m dsfast.launcher --dry_run --num_procs 2 x.py {many_args} | head -c 1",
                       shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=30,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert p.stdout == "{" and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


def test_dry_run_error_exit_code_2_on_stderr(tmp_path):
    p = subprocess.run([sys.executable, "-m", "dsfast.launcher", "--dry_run", "-i", "a", "-e", "b", "x.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stdout == "" and "mutually exclusive" in p.stderr


def test_ssh_plan_quotes_everything_for_the_remote_shell(tmp_path, capsys):
    (tmp_path / "hf").write_text(TWO_NODES)
    (tmp_path / ".deepspeed_env").write_text("""MSG=a b; 'c' "d" $(id)\n""")
    weird = "it's a; $(rm -rf x) `y` \"z\""
    rc, plan, _ = dry(["-H", "hf", "--ssh_port", "2222", "--launcher_args", "-F /tmp/cfg", "train.py", weird], capsys)
    assert rc == 0 and plan["launcher"] == "ssh" and plan["world_size"] == 4 and plan["master_addr"] == "127.0.0.1"
    for i, (host, cmd) in enumerate(zip(plan["hosts"], plan["commands"])):
        assert cmd[:7] == ["ssh", "-o", "BatchMode=yes", "-p", "2222", "-F", "/tmp/cfg"] and cmd[7] == host
        argv = node_argv(cmd)
        assert argv[-3:] == ["--", "train.py", weird] and f"--node_rank={i}" in argv and "--watch_stdin" in argv
        assert decoded_env(argv)["MSG"] == """a b; 'c' "d" $(id)"""
        assert json.loads(argv[4].split("=", 1)[1]) == {"127.0.0.1": [0, 1], "127.0.0.2": [0, 1]}


def test_mpi_pdsh_slurm_commands(tmp_path, capsys):
    (tmp_path / "hf").write_text(TWO_NODES)
    rc, plan, _ = dry(["-H", "hf", "--launcher", "openmpi", "--launcher_args", "--mca btl ^openib", "t.py"], capsys)
    cmd = plan["commands"][0]
    assert cmd[:9] == ["mpirun", "-n", "4", "--host", "127.0.0.1:2,127.0.0.2:2", "--map-by", "slot", "--bind-to",
                       "none"]
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0) and "^openib" in cmd
    assert "dsfast.launcher.rank" in cmd and cmd[-2:] == ["--", "t.py"]
    rc, plan, _ = dry(["-H", "hf", "--launcher", "mpich", "t.py"], capsys)
    assert plan["commands"][0][:5] == ["mpirun", "-n", "4", "-hosts", "127.0.0.1:2,127.0.0.2:2"]
    rc, plan, _ = dry(["-H", "hf", "--launcher", "slurm", "t.py"], capsys)
    assert plan["commands"][0][:7] == ["srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2",
                                       "--nodelist=127.0.0.1,127.0.0.2", "--distribution=block", "--export=ALL"]
    rc, plan, _ = dry(["-H", "hf", "--launcher", "pdsh", "t.py"], capsys)
    cmd = plan["commands"][0]
    assert cmd[:6] == ["pdsh", "-S", "-f", "1024", "-w", "127.0.0.1,127.0.0.2"] and "--node_rank=%n" in cmd[-1]
    (tmp_path / "hf").write_text("a slots=2\nb slots=1\n")
    rc, _, err = dry(["-H", "hf", "--launcher", "slurm", "t.py"], capsys)
    assert rc == 2 and "same number of slots on every host" in err and "a: 2, b: 1" in err


@pytest.mark.parametrize("argv, needle", [
    (["--launcher", "local"], "--launcher local runs one node but the plan has 2 hosts"),
    (["--master_port", "70000"], "--master_port must be in 1..65535"),
    (["--ssh_port", "0"], "--ssh_port must be in 1..65535"),
    (["--launcher", "mpich", "--ssh_port", "2"], "--ssh_port is not supported with --launcher mpich"),
    (["--launcher", "ssh", "--node_rank", "1"], "--node_rank runs one node's share by hand"),
    (["--no_ssh", "--node_rank", "5"], "--node_rank 5 is outside 0..1"),
])
def test_plan_errors(tmp_path, capsys, argv, needle):
    (tmp_path / "hf").write_text(TWO_NODES)
    rc, _, err = dry(["-H", "hf"] + argv + ["t.py"], capsys)
    assert rc == 2 and needle in err


def test_no_ssh_node_rank_runs_one_share(tmp_path, capsys):
    (tmp_path / "hf").write_text(TWO_NODES)
    rc, plan, _ = dry(["-H", "hf", "--no_ssh", "--node_rank", "1", "t.py"], capsys)
    assert rc == 0 and plan["launcher"] == "local" and "--node_rank=1" in plan["commands"][0]
    assert plan["master_addr"] == "127.0.0.1"  # the first host, reachable from every node


def test_no_script_and_unknown_option_exit_2(capsys):
    rc, _, err = dry([], capsys)
    assert rc == 2 and "no user script given" in err
    with pytest.raises(SystemExit) as e:
        cli.main(["--definitely-not-an-option", "t.py"])
    assert e.value.code == 2


def test_visible_gpus_and_cuda_visible_devices(capsys, monkeypatch):
    monkeypatch.setattr("dsfast.launcher.devices.physical_gpu_count", lambda: 4)
    rc, plan, _ = dry(["t.py"], capsys)
    assert plan["hosts"] == {"localhost": [0, 1, 2, 3]}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    rc, plan, _ = dry(["t.py"], capsys)
    assert plan["hosts"] == {"localhost": [0, 1]}  # slots are positions in the visible list
    rc, _, err = dry(["--num_gpus", "3", "t.py"], capsys)
    assert rc == 2 and "--num_gpus 3" in err
    # each rank sees its node's devices in slot order, LOCAL_RANK i -> cuda:i -> GPU 2+i
    _, children = node.build_children(
        ['--world_info={"localhost":[1,0]}', "--master_addr=127.0.0.1", "--master_port=1", "--node_rank=0",
         "--", "t.py"], dict(os.environ, CUDA_VISIBLE_DEVICES="2,3"), check_script=False)
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in children] == ["3,2", "3,2"]
    _, children = node.build_children(
        ['--world_info={"localhost":[1,3]}', "--master_addr=a", "--master_port=1", "--node_rank=0", "--", "t.py"],
        {}, check_script=False)
    assert children[0].env["CUDA_VISIBLE_DEVICES"] == "1,3" and children[1].env["LOCAL_RANK"] == "1"
    monkeypatch.setattr("dsfast.launcher.devices.physical_gpu_count", lambda: 0)
    _, children = node.build_children(['--world_info={"h":[0]}', "--master_addr=a", "--master_port=1",
                                       "--node_rank=0", "--", "t.py"], {}, check_script=False)
    assert "CUDA_VISIBLE_DEVICES" not in children[0].env  # CPU node: nothing to pick
    monkeypatch.setattr("dsfast.launcher.devices.physical_gpu_count", lambda: 4)
    with pytest.raises(LaunchError, match="slots \\[3\\] but this node sees 2 GPU"):
        node.build_children(['--world_info={"h":[0,3]}', "--master_addr=a", "--master_port=1", "--node_rank=0",
                             "--", "t.py"], {"CUDA_VISIBLE_DEVICES": "0,1"}, check_script=False)


def test_per_rank_environment_and_arguments(tmp_path):
    base = ['--world_info={"h0":[0,1],"h1":[0,1,2]}', "--master_addr=h0", "--master_port=29555", "--node_rank=1"]
    env = {"PATH": "/bin", "KEEP": "1"}
    _, children = node.build_children(base + ["--", "t.py", "--lr", "1"], env, check_script=False)
    assert [c.env["RANK"] for c in children] == ["2", "3", "4"]
    assert [c.prefix for c in children] == ["[rank2]: ", "[rank3]: ", "[rank4]: "]
    c = children[1]
    assert c.argv[1:] == ["-u", "t.py", "--local_rank=1", "--lr", "1"]
    cores = len(os.sched_getaffinity(0))
    assert {k: c.env[k] for k in ("LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                  "OMP_NUM_THREADS", "KEEP")} == {
        "LOCAL_RANK": "1", "WORLD_SIZE": "5", "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "h0", "MASTER_PORT": "29555",
        "OMP_NUM_THREADS": str(max(1, cores // 3)), "KEEP": "1"}
    _, children = node.build_children(base + ["--no_local_rank", "--module", "--", "pkg.mod", "x"],
                                      dict(env, OMP_NUM_THREADS="5"), check_script=False)
    assert children[0].argv[1:] == ["-u", "-m", "pkg.mod", "x"] and children[0].env["OMP_NUM_THREADS"] == "5"
    _, children = node.build_children(base + ["--no_python", "--", "./run.sh"], env, check_script=False)
    assert children[2].argv == ["./run.sh", "--local_rank=2"]
    _, children = node.build_children(base + ["--bind_core_list=0-5", "--", "t.py"], env, check_script=False)
    assert [c.cpus for c in children] == [[0, 1], [2, 3], [4, 5]] and children[0].env["OMP_NUM_THREADS"] == "2"
    with pytest.raises(LaunchError, match="3 local ranks but only 2 core"):
        node.build_children(base + ["--bind_core_list=0,1", "--", "t.py"], env, check_script=False)
    with pytest.raises(LaunchError, match="user script 'missing.py' not found"):
        node.build_children(base + ["--", "missing.py"], env)


def test_rank_shim_maps_mpi_and_slurm_ranks():
    from dsfast.launcher import rank
    info = node.parse_world_info('{"a":[0,1],"b":[0,1,2]}')
    assert [rank.locate(info, r) for r in range(5)] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert rank.global_rank({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "5"})[:2] == (3, 5)
    assert rank.global_rank({"PMI_RANK": "1", "PMI_SIZE": "2"})[2] == "MPICH/Hydra"
    assert rank.global_rank({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})[2] == "Slurm"
    with pytest.raises(LaunchError, match="must be started by mpirun or srun"):
        rank.global_rank({})


# --- subcommands ------------------------------------------------------------------------------------------------
@pytest.fixture
def fake_report(monkeypatch):
    calls = []
    mod = types.ModuleType("fake_report_mod")
    mod.main = lambda argv: calls.append(list(argv)) or 7
    monkeypatch.setitem(sys.modules, "fake_report_mod", mod)
    monkeypatch.setitem(cli.SUBCOMMANDS, "report", "fake_report_mod:main")
    return calls


def test_subcommand_only_as_exact_first_argument(fake_report, capsys):
    assert cli.main(["report", "--json", "x"]) == 7 and fake_report == [["--json", "x"]]
    for argv, script in ((["--", "report", "--json"], "report"), (["./report"], "./report"),
                         (["report.py"], "report.py"), (["--num_procs", "2", "report"], "report"),
                         (["Report"], "Report"), (["reports"], "reports")):
        rc, plan, err = dry(argv, capsys)
        assert rc == 0, err
        assert plan["commands"][0][plan["commands"][0].index("--") + 1] == script
    assert fake_report == [["--json", "x"]]  # none of those reached the subcommand


def test_subcommand_notes_a_same_named_file(fake_report, tmp_path, capsys):
    (tmp_path / "report").write_text("print('user script')\n")
    assert cli.main(["report"]) == 7
    assert "dsfast ./report" in capsys.readouterr().err


def test_missing_subcommand_module_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUBCOMMANDS, "report", "dsfast.no_such_module_xyz:main")
    assert cli.main(["report"]) == 2
    assert "`dsfast report` is not available" in capsys.readouterr().err


def test_report_subcommand_targets_dsfast_report_main():
    assert cli.SUBCOMMANDS["report"] == "dsfast.report:main"


def test_report_module_when_present_has_main():
    import importlib.util
    if importlib.util.find_spec("dsfast.report") is None:
        pytest.skip("dsfast/report.py not written yet")
    import inspect

    import dsfast.report
    assert callable(dsfast.report.main) and len(inspect.signature(dsfast.report.main).parameters) >= 1


def test_gpu_count_from_proc_then_dev(tmp_path, monkeypatch):
    from dsfast.launcher import devices
    proc, dev = tmp_path / "gpus", tmp_path / "dev"
    proc.mkdir(), dev.mkdir()
    for name in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (proc / name).mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps", "null"):
        (dev / name).write_text("")
    monkeypatch.setattr(devices, "_NVIDIA_PROC", str(proc))
    monkeypatch.setattr(devices, "_DEV_DIR", str(dev))
    assert REAL_GPU_COUNT() == 3
    monkeypatch.setattr(devices, "_NVIDIA_PROC", str(tmp_path / "absent"))
    assert REAL_GPU_COUNT() == 2
    monkeypatch.setattr(devices, "_DEV_DIR", str(tmp_path / "absent"))
    assert REAL_GPU_COUNT() == 0
    assert devices.visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, physical=2) == ["GPU-aa", "GPU-bb"]
    assert devices.visible_devices({"CUDA_VISIBLE_DEVICES": "1,-1,0"}, physical=2) == ["1"]
    assert devices.visible_devices({"CUDA_VISIBLE_DEVICES": ""}, physical=2) == []
    assert devices.visible_devices({}, physical=0) == []
