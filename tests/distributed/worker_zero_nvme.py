"""One rank of the NVMe offload checks (tests/distributed/test_zero_nvme.py). argv: out nvme_path case.

  parity   stages 1-3 x fp32/bf16 (GAS 2, clipping): NVMe offload against CPU offload, parameters and every
           rank's full masters and Adam states bitwise; then a checkpoint saved from NVMe, loaded into CPU
           offload and into NVMe, trained on, bitwise the uninterrupted run
  fault    rank 1's disk fills up at step 2: every rank raises (none waits in a collective), rank 1's error
           names its file and step
  params   stage 3 with offload_param on NVMe (states on the host, then on NVMe too), fp32/bf16: the same
           parity and checkpoints against CPU offload, gathers by collectives (no /dev/shm snapshot)
  params-fault   the same fault with only the parameters on NVMe
  params-init    the model built under zero.Init with offload_param on NVMe (each shard to its file as it is
           made, rank 0's values broadcast first): bitwise zero.Init with offload_param on the host
"""
import errno
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
from dp_common import MICRO, build_model, global_batch  # noqa: E402
from dsfast.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state  # noqa: E402
from dsfast.zero.nvme import io as nvme_io  # noqa: E402


def cfg(stage, precision, where, params=None):
    zero = {"stage": stage, "reduce_bucket_size": 400}   # several units per rank
    zero["offload_optimizer"] = {"device": "cpu"} if where == "cpu" else \
        {"device": "nvme", "nvme_path": where, "buffer_count": 3}
    if params is not None:   # stage 3: offload_param too ("cpu" or an nvme_path), every shard swapped
        zero["offload_param"] = {"device": "cpu"} if params == "cpu" else \
            {"device": "nvme", "nvme_path": params, "buffer_count": 2, "max_in_cpu": 0}
        zero["stage3_param_persistence_threshold"] = 0
    c = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
         "gradient_clipping": 0.05, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
         "zero_optimization": zero}
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    return c


def engine_for(c, zero_init=False):
    if zero_init:
        with dsfast.zero.Init(config_dict_or_path=c):
            model = build_model()
    else:
        model = build_model()
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=c)[0]


def train(engine, steps, first=0):
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    for step in range(first, first + steps):
        x, y = global_batch(step, MICRO * 2 * world)
        for m in range(2):
            lo = (m * world + rank) * MICRO
            out = engine(x[lo:lo + MICRO].to(engine.module[0].weight.dtype))
            engine.backward(torch.nn.functional.mse_loss(out.float(), y[lo:lo + MICRO]))
            engine.step()
    return engine


def everything(engine):
    out = {}
    for n, p in engine.module.named_parameters():
        out[n] = p.detach().float().clone()
        out[n + "/master"] = safe_get_full_fp32_param(p)
        for key in ("exp_avg", "exp_avg_sq"):
            out[n + "/" + key] = safe_get_full_optimizer_state(p, key)
    return out


def same(a, b, what):
    bad = [k for k in a if not torch.equal(a[k], b[k])]
    assert not bad, f"{what}: {bad[:3]} differ"


def parity(nvme):
    ck = os.path.join(nvme, "..", "ck")
    for stage in (1, 2, 3):
        for precision in ("fp32", "bf16"):
            ref = train(engine_for(cfg(stage, precision, "cpu")), 4)
            got = train(engine_for(cfg(stage, precision, nvme)), 2)
            swap = got.state_owner.swap
            assert len(swap.units) >= 2 and swap.window.peak_in_use <= 3
            got.save_checkpoint(ck, tag=f"s{stage}{precision}")
            train(got, 2, first=2)
            same(everything(got), everything(ref), f"stage {stage} {precision} nvme vs cpu")
            got.destroy()
            for where in ("cpu", nvme):
                e = engine_for(cfg(stage, precision, where))
                e.load_checkpoint(ck, tag=f"s{stage}{precision}")
                train(e, 2, first=2)
                same(everything(e), everything(ref), f"stage {stage} {precision} resumed on {where}")
                if e.state_owner.swap is not None:
                    e.destroy()
    return "parity ok"


def params_parity(nvme):
    ck = os.path.join(nvme, "..", "ck")
    for precision in ("fp32", "bf16"):
        ref = train(engine_for(cfg(3, precision, "cpu", "cpu")), 4)
        for states in ("cpu", nvme):
            got = train(engine_for(cfg(3, precision, states, nvme)), 2)
            swap = got.state_owner.param_swap
            assert got.state_owner.gathers_through == "collectives" and len(swap.records) >= 2
            assert swap.window.peak_in_use <= 2
            tag = f"p{precision}{states == nvme}"
            got.save_checkpoint(ck, tag=tag)
            train(got, 2, first=2)
            same(everything(got), everything(ref), f"{precision} params on nvme, states on {states}")
            assert all(r.shard.untyped_storage().nbytes() == 0 for r in swap.records)
            got.destroy()
            for where in ("cpu", nvme):
                e = engine_for(cfg(3, precision, states, where))
                e.load_checkpoint(ck, tag=tag)
                train(e, 2, first=2)
                same(everything(e), everything(ref), f"{precision} resumed with params on {where}")
                e.destroy()
    return "params ok"


def params_init(nvme):
    for precision in ("fp32", "bf16"):
        ref = train(engine_for(cfg(3, precision, "cpu", "cpu"), zero_init=True), 3)
        got = train(engine_for(cfg(3, precision, nvme, nvme), zero_init=True), 3)
        assert all(r.swap is got.state_owner.param_swap for r in got.state_owner.param_swap.records)
        same(everything(got), everything(ref), f"{precision} built under zero.Init on nvme")
        got.destroy()
    return "params-init ok"


def fault(nvme, params=None):
    e = train(engine_for(cfg(2, "fp32", nvme) if params is None else cfg(3, "fp32", "cpu", nvme)), 1)
    if torch.distributed.get_rank() == 1:
        def full(fd, buffers, offset):
            raise OSError(errno.ENOSPC, "No space left on device")
        nvme_io.os.pwritev = full
    try:
        train(e, 1, first=1)
    except nvme_io.SwapError as err:
        return f"raised: {err}"
    return "no error"


def main():
    out, nvme, case = sys.argv[1:4]
    dsfast.init_distributed()
    rank = torch.distributed.get_rank()
    result = {"parity": parity, "fault": fault, "params": params_parity, "params-init": params_init,
              "params-fault": lambda where: fault(where, params=where)}[case](nvme)
    with open(f"{out}.{rank}", "w") as f:
        f.write(result)


if __name__ == "__main__":
    main()
