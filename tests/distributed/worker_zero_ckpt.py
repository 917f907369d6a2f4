"""One rank of the ZeRO checkpoint checks; rank 0 writes the results. Runs use zero_common's format.

  save RUN N DIR OUT      train steps [0, N), save (tag "t{N}", client_sd={"step": N}), train [N, RUN's steps);
                          OUT gets the final full parameters (the uninterrupted run)
  resume RUN DIR OUT      a fresh engine for RUN (any stage, world size, offload), load `latest`, train from the
                          saved step to RUN's steps; OUT gets the final full parameters
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
from zero_common import full_params, make_engine, parse, train  # noqa: E402


def main():
    dsfast.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    mode, spec = sys.argv[1], parse(sys.argv[2])
    engine = make_engine(dsfast.initialize, spec, world)
    if mode == "save":
        n, ckpt, out = int(sys.argv[3]), sys.argv[4], sys.argv[5]
        train(dsfast.initialize, dict(spec, steps=n), rank, world, engine=engine)
        engine.save_checkpoint(ckpt, tag=f"t{n}", client_sd={"step": n})
        first = n
    else:
        ckpt, out = sys.argv[3], sys.argv[4]
        path, client = engine.load_checkpoint(ckpt)
        assert path is not None, f"nothing loaded from {ckpt}"
        first = client["step"]
    train(dsfast.initialize, spec, rank, world, engine=engine, first=first)
    params = full_params(engine)
    states = {str(v.dtype) for st in engine.optimizer.state.values() for v in st.values()
              if torch.is_tensor(v) and v.numel() > 1}
    masters = {str(p.dtype) for g in engine.optimizer.param_groups for p in g["params"]}
    if rank == 0:
        torch.save({"params": params, "global_steps": engine.global_steps, "state_dtypes": states,
                    "master_dtypes": masters}, out)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
