"""A Hugging Face Trainer run with `deepspeed=ds_config` ("auto" values, an optimizer and a scheduler section), with
`deepspeed` pointing at dsfast. Phase "full" trains 8 optimizer steps, saving a checkpoint at step 4; phase "resume"
starts a new Trainer from checkpoint-4 and trains to step 8. Both save the final model (save_model: at stage 3 the
whole 16-bit weights, gathered). Rank 0 prints the loss log.

    python hf_trainer_style.py OUT_DIR full|resume      (STAGE, BF16 from the environment)
"""
import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]   # launchers add --local_rank=N
out, phase = argv[0], argv[1]
stage = int(os.environ.get("STAGE", "2"))


class Data(torch.utils.data.Dataset):
    def __init__(self, n=64):
        self.ids = torch.randint(0, 128, (n, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


ds_config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
             "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
             "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True},
             "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                       "weight_decay": "auto"}},
             "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                               "warmup_num_steps": "auto", "total_num_steps": "auto"}}}
args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=8,
                         learning_rate=3e-3, warmup_steps=2, logging_steps=1, save_steps=4, report_to=[],
                         deepspeed=ds_config, bf16=os.environ.get("BF16") == "1", use_cpu=True, seed=0, data_seed=0,
                         dataloader_drop_last=True)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                   eos_token_id=0))
trainer = Trainer(model=model, args=args, train_dataset=Data())
trainer.train(resume_from_checkpoint=os.path.join(out, "checkpoint-4") if phase == "resume" else None)
trainer.save_model(os.path.join(out, "final-" + phase))
import deepspeed  # noqa: E402
if int(os.environ.get("RANK", "0")) == 0:
    print("RESULT " + json.dumps({"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                                  "deepspeed": deepspeed.__name__, "engine": type(trainer.model_wrapped).__module__}),
          flush=True)
