"""One rank of the stage 3 MoE runs (moe_common.py). argv: out path, then runs "name:how:steps" with how one of
api (deepspeed.utils.set_z3_leaf_modules before initialize), config (zero_optimization.leaf_module) or none (no
leaf: the error of the first backward is recorded). Rank 0 saves {run: [every rank's record]}."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
from dp_common import gather_records  # noqa: E402
from moe_common import MoENet, SparseMoE, batch, config  # noqa: E402


def run(text):
    _, how, steps = text.split(":")
    rank = torch.distributed.get_rank()
    model = MoENet()
    leaves = []
    if how == "api":
        leaves = dsfast.utils.set_z3_leaf_modules(model, [SparseMoE])
    cfg = config({"names": ["moe"]} if how == "config" else None)
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]
    losses = []
    for step in range(int(steps)):
        x, route, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(engine(x, route), y)
        try:
            engine.backward(loss)
        except RuntimeError as err:
            if how != "none":
                raise
            return gather_records({"error": str(err), "losses": losses})
        engine.step()
        losses.append(loss.item())
    with dsfast.zero.GatheredParameters(list(engine.module.parameters())):
        params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    record = {"losses": losses, "params": params, "leaves": [type(m).__name__ for m in leaves],
              "flagged": [n for n, m in engine.module.named_modules() if dsfast.utils.z3_leaf_module(m)],
              "leaf_params": sorted(n for n, p in engine.module.named_parameters()
                                    if dsfast.utils.z3_leaf_parameter(p)),
              "path": engine.state_owner.gathers_through}
    engine.destroy()
    return gather_records(record)


def main():
    dsfast.init_distributed()
    results = {text: run(text) for text in sys.argv[2:]}
    if torch.distributed.get_rank() == 0:
        torch.save(results, sys.argv[1])


if __name__ == "__main__":
    main()
