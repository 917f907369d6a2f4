"""The seeds' programs (/work/shared/seeds) run unchanged apart from `import dsfast as deepspeed`.

Programs: tests/distributed/seeds/. Their configs are the seeds' ds_config.json files verbatim, except where noted.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "distributed"))
from dist_launch import REPO, launch  # noqa: E402

SEEDS = os.path.join(HERE, "distributed", "seeds")
SEED1_CONFIG = {"train_batch_size": 8, "gradient_accumulation_steps": 1,
                "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
                "fp16": {"enabled": True}, "zero_optimization": True}
SEED2_CONFIG = {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.001, "momentum": 0.9}}}


def _write(tmp_path, name, cfg):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def _results(runs):
    out = []
    for _, text in runs:
        line = [line for line in text.splitlines() if line.startswith("RESULT ")][-1]
        out.append(json.loads(line[len("RESULT "):]))
    return sorted(out, key=lambda r: r["rank"])


def test_seed1_exact_config_runs_as_a_world_of_one(tmp_path):
    """`"zero_optimization": true` means stage 1 (DeepSpeed). A plain `python script.py` (no launcher
    variables) is a world of one process."""
    cfg = _write(tmp_path, "ds_config.json", SEED1_CONFIG)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = REPO
    run = subprocess.run([sys.executable, os.path.join(SEEDS, "seed1_getting_started.py"), "--epochs", "1",
                          "--deepspeed", "--deepspeed_config", cfg], capture_output=True, text=True, timeout=90,
                         env=env, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert _results([(0, run.stdout)])[0]["zero_stage"] == 1


def test_seed1_checkpoint_loop_with_the_exact_config_saves_and_resumes_on_two_ranks(tmp_path):
    """The seed's loop with its ds_config verbatim (fp16, ZeRO stage 1): float tags, client_sd=, and a resumed
    run that starts after client_sd['step']."""
    cfg = _write(tmp_path, "ds_config.json", SEED1_CONFIG)
    ckpt = tmp_path / "ckpt"
    args = ["--epochs", "1", "--deepspeed", "--deepspeed_config", cfg, "--save_dir", ckpt, "--save_interval", "10"]
    first = _results(launch(os.path.join(SEEDS, "seed1_getting_started.py"), args, nprocs=2, timeout=150))
    assert first[0]["saved"] == first[1]["saved"] and len(first[0]["saved"]) == 4   # steps 0, 10, 20, 30
    assert (ckpt / "latest").read_text().strip() == str(first[0]["saved"][-1])
    again = _results(launch(os.path.join(SEEDS, "seed1_getting_started.py"),
                            args + ["--load_dir", ckpt], nprocs=2, timeout=150))
    for r in again:
        assert r["start"] == 31 and r["steps"] == 32 and r["zero_stage"] == 1


def test_seed1_program_trains_fp16_on_two_ranks(tmp_path):
    cfg = dict(SEED1_CONFIG)
    del cfg["zero_optimization"]           # stage 0 (see the test above)
    cfg["optimizer"] = {"type": "Adam", "params": {"lr": 0.03}}  # the seed's 1.5e-4 barely moves in 32 steps
    path = _write(tmp_path, "ds_config.json", cfg)
    ranks = _results(launch(os.path.join(SEEDS, "seed1_getting_started.py"),
                            ["--epochs", "1", "--deepspeed", "--deepspeed_config", path], nprocs=2, timeout=120))
    for r in ranks:
        assert r["model_dtype"] == "torch.float16" and r["optimizer"] == "CPUAdam"
        assert r["steps"] == 256 // 8 and r["last"] < 0.5 * r["first"]
    # each rank saw its own shard of the data
    assert len(ranks[0]["samples_seen"]) + len(ranks[1]["samples_seen"]) >= 256 - 4


def test_seed2_program_client_adam_frozen_eval_model_and_distributed_sampler(tmp_path):
    path = _write(tmp_path, "deepspeed_config.json", SEED2_CONFIG)
    ranks = _results(launch(os.path.join(SEEDS, "seed2_simple_example.py"),
                            ["--isDeepspeed", "--deepspeed", "--deepspeed_config", path], nprocs=2, timeout=120))
    for r in ranks:
        assert r["optimizer"] == "Adam" and r["teacher_optimizer"] == "None" and r["teacher_training"] is False
        assert r["plain_optimizer"] == "CPUSGD"  # the config's SGD -> dsfast's CPU kernel
        assert r["last"] < 0.5 * r["first"] and r["plain_last"] < r["plain_first"]
    assert not set(ranks[0]["indices_epoch0"]) & set(ranks[1]["indices_epoch0"])  # DistributedSampler shards
