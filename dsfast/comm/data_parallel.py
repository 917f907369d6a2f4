"""The data-parallel ranks an engine trains over, as one object: initialize() makes it once and hands it down to
the state owner and its reductions, which never reach for the global process group on their own."""
from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist


@dataclass(frozen=True)
class DataParallel:
    group: Optional[object]   # the process group (None: the default one)
    rank: int                 # this process's rank in it
    world: int                # how many ranks train together

    @property
    def distributed(self):
        """Collectives are needed (and a process group exists)."""
        return self.world > 1 or (dist.is_available() and dist.is_initialized())


def data_parallel(group=None):
    """The DataParallel of `group` (the default group; a world of one without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DataParallel(None, 0, 1)
    return DataParallel(group, dist.get_rank(group), dist.get_world_size(group))
