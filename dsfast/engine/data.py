"""`training_data` -> a DataLoader whose every rank sees a different shard of the dataset.

Semantics (stated because they decide what each rank trains on):
- Sampling: a DistributedSampler over the data-parallel world, shuffled with a seed shared by all ranks
  (`seed`, default 0) and a new permutation each epoch (the loader calls `set_epoch` itself on every new pass).
- Uneven datasets: the sampler never drops samples; it pads the shard of the shorter ranks by repeating samples
  from the start, so every rank has ceil(N / world) samples and the same number of micro-batches (no rank waits
  forever in a collective).
- `drop_last` (config key `dataloader_drop_last`, default false as in DeepSpeed): when true, each rank drops its
  final micro-batch if it is smaller than `train_micro_batch_size_per_gpu`; when false that short batch is kept.
- Batch size: `train_micro_batch_size_per_gpu` samples per rank per micro-step.
"""
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data.distributed import DistributedSampler


class EpochDataLoader(DataLoader):
    """A DataLoader that advances its DistributedSampler's epoch on each new pass over the data."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch = 0

    def __iter__(self):
        if isinstance(self.sampler, DistributedSampler):
            self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        return super().__iter__()


def build_dataloader(dataset, micro_batch_size, world_size, rank, collate_fn=None, drop_last=False,
                     num_workers=0, seed=0, pin_memory=False):
    if isinstance(dataset, IterableDataset):
        raise TypeError("training_data is an IterableDataset, which cannot be sharded by a DistributedSampler; "
                        "shard it yourself and build the DataLoader in your script")
    if not isinstance(dataset, Dataset) and not hasattr(dataset, "__getitem__"):
        raise TypeError(f"training_data must be a torch Dataset (map-style, with __len__ and __getitem__); "
                        f"got {type(dataset).__name__}")
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
                                 drop_last=False)
    return EpochDataLoader(dataset, batch_size=micro_batch_size, sampler=sampler, collate_fn=collate_fn,
                           drop_last=drop_last, num_workers=num_workers,
                           pin_memory=pin_memory and torch.cuda.is_available())
