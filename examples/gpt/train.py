"""Train a small byte-level GPT on public-domain text with dsfast, DeepSpeed style.

    python examples/gpt/train.py --deepspeed_config examples/gpt/ds_config.json          # 1 process
    torchrun --nproc_per_node 2 examples/gpt/train.py --deepspeed_config examples/gpt/ds_config.json
The global batch (train_batch_size) is the same in both: 1 process accumulates 2 micro-batches per step,
2 processes take one micro-batch each and average their gradients.
"""
import argparse
import os
import sys
import time

import torch

import dsfast as deepspeed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT, ByteWindows, GPTConfig  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1, help="set by DeepSpeed-style launchers")
    parser.add_argument("--steps", type=int, default=500,
                        help="optimizer steps (the ds_config.json schedule decays to 0 at step 500)")
    parser.add_argument("--data", default=os.path.join(HERE, "data", "founding.txt"))
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


@torch.no_grad()
def sample(model, prompt, n, device):
    """Greedy continuation of `prompt` by `n` bytes."""
    idx = torch.tensor([list(prompt.encode())], device=device)
    for _ in range(n):
        logits = model(idx[:, -model.cfg.seq_len:])
        idx = torch.cat([idx, logits[:, -1].float().argmax(-1, keepdim=True)], dim=1)
    return bytes(idx[0].tolist()).decode(errors="replace")


def report_model_state(engine):
    """Once (after the first step), from every rank: the model-state bytes this rank holds (counted from its tensors) next to what a
    full replica (ZeRO stage 0: 16-bit or fp32 weights, gradients, fp32 masters and Adam moments) would hold."""
    from dsfast.zero import model_state_bytes
    mem = engine.memory_breakdown()
    held = sum(mem["total"].values())
    psi = sum(p.numel() for p in engine.module.parameters() if p.requires_grad)
    world = torch.distributed.get_world_size()
    mixed = engine.fp16_enabled() or engine.bfloat16_enabled()
    replica = sum(model_state_bytes(psi, world, 0, mixed).values())
    parts = ", ".join(f"{k} {sum(v.values()) / 2**20:.2f}" for k, v in mem.items() if k != "total" and v)
    print(f"[rank {torch.distributed.get_rank()}] ZeRO stage {engine.zero_optimization_stage()}: model states "
          f"{held / 2**20:.2f} MiB ({parts}) vs {replica / 2**20:.2f} MiB at stage 0", flush=True)


def main():
    args = parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(args.seed)
    with open(args.data, "rb") as f:
        text = f.read()
    dataset = ByteWindows(text, args.seq_len)
    model = GPT(GPTConfig(seq_len=args.seq_len, d_model=args.d_model, n_layer=args.n_layer, n_head=4))

    engine, optimizer, loader, scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=dataset)
    rank = torch.distributed.get_rank()
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"model: {n_params / 1e6:.2f}M parameters | data: {len(text)} bytes, {len(dataset)} windows | "
              f"world {torch.distributed.get_world_size()} | micro batch {engine.train_micro_batch_size_per_gpu()} "
              f"x accumulation {engine.gradient_accumulation_steps()} = global batch {engine.train_batch_size()}",
              flush=True)

    engine.train()
    first = last = None
    start = time.time()
    while engine.global_steps < args.steps:
        for inputs, targets in loader:
            loss = engine(inputs.to(engine.device), targets.to(engine.device))
            engine.backward(loss)
            engine.step()
            if engine.global_steps == 1 and engine.is_gradient_accumulation_boundary():
                report_model_state(engine)   # after the first step: the optimizer states exist now
            value = loss.item()
            first = value if first is None else first
            last = value
            if engine.global_steps >= args.steps:
                break
    if rank == 0:
        print(f"done: {engine.global_steps} steps in {time.time() - start:.1f}s | loss {first:.3f} -> {last:.3f}",
              flush=True)
        engine.eval()
        print("sample:", repr(sample(engine.module, "We hold these truths", 60, engine.device)), flush=True)


if __name__ == "__main__":
    main()
