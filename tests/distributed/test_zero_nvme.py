"""offload_optimizer (and at stage 3 offload_param) on NVMe on 2 gloo ranks (worker_zero_nvme.py): bitwise the CPU
offload's training at stages 1-3 (fp32, bf16), checkpoints across the two placements, and a full disk on one rank
stopping every rank."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402

from dsfast.zero.nvme.files import SWAP_ROOT  # noqa: E402


def _run(tmp_path, case, check=True):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    out = tmp_path / "out"
    results = launch(os.path.join(HERE, "worker_zero_nvme.py"), [out, nvme, case], nprocs=2, timeout=300,
                     check=check)
    return [open(f"{out}.{r}").read() for r in range(2)], nvme, results


def test_nvme_offload_is_bitwise_cpu_offload_on_two_ranks_and_checkpoints_cross(tmp_path):
    texts, nvme, _ = _run(tmp_path, "parity")
    assert texts == ["parity ok", "parity ok"]
    assert os.listdir(nvme / SWAP_ROOT) == []   # every engine's files gone


def test_a_full_disk_on_one_rank_stops_every_rank(tmp_path):
    texts, nvme, results = _run(tmp_path, "fault")
    assert texts[1].startswith("raised: NVMe swap write of ") and "at step 2 failed: No space left" in texts[1]
    assert "rank1/unit" in texts[1]
    assert texts[0] == ("raised: rank 1 failed to read or write its NVMe swap files (its own error names the file "
                        "and the step); rank 0 stops too")
    assert os.listdir(nvme / SWAP_ROOT) == []   # removed at exit


def test_parameters_on_nvme_are_bitwise_cpu_offload_on_two_ranks_and_checkpoints_cross(tmp_path):
    texts, nvme, _ = _run(tmp_path, "params")
    assert texts == ["params ok", "params ok"]
    assert os.listdir(nvme / SWAP_ROOT) == []


def test_a_full_disk_under_the_parameters_on_one_rank_stops_every_rank(tmp_path):
    texts, nvme, _ = _run(tmp_path, "params-fault")
    assert texts[1].startswith("raised: NVMe swap write of ") and "at step 2 failed: No space left" in texts[1]
    assert "rank1/param" in texts[1]
    assert texts[0].startswith("raised: rank 1 failed to read or write its NVMe swap files")
    assert os.listdir(nvme / SWAP_ROOT) == []


def test_a_model_built_under_zero_init_on_nvme_trains_bitwise_on_two_ranks(tmp_path):
    texts, nvme, _ = _run(tmp_path, "params-init")
    assert texts == ["params-init ok", "params-init ok"]
    assert os.listdir(nvme / SWAP_ROOT) == []
