"""Issue 21's demonstration: ZeRO stage 3 with the parameters and the optimizer states on NVMe trains a GPT whose
model states (16 bytes a parameter: bf16 params and grads, fp32 masters and Adam moments) are larger than the
machine's memory, on N CPU ranks of one host; CPU offload of the same model cannot start (a rank is OOM-killed).

Each rank builds examples/gpt/model.py's GPT in fp32 under zero.Init (no rank ever holds the whole model), then
trains --steps steps at bf16 on one fixed random batch (AdamW lr 1e-3, clipping 1.0), and reports its parameter
count, the model states (16 psi, 16 psi / N per rank) beside its peak RSS, init and step times, the bytes it read
from and wrote to the disk per step (/proc/self/io), and (dsfast) engine.memory_breakdown(). Rank 0 prints one
JSON line with every rank's figures and a summary against MemTotal. The sizes of the given flags are printed before
anything starts, so a run can be sized first (--dry-run prints them only).

    # small check (seconds; 8.4M params: big enough that DeepSpeed swaps, it keeps any tensor under
    # max(1 MiB, aio block_size) in memory), dsfast then DeepSpeed (run by --python, default /work/venv-ds/bin/python)
    python benchmarks/nvme_demo.py --dir /var/tmp --d_model 512 --n_layer 2 --vocab 4096
    python benchmarks/nvme_demo.py --dir /var/tmp --d_model 512 --n_layer 2 --vocab 4096 --impl deepspeed
    # the demonstration (the default sizes): 2.54B params, 16 psi = 37.8 GiB of model states, 1.6x a 23.5 GiB machine
    python benchmarks/nvme_demo.py --dir /var/tmp --d_model 2560 --n_layer 32 --vocab 8192 --dry-run
    python benchmarks/nvme_demo.py --dir /var/tmp --d_model 2560 --n_layer 32 --vocab 8192 [--impl deepspeed]
    python benchmarks/nvme_demo.py --dir /var/tmp --d_model 2560 --n_layer 32 --vocab 8192 --overlap-step
                                                                    # the same with the host step overlapped
    python benchmarks/nvme_demo.py --dir /var/tmp --d_model 2560 --n_layer 32 --vocab 8192 --offload cpu
                                                                    # expected: "cannot start" (the OOM killer)

The last one exhausts the machine's memory on purpose: run it on a machine nobody else is using. --dir must be on
the disk (a tmpfs is refused: it is memory); the swap files go to a fresh directory in it, removed at the end.
DeepSpeed runs with DS_ACCELERATOR=cpu and gloo; its first run builds its async_io (needs libaio-dev), cpu_adam and
shm_comm ops into ~/.cache/torch_extensions (about 8, 1.5 and 1 minutes on 2 cores), later runs load them.
"""
import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GIB = float(1 << 30)


def count(n):
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.3f}M"


def size(b):
    return f"{b / GIB:.2f} GiB" if b >= 1 << 28 else f"{b / (1 << 20):.1f} MiB"


def gpt_sizes(a):
    """(params, largest parameter's numel) of examples/gpt/model.py's GPT; the ranks check it against the model."""
    d, v = a.d_model, a.vocab
    block = 12 * d * d + 13 * d        # qkv 3d^2+3d, proj d^2+d, fc 4d^2+4d, out 4d^2+d, two LayerNorms 4d
    psi = v * d + a.seq * d + a.n_layer * block + 2 * d   # the head is tied to the token embedding
    return psi, max(v * d, 4 * d * d, a.seq * d)


def ds_config(a, nvme_dir):
    _, largest = gpt_sizes(a)
    if a.offload == "cpu":     # the comparison: both offloads to host memory
        opt = {"device": "cpu", "pin_memory": False}
        par = {"device": "cpu", "pin_memory": False}
    else:
        opt = {"device": "nvme", "nvme_path": nvme_dir, "buffer_count": 4, "pin_memory": False}
        par = {"device": a.param_offload, "pin_memory": False}
        if a.param_offload == "nvme":
            # DeepSpeed requires buffer_size >= the largest parameter; max_in_cpu 0: nothing kept in memory
            par.update(nvme_path=nvme_dir, buffer_count=a.param_buffers, buffer_size=largest, max_in_cpu=0)
    if a.overlap_step:   # issue 28: the host step (and its swap) overlapped with the next forward
        opt["overlap_step"] = True
    cfg = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10 ** 9, "gradient_clipping": 1.0,
           "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
           "zero_optimization": {"stage": 3, "offload_optimizer": opt, "offload_param": par,
                                 "sub_group_size": int(3e7), "stage3_param_persistence_threshold": int(1e4)}}
    if "nvme" in (opt["device"], par["device"]):
        cfg["aio"] = {"block_size": 1048576, "queue_depth": 8, "thread_count": 2, "single_submit": False,
                      "overlap_events": True}
    return cfg


def mem_total():
    """The machine's MemTotal (bytes), from /proc/meminfo."""
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024


def disk_io():
    """This process's bytes read from and written to storage so far (the kernel's count, threads included)."""
    d = dict(line.split(":") for line in open("/proc/self/io"))
    return int(d["read_bytes"]), int(d["write_bytes"])


def worker(a):
    import torch
    sys.path.insert(0, os.path.join(REPO, "examples", "gpt"))
    from model import GPT, GPTConfig
    if a.impl == "dsfast":
        import dsfast as deepspeed
    else:
        import deepspeed
    torch.set_num_threads(1)          # N ranks share the host's cores (OMP_NUM_THREADS=1 too)
    deepspeed.init_distributed(dist_backend="gloo")   # DeepSpeed's CPU accelerator would ask for oneCCL
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    cfg = ds_config(a, os.environ["NVME_DEMO_DIR"])
    gcfg = GPTConfig(vocab_size=a.vocab, seq_len=a.seq, n_layer=a.n_layer, n_head=a.n_head, d_model=a.d_model)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=cfg):   # each parameter is partitioned as soon as it is made
        model = GPT(gcfg)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    init_s = time.perf_counter() - t0
    print(f"[rank {rank}] initialized", file=sys.stderr, flush=True)   # the parent: died before or after starting
    psi = sum(getattr(p, "ds_numel", None) or p._dsfast_z3.numel for p in model.parameters())
    assert psi == gpt_sizes(a)[0], f"the model has {psi} params, gpt_sizes says {gpt_sizes(a)[0]}"
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, a.vocab, (1, a.seq + 1), generator=g)   # one fixed batch: the loss must go down
    losses, times, io = [], [], []
    for step in range(a.steps):
        before, t = disk_io(), time.perf_counter()
        loss = engine(x[:, :-1], x[:, 1:])
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t)
        io.append([n - b for n, b in zip(disk_io(), before)])
        losses.append(float(loss.detach()))
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.4f} ({times[-1]:.1f} s)", flush=True)
    res = {"rank": rank, "params": psi, "states_bytes": 16 * psi, "states_per_rank_bytes": 16 * psi // world,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "init_s": init_s,
           "step_s": times, "io_per_step": io, "losses": losses,
           "memory_breakdown": engine.memory_breakdown()["total"] if a.impl == "dsfast" else None}
    everyone = [None] * world if rank == 0 else None
    torch.distributed.gather_object(res, everyone, dst=0)
    if rank == 0:
        for r in everyone:   # rank 0 prints them all: N ranks writing to one stdout interleave their lines
            steps = " ".join(f"{t:.1f}" for t in r["step_s"])
            disk = " ".join(f"{size(rd)}/{size(wr)}" for rd, wr in r["io_per_step"])
            mb = r["memory_breakdown"]
            print(f"[rank {r['rank']}] {count(r['params'])} params | states 16 psi {size(r['states_bytes'])}, "
                  f"16 psi/N {size(r['states_per_rank_bytes'])} | peak RSS {size(r['peak_rss_bytes'])} | init "
                  f"{r['init_s']:.1f} s | steps {steps} s | disk read/written per step {disk}"
                  + (" | memory_breakdown " + ", ".join(f"{k} {size(v)}" for k, v in mb.items()) if mb else ""))
        total = mem_total()
        print(json.dumps({"impl": a.impl, "offload": a.offload, "param_offload": cfg["zero_optimization"][
            "offload_param"]["device"], "world": world, "mem_total_bytes": total, "config": cfg,
                          "ranks": everyone}), flush=True)
        peak = max(r["peak_rss_bytes"] for r in everyone)
        mode = " + overlap_step" if a.overlap_step else ""
        print(f"{a.impl}{mode}: {count(psi)} params, model states {size(16 * psi)} = "
              f"{16 * psi / total:.2f}x MemTotal ({total / GIB:.1f} GiB); {world} ranks, peak RSS "
              f"{size(peak)} per rank at most ({world * peak / total:.2f}x MemTotal all together); "
              f"init {max(r['init_s'] for r in everyone):.1f} s; loss {losses[0]:.4f} -> {losses[-1]:.4f} "
              f"({'down' if losses[-1] < losses[0] else 'NOT down'})", flush=True)


def overlap_refusal(a):
    """Why --overlap-step cannot run ("" where it can): DeepSpeed has no such key; a dsfast without it refuses it."""
    if a.impl != "dsfast":
        return "--overlap-step is dsfast's own key (offload_optimizer.overlap_step): not with --impl deepspeed"
    sys.path.insert(0, REPO)
    from dsfast.config import DsConfigError, parse_config
    try:
        parse_config(ds_config(a, "/nonexistent"))
    except DsConfigError as e:
        if "overlap_step" in str(e):
            return f"--overlap-step: this dsfast refuses offload_optimizer.overlap_step (overlap: not available):\n{e}"
        raise
    return ""


def die_with_parent():
    """Runs in each rank before exec: SIGKILL it when the launcher dies (a killed launcher leaves no orphaned ranks
    holding memory and swap files)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a):
    if a.d_model % a.n_head:
        sys.exit(f"--d_model {a.d_model} is not a multiple of --n_head {a.n_head}")
    psi, largest = gpt_sizes(a)
    total = mem_total()
    print(f"d_model {a.d_model}, n_layer {a.n_layer}, vocab {a.vocab}, seq {a.seq}: {count(psi)} params "
          f"(largest {count(largest)}); model states 16 psi = {size(16 * psi)} "
          f"({size(16 * psi / a.nprocs)} per rank over {a.nprocs}) = {16 * psi / total:.2f}x this "
          f"machine's MemTotal {total / GIB:.1f} GiB (the demonstration wants >= 1.5x)", flush=True)
    if a.overlap_step:
        refusal = overlap_refusal(a)
        if refusal:
            sys.exit(refusal)
    if a.dry_run:
        return
    nvme = a.offload == "nvme"
    if nvme:
        kind = subprocess.run(["stat", "-f", "-c", "%T", a.dir], capture_output=True, text=True).stdout.strip()
        if kind == "tmpfs":
            sys.exit(f"{a.dir} is tmpfs: it is memory, not a disk; give a directory on the disk (--dir)")
    python = sys.executable if a.impl == "dsfast" else a.python
    if not shutil.which(python):
        sys.exit(f"{python}: no such python (--python: the one DeepSpeed is installed in)")
    work = tempfile.mkdtemp(prefix="nvme-demo-", dir=a.dir) if nvme else ""
    port = free_port()
    logs, procs = [], []
    try:
        for r in range(a.nprocs):
            # stderr to a file: its tail says why a rank failed; stdout (losses, reports) goes straight through
            logs.append(tempfile.TemporaryFile(mode="w+"))
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.nprocs), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(a.nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", NVME_DEMO_DIR=work,
                       PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
            procs.append(subprocess.Popen([python, os.path.abspath(__file__), "--worker", *sys.argv[1:]],
                                          env=env, stderr=logs[-1], preexec_fn=die_with_parent))
        while True:   # until every rank is done, or one fails (exit code != 0, or a signal)
            codes = [p.poll() for p in procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None or all(c == 0 for c in codes):
                break
            time.sleep(0.5)
    finally:
        for p in procs:   # the others would wait for the failed rank in a collective forever
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if work:
            shutil.rmtree(work, ignore_errors=True)
    if failed is None:
        return
    rc = procs[failed].returncode
    logs[failed].seek(0)
    err = logs[failed].read()
    started = f"[rank {failed}] initialized" in err
    why = (f"was killed by SIGKILL (exit {rc}): the OOM killer's signal, the machine ran out of memory (dmesg "
           "says so, unless someone ran kill -9)" if rc == -9 else f"failed (exit {rc})")
    print(f"\n{a.impl} with offload {a.offload}: rank {failed} {why} "
          f"{'during training' if started else 'before initialize finished: the model CANNOT START'} "
          f"(model states {size(16 * psi)} = {16 * psi / total:.2f}x MemTotal).\n"
          f"--- rank {failed} stderr, last lines ---\n" + ("\n".join(err.splitlines()[-30:]) or "(empty)"),
          file=sys.stderr)
    sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=("dsfast", "deepspeed"), default="dsfast")
    p.add_argument("--python", default="/work/venv-ds/bin/python", help="the python that runs --impl deepspeed")
    p.add_argument("--offload", choices=("nvme", "cpu"), default="nvme", help="where both offloads go")
    p.add_argument("--param-offload", choices=("nvme", "cpu"), default="nvme", help=argparse.SUPPRESS)  # dev: only
    # the parameters to host memory (with --offload nvme), where an implementation cannot swap them yet
    p.add_argument("--param-buffers", type=int, default=5,
                   help="offload_param.buffer_count (DeepSpeed's default 5; DeepSpeed 0.19.8 needs more here: at 5 "
                        "its second step fails with 'Not enough swap in buffers')")
    p.add_argument("--dir", default="/var/tmp", help="a directory on the NVMe disk (the swap files go under it)")
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--d_model", type=int, default=2560)
    p.add_argument("--n_layer", type=int, default=32)
    p.add_argument("--n_head", type=int, default=16)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dry-run", action="store_true", help="print the sizes of the given flags only")
    p.add_argument("--overlap-step", action="store_true",
                   help="dsfast only: offload_optimizer.overlap_step (issue 28: the host step overlapped with the "
                        "next forward; refused where this dsfast does not have the key)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    return worker(a) if a.worker else launch(a)


if __name__ == "__main__":
    main()
