"""Checkpoint save / load time and MB/s on 2 ranks, dsfast against DeepSpeed on the same model, stage and disk,
and the training stall of an asynchronous save.

    python benchmarks/checkpoint_io.py --params 100e6 --stage 2 --dir /tmp/ckpt_bench
    python benchmarks/checkpoint_io.py --params 1e6 --stage 0          # a quick check that it runs
    DS_ACCELERATOR=cpu python benchmarks/checkpoint_io.py --impl deepspeed --python /work/venv-ds/bin/python

Each implementation runs in its own 2-rank job (gloo on CPU, nccl on GPU); rank 0 prints one JSON line.
The page cache is not dropped (needs root): numbers are for a warm cache unless the files exceed memory.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time


def build_model(params):
    import torch
    width = 1024
    layers = max(1, int(params // (width * width * 4 + width * 4)))
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(width, 4 * width // 2), torch.nn.GELU(),
                                  torch.nn.Linear(4 * width // 2, width)) for _ in range(layers)]
    return torch.nn.Sequential(*blocks) if params >= 4 * width * width else torch.nn.Sequential(
        torch.nn.Linear(256, int(params // 512)), torch.nn.Linear(int(params // 512), 256))


def rank_main(args):
    import torch
    impl = __import__("deepspeed") if args.impl == "deepspeed" else __import__("dsfast")
    impl.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    rank = torch.distributed.get_rank()
    model = build_model(args.params)
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": args.stage}}
    if args.impl == "deepspeed":
        cfg["zero_allow_untested_optimizer"] = True
    engine, _, _, _ = impl.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    width = next(model.parameters()).shape[1]

    def step():
        x = torch.randn(2, width, device=engine.device)
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()

    step()
    n_params = sum(p.numel() for p in model.parameters())
    out = os.path.join(args.dir, args.impl)
    torch.distributed.barrier()
    t0 = time.perf_counter()
    engine.save_checkpoint(out, "bench")
    torch.distributed.barrier()
    save_s = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(out, "bench")) for f in fs)
    t0 = time.perf_counter()
    engine.load_checkpoint(out, "bench")
    torch.distributed.barrier()
    load_s = time.perf_counter() - t0
    result = {"impl": args.impl, "stage": args.stage, "params": n_params, "bytes": size, "save_s": save_s,
              "load_s": load_s, "save_MBps": size / save_s / 1e6, "load_MBps": size / load_s / 1e6}
    if args.impl == "dsfast":
        t_step = time.perf_counter()
        step()
        step_s = time.perf_counter() - t_step
        from dsfast.checkpoint.async_save import last_save_stats, wait_pending
        stalls = []
        for tag in ("bench_async", "bench_async2"):   # the second reuses the first one's host buffers
            t0 = time.perf_counter()
            engine.save_checkpoint(out, tag, async_save=True)
            stalls.append(time.perf_counter() - t0)
            step()
            wait_pending()
        torch.distributed.barrier()
        result.update(async_stall_s=stalls[0], async_stall_next_s=stalls[1], step_s=step_s,
                      async_write_s=last_save_stats().get("write_s"))
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def launch(args, impl):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    python = args.python if impl == "deepspeed" else sys.executable
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen([python, __file__, "--rank_job", "--impl", impl, "--params", str(args.params),
                                       "--stage", str(args.stage), "--dir", args.dir], env=env,
                                      stdout=subprocess.PIPE, text=True))
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{impl} job failed:\n" + "\n".join(outs))
    line = next(l for l in outs[0].splitlines() if l.startswith("RESULT "))
    print(line[7:], flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--params", type=float, default=100e6)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--dir", default="/tmp/dsfast_ckpt_bench")
    p.add_argument("--impl", choices=["dsfast", "deepspeed", "both"], default="dsfast")
    p.add_argument("--python", default="/work/venv-ds/bin/python", help="the interpreter that has DeepSpeed")
    p.add_argument("--rank_job", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_job:
        rank_main(args)
        return
    shutil.rmtree(args.dir, ignore_errors=True)
    for impl in (["dsfast", "deepspeed"] if args.impl == "both" else [args.impl]):
        launch(args, impl)
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
