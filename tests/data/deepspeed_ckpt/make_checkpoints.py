"""Writes the small DeepSpeed 0.19 checkpoints under this folder (run once with a DeepSpeed venv; the output is
committed as test data, so the tests never need DeepSpeed):

    DS_ACCELERATOR=cpu /work/venv-ds/bin/python tests/data/deepspeed_ckpt/make_checkpoints.py

Each run starts 2 gloo ranks and writes <stage>_<dtype>/ (stages 0-3, fp32 and bf16) with 2 Adam steps on a
tiny model, plus expected.pt: the full fp32 weights (DeepSpeed's own zero_to_fp32 for stages 1-3, the masters at stage 0).
"""
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.LayerNorm(10), torch.nn.Linear(10, 3))


def rank_main(stage, dtype):
    import torch
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    m = model()
    engine, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)
    for step in range(2):
        g = torch.Generator().manual_seed(step * 10 + rank)
        x, y = torch.randn(2, 6, generator=g), torch.randn(2, 3, generator=g)
        x = x.to(engine.device, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
        loss = torch.nn.functional.mse_loss(engine(x).float(), y.to(engine.device))
        engine.backward(loss)
        engine.step()
    out = os.path.join(HERE, f"stage{stage}_{dtype}")
    engine.save_checkpoint(out, tag="global_step2", client_state={"step": 2, "note": "ds"})
    torch.distributed.barrier()
    if rank == 0:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        full = get_fp32_state_dict_from_zero_checkpoint(out) if stage > 0 else {
            k: v.float() for k, v in engine.module.state_dict().items()}
        if stage == 0 and dtype == "bf16":   # the fp32 masters, not the bf16 module weights
            masters = [p for g in engine.optimizer.fp32_groups for p in g]
            full = dict(zip([n for n, _ in m.named_parameters()], masters))
        torch.save({k: v.detach().float().clone() for k, v in full.items()}, os.path.join(out, "expected.pt"))


def main():
    if len(sys.argv) == 3:
        rank_main(int(sys.argv[1]), sys.argv[2])
        return
    for stage in range(4):
        for dtype in ("fp32", "bf16"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            procs = []
            for rank in range(2):
                env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
                procs.append(subprocess.Popen([sys.executable, __file__, str(stage), dtype], env=env))
            if any(p.wait() for p in procs):
                raise SystemExit(f"stage {stage} {dtype} failed")
            print(f"stage {stage} {dtype}: ok", flush=True)


if __name__ == "__main__":
    main()
