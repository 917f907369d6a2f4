"""A ZeRO stage 3 fine-tuning program written the way DeepSpeed-Chat's training scripts are (its utils.py helpers:
print_rank_0, get_all_reduce_mean, _z3_params_to_fetch, moving_average, save_zero_three_model; the memory estimate
DeepSpeed's docs suggest; the model built under deepspeed.zero.Init; an EMA copy initialised as a second engine
with an inference config; at the end, step 1's save: save_hf_format's state_dict() + torch.save on rank 0 only,
then save_zero_three_model gathering on every rank and overwriting that file). Run with `deepspeed` pointing at
dsfast (tests/distributed/deepspeed_shim.py).

Rank 0 writes --out: the losses, the parameter count, the saved file's name and, for comparison, the whole weights
as GatheredParameters over every parameter shows them and the engine's consolidated 16-bit state dict.
"""
import argparse
import json
import os

import deepspeed
import torch
import torch.nn as nn
from deepspeed.compression.helper import recursive_getattr, recursive_setattr
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_live


def print_rank_0(msg, rank=0):
    if rank <= 0:
        print(msg, flush=True)


def get_all_reduce_mean(tensor):
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor / torch.distributed.get_world_size()


def _z3_params_to_fetch(param_list):
    return [p for p in param_list if hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE]


def moving_average(model, model_ema, beta=0.992, zero_stage=0):
    zero_stage_3 = zero_stage == 3
    with torch.no_grad():
        for param, param_ema in zip(model.parameters(), model_ema.parameters()):
            params_to_fetch = _z3_params_to_fetch([param, param_ema]) if zero_stage_3 else []
            should_gather_param = len(params_to_fetch) > 0
            with deepspeed.zero.GatheredParameters(params_to_fetch, enabled=should_gather_param):
                param_ema.data.copy_(torch.lerp(param.data, param_ema.data, beta))


def save_hf_format(model, output_dir):
    # DeepSpeed-Chat's: called on rank 0 only, whatever the stage (at stage 3 its state_dict() holds placeholders,
    # and save_zero_three_model writes the real weights over this file next)
    model_to_save = model.module if hasattr(model, "module") else model
    os.makedirs(output_dir, exist_ok=True)
    output_model_file = os.path.join(output_dir, "pytorch_model.bin")
    save_dict = model_to_save.state_dict()
    for key in list(save_dict.keys()):
        if "lora" in key:
            del save_dict[key]
    torch.save(save_dict, output_model_file)
    return output_model_file


def save_zero_three_model(model_ema, global_rank, save_dir, zero_stage=0):
    zero_stage_3 = zero_stage == 3
    os.makedirs(save_dir, exist_ok=True)
    output_model_file = os.path.join(save_dir, "pytorch_model.bin")
    model_to_save = model_ema.module if hasattr(model_ema, "module") else model_ema
    if not zero_stage_3:
        if global_rank == 0:
            torch.save(model_to_save.state_dict(), output_model_file)
        return output_model_file
    output_state_dict = {}
    for k, v in model_to_save.named_parameters():
        if hasattr(v, "ds_id"):
            with deepspeed.zero.GatheredParameters(_z3_params_to_fetch([v]), enabled=zero_stage_3):
                v_p = v.data.cpu()
        else:
            v_p = v.cpu()
        if global_rank == 0 and "lora" not in k:
            output_state_dict[k] = v_p
    if global_rank == 0:
        torch.save(output_state_dict, output_model_file)
    del output_state_dict
    return output_model_file


class TinyLM(nn.Module):
    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(self.norm(h + self.block(h)))


def train_config(stage):
    return {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
            "zero_optimization": {"stage": stage, "offload_param": {"device": "none"},
                                  "offload_optimizer": {"device": "none"}, "stage3_param_persistence_threshold": 0,
                                  "stage3_max_live_parameters": 3e7, "stage3_prefetch_bucket_size": 3e7,
                                  "memory_efficient_linear": False},
            "bf16": {"enabled": True}, "gradient_clipping": 1.0, "prescale_gradients": False,
            "wall_clock_breakdown": False,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.0}}}


def eval_config(stage):
    return {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 1e4,
                                  "offload_param": {"device": "none"}, "memory_efficient_linear": False},
            "bf16": {"enabled": True}, "gradient_clipping": 1.0, "prescale_gradients": False,
            "wall_clock_breakdown": False}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--zero_stage", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(1234)

    ds_config = train_config(args.zero_stage)
    with deepspeed.zero.Init(config_dict_or_path=ds_config, enabled=args.zero_stage == 3):
        model = TinyLM()
        ema = TinyLM()
    # its LoRA helpers find and swap modules by dotted name (here a parameter-free one, so training is unchanged)
    recursive_setattr(model, "block.1", type(recursive_getattr(model, "block.1"))())
    if rank == 0:
        estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=2, num_nodes=1)
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    print_rank_0(f"model has {n_params} parameters", rank)

    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    ema_engine, *_ = deepspeed.initialize(model=ema, config=eval_config(args.zero_stage))

    g = torch.Generator().manual_seed(7 + rank)
    data = torch.randint(0, 64, (4, 17), generator=g)       # each rank's micro-batch, fitted repeatedly
    losses = []
    for step in range(args.steps):
        ids = data.to(engine.device)
        logits = engine(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, 64), ids[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        moving_average(engine, ema_engine, zero_stage=args.zero_stage)
        losses.append(get_all_reduce_mean(loss.detach().clone()).item())
        print_rank_0(f"step {step} loss {losses[-1]:.4f}", rank)
        if (step + 1) % (args.steps // 2) == 0:      # two "epochs"; DeepSpeed-Chat counts them on the engine
            engine.tput_timer.update_epoch_count()

    # the end of DeepSpeed-Chat's step 1 (main.py): rank 0 saves in HF format, then stage 3 gathers and overwrites
    first_load_error = None
    if rank == 0:
        first = save_hf_format(engine, args.output_dir)
        try:                          # (for the test: what that first file holds before it is overwritten)
            torch.load(first, weights_only=False)
        except RuntimeError as err:
            first_load_error = str(err)
    if args.zero_stage == 3:
        saved = save_zero_three_model(engine, rank, args.output_dir, zero_stage=args.zero_stage)
    else:
        saved = first if rank == 0 else None
    consolidated = engine._zero3_consolidated_16bit_state_dict() if args.zero_stage == 3 else None
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=args.zero_stage == 3):
        whole = {k: v.detach().float().cpu() for k, v in engine.module.named_parameters()}
    if rank == 0:
        torch.save(whole, os.path.join(args.output_dir, "reference.bin"))
        if consolidated is not None:
            torch.save(consolidated, os.path.join(args.output_dir, "consolidated.bin"))
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "n_params": n_params, "saved": saved,
                       "engine_type": type(engine).__module__, "epochs": engine.tput_timer.epoch_count,
                       "timed_steps": engine.tput_timer.global_step_count,
                       "first_load_error": first_load_error}, f)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
