"""Show it: 2 CPU ranks at ZeRO stage 3 train a ~1B-parameter fp32 GPT built under zero.Init on one 24 GiB machine,
where a full replica per rank (DDP / stage 0: 16 bytes a parameter, 2 x 16 GB) cannot fit.

    python benchmarks/zero3_1b.py [--steps 3] [--d_model 2048] [--n_layer 20]
Each rank prints its peak RSS next to the stage-3 formula (16 psi / N model states) and the stage-0 one; rank 0
prints the loss of every step (it must go down: lr 1e-3 on one repeated batch).
"""
import argparse
import os
import resource
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def worker(args):
    import torch
    sys.path.insert(0, os.path.join(REPO, "examples", "gpt"))
    from model import GPT, GPTConfig
    import dsfast
    from dsfast.zero import model_state_bytes
    torch.set_num_threads(1)
    dsfast.init_distributed(verbose=False)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    cfg = GPTConfig(vocab_size=8192, seq_len=args.seq, n_layer=args.n_layer, n_head=16, d_model=args.d_model)
    ds_config = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9, "gradient_clipping": 1.0,
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
                 "zero_optimization": {"stage": 3}}
    t0 = time.time()
    torch.manual_seed(0)
    with dsfast.zero.Init(config_dict_or_path=ds_config):
        model = GPT(cfg)
    engine, *_ = dsfast.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    psi = sum(getattr(p, "ds_numel", None) or p._dsfast_z3.numel for p in model.parameters())
    built = time.time() - t0
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (1, args.seq + 1), generator=g)
    losses = []
    for step in range(args.steps):
        t = time.time()
        loss = engine(x[:, :-1], x[:, 1:])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.4f} ({time.time() - t:.1f} s)", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    z3 = sum(model_state_bytes(psi, world, 3, False).values())
    z0 = sum(model_state_bytes(psi, world, 0, False).values())
    mem = sum(engine.memory_breakdown()["total"].values())
    print(f"[rank {rank}] {psi / 1e9:.2f}B params built under zero.Init in {built:.0f} s | model states "
          f"{mem / 2**30:.2f} GiB (formula 16psi/N = {z3 / 2**30:.2f} GiB; a stage-0 replica needs "
          f"{z0 / 2**30:.1f} GiB) | peak RSS {peak / 2**30:.2f} GiB", flush=True)
    if rank == 0 and not losses[-1] < losses[0]:
        raise SystemExit("the loss did not go down")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--d_model", type=int, default=2048)
    p.add_argument("--n_layer", type=int, default=20)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]],
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.nprocs), LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                                       PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
             for r in range(args.nprocs)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
