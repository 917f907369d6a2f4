"""Environment discovery for init_distributed (pure functions) and the world-of-one start."""
import subprocess
import sys

import pytest

from dsfast.comm import DistributedEnvError, discover, first_slurm_host


def test_torchrun_variables():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "1234"}
    d = discover(env)
    assert (d.rank, d.world_size, d.local_rank, d.master_addr, d.master_port, d.source) == \
        (3, 4, 1, "10.0.0.5", 1234, "env")


def test_torchrun_wins_over_slurm_and_mpi():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "SLURM_PROCID": "0", "SLURM_NTASKS": "8",
           "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6"}
    d = discover(env)
    assert (d.rank, d.world_size, d.source, d.master_port) == (1, 2, "env", 29500)


def test_openmpi_variables_single_node_defaults_to_localhost():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    d = discover(env)
    assert (d.rank, d.world_size, d.local_rank, d.master_addr, d.source) == (2, 4, 2, "127.0.0.1", "openmpi")
    assert discover({**env, "MASTER_ADDR": "n0", "MASTER_PORT": "7"}).master_addr == "n0"


def test_openmpi_multi_node_without_master_addr_is_a_clear_error():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    with pytest.raises(DistributedEnvError, match="MASTER_ADDR.*mpirun -x"):
        discover(env)


def test_slurm_variables_and_master_from_launch_node_or_nodelist():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[03-04]"}
    d = discover(env)
    assert (d.rank, d.world_size, d.local_rank, d.master_addr, d.source) == (5, 8, 1, "gpu03", "slurm")
    assert discover({**env, "SLURM_LAUNCH_NODE_IPADDR": "10.1.1.1"}).master_addr == "10.1.1.1"
    assert discover({**env, "MASTER_ADDR": "m"}).master_addr == "m"


@pytest.mark.parametrize("nodelist,first", [("node1", "node1"), ("node[07,9-12]", "node07"),
                                            ("a[1-2],b[3-4]", "a1"), ("n-x[001-004]", "n-x001"),
                                            ("host1,host2", "host1")])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_no_variables_is_a_world_of_one():
    d = discover({})
    assert (d.rank, d.world_size, d.local_rank, d.source) == (0, 1, 0, "single")


@pytest.mark.parametrize("env,match", [
    ({"RANK": "0"}, "WORLD_SIZE not set"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "rank 2 is outside world size 2"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR is not"),
])
def test_inconsistent_environment_errors(env, match):
    with pytest.raises(DistributedEnvError, match=match):
        discover(env)


def test_plain_python_script_is_a_world_of_one_and_init_twice_is_safe():
    code = ("import os, dsfast, torch.distributed as d\n"
            "for k in [k for k in os.environ if k.startswith(('OMPI_', 'SLURM_')) or k in ('RANK', 'WORLD_SIZE')]:\n"
            "    del os.environ[k]\n"
            "assert dsfast.init_distributed() == 'gloo'\n"
            "assert dsfast.init_distributed() == 'gloo'\n"
            "print(d.get_rank(), d.get_world_size(), os.environ['RANK'], os.environ['WORLD_SIZE'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "0", "1"]
