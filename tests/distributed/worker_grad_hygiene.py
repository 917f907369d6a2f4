"""One rank of the gradient-hygiene checks on 2 gloo ranks; rank 0 saves the results.

argv: out_path. Runs the two-engine GAN on half the global batch per rank, a double backward per micro-step
with GAS 2 (fp32 and bf16), and a plain loss.backward() + step (refused on every rank, nothing applied).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
from dp_common import MICRO, build_model, ds_config, gather_records, global_batch  # noqa: E402
from gan_common import GLOBAL, engine_gan  # noqa: E402


def double_backward(precision, gas, steps=3, stage=0):
    """Two losses per micro-step, each with its own backward, then step: must equal one backward of the sum."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    model = build_model()
    cfg = ds_config(precision, gas, world, clip=0.0)
    cfg["zero_optimization"] = {"stage": stage}
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]
    for step in range(steps):
        x, y = global_batch(step, MICRO * gas * world)
        for i in range(gas):
            lo = (i * world + rank) * MICRO
            out = engine(x[lo:lo + MICRO]).float()
            first = torch.nn.functional.mse_loss(out[:, :4], y[lo:lo + MICRO, :4])
            second = torch.nn.functional.mse_loss(out[:, 4:], y[lo:lo + MICRO, 4:])
            engine.backward(first, retain_graph=True)
            engine.backward(second)
            engine.step()
    from dsfast.utils import safe_get_full_fp32_param
    return [safe_get_full_fp32_param(p).clone() for p in model.parameters()]


def edited_after_backward(offload, edit=True, steps=3):
    """Stage 1, GAS 2: a gradient cleared (step 0) or zeroed in place (steps 1, 2) between the boundary's backward
    and the step. Offloaded to a distinct host (the gradient shards are copied to the host as their reduction
    lands, during backward), the step must still apply the edited gradients, as without offload."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    model = build_model()
    cfg = ds_config("fp32", 2, world, clip=0.0)
    cfg["zero_optimization"] = {"stage": 1}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        os.environ["DSFAST_TEST_PLACEMENT"] = "distinct-host"
    try:
        engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]
    finally:
        os.environ.pop("DSFAST_TEST_PLACEMENT", None)
    for step in range(steps):
        x, y = global_batch(step, MICRO * 2 * world)
        for i in range(2):
            lo = (i * world + rank) * MICRO
            engine.backward(torch.nn.functional.mse_loss(engine(x[lo:lo + MICRO]), y[lo:lo + MICRO]))
            if edit and engine.is_gradient_accumulation_boundary():
                if step == 0:
                    model[0].bias.grad = None
                else:
                    model[3 if step == 1 else 5].weight.grad.zero_()
            engine.step()
    from dsfast.utils import safe_get_full_fp32_param
    return [safe_get_full_fp32_param(p).clone() for p in model.parameters()]


def plain_backward_refused():
    model = build_model()
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(),
                               config=ds_config("fp32", 1, torch.distributed.get_world_size(), clip=0.0))[0]
    before = [p.detach().clone() for p in model.parameters()]
    x, y = global_batch(0, MICRO)
    torch.nn.functional.mse_loss(engine(x), y).backward()
    try:
        engine.step()
        message = "accepted"
    except RuntimeError as err:
        message = str(err)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return message, unchanged


def main():
    dsfast.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    share = GLOBAL // world
    record = {"gan": engine_gan(dsfast.initialize, 6, part=slice(rank * share, (rank + 1) * share), micro=share),
              "double_fp32_gas1": double_backward("fp32", 1), "double_fp32_gas2": double_backward("fp32", 2),
              "double_bf16_gas2": double_backward("bf16", 2), "plain": plain_backward_refused(),
              **{f"double_fp32_gas2_s{z}": double_backward("fp32", 2, stage=z) for z in (1, 2, 3)},
              **{f"edited_offload{int(o)}": edited_after_backward(o) for o in (False, True)},
              "unedited": edited_after_backward(False, edit=False)}
    gathered = gather_records(record)
    if rank == 0:
        torch.save(gathered, sys.argv[1])


if __name__ == "__main__":
    main()
