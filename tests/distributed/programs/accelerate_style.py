"""Hugging Face accelerate's DeepSpeed example shape (a config with optimizer and scheduler sections, DummyOptim /
DummyScheduler, save_state / load_state, save_pretrained of get_state_dict at the end), with `deepspeed` pointing at
dsfast through `dsfast alias install --target`. Phase "full" trains 8 steps and saves its state at step 4; phase
"resume" loads that state and trains steps 5-8. Both end with accelerate's final save, which at ZeRO stage 3 calls
model.state_dict() on every rank (get_state_dict returns None on ranks > 0). Rank 0 prints the losses.

    python accelerate_style.py OUT_DIR full|resume      (STAGE from the environment)
"""
import json
import os
import sys

import torch
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.utils import DummyOptim, DummyScheduler, InitProcessGroupKwargs
from transformers import GPT2Config, GPT2LMHeadModel

argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
out, phase = argv[0], argv[1]
stage = int(os.environ.get("STAGE", "3"))
STEPS, SAVE_AT = 8, 4


class Data(torch.utils.data.Dataset):
    def __init__(self, n=64):
        self.ids = torch.randint(0, 128, (n, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


ds_config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
             "steps_per_print": 1000,
             "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True,
                                   "stage3_param_persistence_threshold": 0},    # every parameter partitioned
             "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
             "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3,
                                                               "warmup_num_steps": 2, "total_num_steps": STEPS}}}
# gloo: on CPU ranks accelerate picks no backend by itself (its cpu=True would turn DeepSpeed off)
accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config),
                          kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                   eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))  # no RNG
optimizer = DummyOptim(model.parameters())
scheduler = DummyScheduler(optimizer)
loader = torch.utils.data.DataLoader(Data(), batch_size=4, shuffle=False)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

start = 0
if phase == "resume":
    accelerator.load_state(os.path.join(out, f"step{SAVE_AT}"))
    start = SAVE_AT
losses = []
batches = iter(loader)
for step in range(STEPS):
    batch = next(batches)
    if step < start:
        continue
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    losses.append(accelerator.gather(loss.detach()).mean().item())
    if phase == "full" and step + 1 == SAVE_AT:
        accelerator.save_state(os.path.join(out, f"step{SAVE_AT}"))

accelerator.wait_for_everyone()
unwrapped = accelerator.unwrap_model(model)
unwrapped.save_pretrained(os.path.join(out, "final-" + phase), is_main_process=accelerator.is_main_process,
                          save_function=accelerator.save, state_dict=accelerator.get_state_dict(model))
import deepspeed  # noqa: E402
if accelerator.is_main_process:
    print("RESULT " + json.dumps({"losses": losses, "distributed_type": str(accelerator.distributed_type),
                                  "deepspeed": deepspeed.__name__, "engine": type(model).__module__}), flush=True)
accelerator.end_training()
