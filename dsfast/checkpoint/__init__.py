"""Checkpoints: sharded safetensors + a JSON manifest, atomic commits, load at any world size or ZeRO stage.

Files, one job each:
  tags.py             user tag (str / int / float) -> a safe folder name
  safetensors_io.py   small safetensors reader / writer (no pickle), size + sha256 of each file
  jsonable.py         client_state / scheduler state <-> JSON + tensors; unsafe values refused, key named
  layout.py           the engine contract: SliceRecords (which slices this rank holds), writing masters back
  shards.py           records <-> named flat tensors; resharding on load by overlapping element ranges
  state_files.py      rank 0's module weights and engine state (counters, scaler, scheduler, client_state)
  module_slices.py    ZeRO stage 3's module weights: every rank writes its own slice; joined or read per range
  manifest.py         manifest.json: world size, stage, every parameter's slices, every file's size/sha256
  rendezvous.py       bounded waits among ranks through the process group's store (no hang on misuse)
  commit.py           temporary folder, rename into place, `latest`, the kill tests' fault points
  save.py / load.py   the two engine methods
  async_save.py       saves written from host copies by a background thread
  consolidate.py      full fp32 state_dict without GPU or process group; `dsfast consolidate`
  zero_to_fp32.py     DeepSpeed's zero_to_fp32 functions (deepspeed.utils.zero_to_fp32 re-exports them)
  deepspeed_import.py DeepSpeed 0.19 checkpoints through restricted unpickling; `dsfast convert-deepspeed`
"""
from .errors import CheckpointCorruptError, CheckpointError, CheckpointTimeoutError, UnsafeStateError
from .layout import Layout, SliceRecord, checkpoint_layout, engine_after_load


def save_checkpoint(engine, save_dir, tag=None, client_state=None, save_latest=True, async_save=None,
                    exclude_frozen_parameters=False, timeout_s=None):
    from .async_save import save
    return save(engine, save_dir, tag, client_state, save_latest, async_save, exclude_frozen_parameters, timeout_s)


def load_checkpoint(engine, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                    load_lr_scheduler_states=True, load_module_only=False):
    from .async_save import wait_pending
    from .load import load_checkpoint as _load
    wait_pending()
    return _load(engine, load_dir, tag, load_module_strict, load_optimizer_states, load_lr_scheduler_states,
                 load_module_only)


# imported here, not on first call: importing the submodule later would rebind `dsfast.checkpoint.consolidate` (the
# function) to the module of the same name
from .consolidate import consolidate


__all__ = ["save_checkpoint", "load_checkpoint", "consolidate", "CheckpointError", "CheckpointCorruptError",
           "CheckpointTimeoutError", "UnsafeStateError", "SliceRecord", "Layout", "checkpoint_layout",
           "engine_after_load"]
