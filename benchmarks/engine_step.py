"""Engine step time at ZeRO stages 0, 1, 2 and 2 + offload: dsfast vs torch DDP (+ ZeroRedundancyOptimizer) vs
DeepSpeed at the same stage, 2 CPU ranks, one thread each; and each dsfast stage's model-state memory vs the formula.

    python benchmarks/engine_step.py                                   # dsfast + DDP (+ floor)
    DS_ACCELERATOR=cpu /work/venv-ds/bin/python benchmarks/engine_step.py   # + DeepSpeed when importable
    ... --impls ddp,zero1-torch,dsfast-z1,deepspeed-z1                 # a subset

Model: GPT of 4 blocks, d_model 256, seq 128, vocab 8192 (tied), 5.3M parameters; micro batch 8 per rank; AdamW
(lr 1e-3, wd 0.01), gradient clipping at 1.0 in every implementation:
  ddp        torch DDP, torch.optim.AdamW(fused=True), clip_grad_norm_
  dsfast     dsfast.initialize (stage 0, config optimizer AdamW -> dsfast CPUAdam; same-host ranks reduce
             gradients through shared memory)
  dsfast-gloo  the same with DSFAST_SHM_ALLREDUCE=0 (gloo all-reduce, as across hosts)
  dsfast-z1, dsfast-z2, dsfast-z2-offload   dsfast at ZeRO stage 1, 2, and 2 with offload_optimizer: cpu
  zero1-torch  DDP + torch.distributed.optim.ZeroRedundancyOptimizer(AdamW fused) (torch's ZeRO stage 1)
  deepspeed  deepspeed.initialize (stage 0, AdamW; DeepSpeed's fused Adam is CUDA-only, so torch_adam fused=True)
  deepspeed-z1, deepspeed-z2, deepspeed-z2-offload   DeepSpeed at the same stages (offload: DeepSpeedCPUAdam)
  fsdp2      torch FSDP2 (fully_shard on every block and the root, gloo), AdamW fused, clip_grad_norm_
  dsfast-z3-gloo  stage 3 through gloo collectives (as across hosts: all-gathers prefetched), not /dev/shm
  dsfast-z3, dsfast-z3-offload, deepspeed-z3, deepspeed-z3-offload   ZeRO stage 3 (offload: offload_param and
             offload_optimizer to the CPU)
  floor      forward + backward of the same model alone, no gradient sync, no optimizer (the compute ceiling)
Correctness first: after the warm-up the dsfast and DDP replicas, started from the same weights and fed the same
batches, must agree. Then the implementations are interleaved (round-robin blocks of steps), each block's time
is the slowest rank's, and the medians are compared as ratios to DDP.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7, help="round-robin rounds (one timed block per impl each)")
    p.add_argument("--block", type=int, default=5, help="steps per timed block")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per implementation")
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--impls", default="ddp,dsfast,dsfast-gloo,deepspeed,zero1-torch,dsfast-z1,deepspeed-z1,"
                                      "dsfast-z2,deepspeed-z2,dsfast-z2-offload,deepspeed-z2-offload,"
                                      "fsdp2,dsfast-z3,deepspeed-z3,dsfast-z3-offload,deepspeed-z3-offload,floor")
    p.add_argument("--bucket_elems", default="",
                   help="comma list: extra dsfast variants with zero_optimization.reduce_bucket_size set (tuning)")
    p.add_argument("--verbose", action="store_true", help="print every block's time")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def launch(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(args.nprocs):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.nprocs), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]], env=env))
    rc = [p.wait(timeout=1800) for p in procs]
    sys.exit(max(rc))


# ------------------------------------------------------------------------------------------------ worker side
def worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(REPO, "examples", "gpt"))
    from model import GPT, GPTConfig

    import dsfast
    dsfast.init_distributed(verbose=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = GPTConfig(vocab_size=8192, seq_len=128, n_layer=4, n_head=4, d_model=256)
    micro, lr, wd, clip = 8, 1e-3, 0.01, 1.0

    def fresh():
        torch.manual_seed(0)
        return GPT(cfg)

    def batch(i):
        g = torch.Generator().manual_seed(1000 * i + rank)
        x = torch.randint(0, cfg.vocab_size, (micro, cfg.seq_len + 1), generator=g)
        return x[:, :-1], x[:, 1:]

    impls = {}
    wanted = args.impls.split(",")

    def torch_step(model, opt):
        """One step of a plain torch loop: forward, backward, clip, step, zero_grad."""
        def step(i):
            loss = model(*batch(i))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    if "ddp" in wanted:
        ddp_model = torch.nn.parallel.DistributedDataParallel(fresh())
        ddp_opt = torch.optim.AdamW(ddp_model.parameters(), lr=lr, weight_decay=wd, fused=True)
        impls["ddp"] = (torch_step(ddp_model, ddp_opt), lambda: list(ddp_model.module.parameters()))
    if "zero1-torch" in wanted:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        z_model = torch.nn.parallel.DistributedDataParallel(fresh())
        z_opt = ZeroRedundancyOptimizer(z_model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr,
                                        weight_decay=wd, fused=True)
        impls["zero1-torch"] = (torch_step(z_model, z_opt), lambda: list(z_model.module.parameters()))

    def dsfast_impl(bucket=None, shm=True, stage=0, offload=False):
        os.environ["DSFAST_SHM_ALLREDUCE"] = "1" if shm else "0"
        m = fresh()
        config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1, "steps_per_print": None,
                  "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": wd}}, "gradient_clipping": clip,
                  "zero_optimization": {"stage": stage}}
        if bucket:
            config["zero_optimization"]["reduce_bucket_size"] = int(bucket)
        if offload:
            config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
            if stage == 3:
                config["zero_optimization"]["offload_param"] = {"device": "cpu"}
        engine, *_ = dsfast.initialize(model=m, model_parameters=m.parameters(), config=config)

        def ds_step(i):
            loss = engine(*batch(i))
            engine.backward(loss)
            engine.step()
        from dsfast.utils import safe_get_full_fp32_param   # whole parameters at every stage (a collective)
        return (ds_step, lambda: [safe_get_full_fp32_param(p) for p in engine.module.parameters()]), engine

    engines = {}
    if "dsfast" in wanted:
        impls["dsfast"], engine = dsfast_impl()
        engines["dsfast"] = engine
        optimizer_name = type(engine.optimizer).__name__
        buckets = [t.numel() for t in engine.state_owner.memory_tensors()["grads"]]   # stage 0: one per bucket
        optimizer_name += f"; gradient reduction: {engine.state_owner.reducer.transport}"
    if "dsfast-gloo" in wanted:
        impls["dsfast-gloo"], _ = dsfast_impl(shm=False)
    for bucket in filter(None, args.bucket_elems.split(",")):
        impls[f"dsfast@{bucket}"], _ = dsfast_impl(bucket)
    if "fsdp2" in wanted:
        try:
            from torch.distributed.fsdp import fully_shard
            f_model = fresh()
            for block in f_model.blocks:
                fully_shard(block)
            fully_shard(f_model)
            f_opt = torch.optim.AdamW(f_model.parameters(), lr=lr, weight_decay=wd)
            impls["fsdp2"] = (torch_step(f_model, f_opt), lambda: [])
        except Exception as err:   # FSDP2 on CPU/gloo is not supported by every torch build: say so, go on
            if rank == 0:
                print(f"fsdp2: cannot run here ({type(err).__name__}: {str(err)[:200]})")
    for name, stage, offload in (("dsfast-z1", 1, False), ("dsfast-z2", 2, False), ("dsfast-z2-offload", 2, True),
                                 ("dsfast-z3", 3, False), ("dsfast-z3-offload", 3, True), ("dsfast-z3-gloo", 3, False)):
        if name in wanted:
            impls[name], engines[name] = dsfast_impl(stage=stage, offload=offload, shm=not name.endswith("-gloo"))
    deepspeed = None
    if any(w.startswith("deepspeed") for w in wanted):
        try:
            import deepspeed
        except ImportError:
            if rank == 0:
                print("deepspeed: not importable here (run under /work/venv-ds with DS_ACCELERATOR=cpu)")
    for name, stage, offload in (("deepspeed", 0, False), ("deepspeed-z1", 1, False), ("deepspeed-z2", 2, False),
                                 ("deepspeed-z2-offload", 2, True), ("deepspeed-z3", 3, False),
                                 ("deepspeed-z3-offload", 3, True)):
        if deepspeed is None or name not in wanted:
            continue
        import logging
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        m = fresh()
        zero = {"stage": stage}
        opt_params = {"lr": lr, "weight_decay": wd, "torch_adam": True, "fused": True}
        if offload:   # DeepSpeed requires its CPU Adam with offload
            zero["offload_optimizer"] = {"device": "cpu"}
            if stage == 3:
                zero["offload_param"] = {"device": "cpu"}
            opt_params = {"lr": lr, "weight_decay": wd}
        ds_engine, *_ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config={
            "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
            "optimizer": {"type": "AdamW", "params": opt_params}, "gradient_clipping": clip,
            "zero_optimization": zero})

        def deepspeed_step(i, ds_engine=ds_engine):
            loss = ds_engine(*batch(i))
            ds_engine.backward(loss)
            ds_engine.step()
        impls[name] = (deepspeed_step, lambda ds_engine=ds_engine: list(ds_engine.module.parameters()))
    if "floor" in wanted:
        floor_model = fresh()

        def floor_step(i):
            floor_model(*batch(i)).backward()
            floor_model.zero_grad(set_to_none=True)
        impls["floor"] = (floor_step, lambda: [])

    # warm-up on the same batches, then the correctness check
    for name, (step, _) in impls.items():
        for i in range(args.warmup):
            step(i)
    for name in [n for n in impls if n.startswith("dsfast")] if "ddp" in impls else []:
        worst = max(float((a.detach().float() - b.detach().float()).abs().max())
                    for a, b in zip(impls["ddp"][1](), impls[name][1]()))
        if rank == 0:
            print(f"check: after {args.warmup} identical steps, max |{name} - ddp| parameter difference = "
                  f"{worst:.2e}")
        if worst > 1e-4:
            raise SystemExit(f"{name} and DDP disagree after warm-up (max diff {worst:.2e}); not timing")

    times = {name: [] for name in impls}
    cpu = {name: [] for name in impls}
    i = args.warmup
    for _ in range(args.rounds):
        for name, (step, _) in impls.items():
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.block):
                step(i)
                i += 1
            dt = torch.tensor([(time.perf_counter() - t0) / args.block])
            dc = torch.tensor([(time.process_time() - c0) / args.block / world])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            dist.all_reduce(dc)
            times[name].append(float(dt))
            cpu[name].append(float(dc))
    if rank == 0:
        n_params = sum(p.numel() for p in fresh().parameters())
        print(f"model {n_params / 1e6:.2f}M params, micro batch {micro}, seq {cfg.seq_len}, {world} ranks x 1 thread, "
              f"{args.rounds} rounds x {args.block} steps (median of per-block slowest-rank step time)")
        if "dsfast" in impls:
            print(f"dsfast optimizer: {optimizer_name}; all-reduce buckets (elements, launch order): {buckets}")
        print("per step: wall = slowest rank, median and best block; cpu = process CPU time per rank (all "
              "threads),\nmedian. On a shared machine a block runs either uncontended or with a core taken by "
              "someone else;\nthe best block estimates the uncontended time, CPU time is insensitive to that load.")
        stats = {n: (statistics.median(times[n]), min(times[n]), statistics.median(cpu[n])) for n in times}
        base = stats.get("ddp")
        for name, (med, best, cmed) in stats.items():
            if args.verbose:
                print(f"{name:16s} blocks ms: " + " ".join(f"{1000 * t:.0f}" for t in times[name]))
            line = (f"{name:16s} wall median {1000 * med:7.1f} ms  best {1000 * best:7.1f} ms  "
                    f"cpu {1000 * cmed:7.1f} ms")
            if base:
                line += (f"  | vs ddp: median x{med / base[0]:.3f}  best x{best / base[1]:.3f}  "
                         f"cpu x{cmed / base[2]:.3f}")
            print(line)
        if engines:
            from dsfast.zero import model_state_bytes
            print("\nmodel-state memory per rank (dsfast engine.memory_breakdown(), counted from the tensors; "
                  "formula: fp32 Adam, padding excluded)")
            for name, eng in engines.items():
                mem = eng.memory_breakdown()
                held = sum(v for c, per in mem.items() if c not in ("total", "comm_buffers") for v in per.values())
                stage = eng.zero_optimization_stage()
                formula = sum(model_state_bytes(n_params, world, stage, False).values())
                print(f"{name:18s} stage {stage}: {held / 2**20:7.2f} MiB  formula {formula / 2**20:7.2f} MiB  "
                      f"(x{held / formula:.3f})  " + ", ".join(f"{c} {sum(v.values()) / 2**20:.1f}"
                                                          for c, v in mem.items() if c != "total" and v))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    a = parse()
    worker(a) if a.worker else launch(a)
