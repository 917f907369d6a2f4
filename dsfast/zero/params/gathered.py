"""dsfast.zero.GatheredParameters: whole ZeRO stage 3 parameters for the duration of a `with` block.

    with dsfast.zero.GatheredParameters(model.parameters(), modifier_rank=0):
        if rank == 0:
            model.head.weight.zero_()
On exit the modifier rank's values are broadcast and every rank keeps its slice of them (the fp32 masters of
trained parameters take them too); with modifier_rank=None changes are discarded, as DeepSpeed does, and, unlike
DeepSpeed, with a warning naming how many parameters lost a change. A collective: every rank enters the block with
the same parameters. Parameters that are not partitioned are passed through untouched.
"""
import warnings

import torch
import torch.distributed as dist

from ...comm.where import wait_now
from .hooks import register_external_parameter
from .partitioned_param import gather, publish, record_of


class GatheredParameters:
    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if isinstance(params, torch.Tensor):
            params = [params]
        seen, self.records, self.owners = set(), [], {}
        for p in (params or []):
            owner = getattr(p, "_dsfast_owner", None)
            if owner is not None:
                self.owners[id(owner)] = owner
            rec = record_of(p)
            if rec is not None and id(rec) not in seen:
                seen.add(id(rec))
                self.records.append(rec)
        world = self.records[0].world if self.records else 1
        if modifier_rank is not None and not (isinstance(modifier_rank, int) and 0 <= modifier_rank < world):
            raise ValueError(f"GatheredParameters: modifier_rank must be None or a rank in [0, {world}); "
                             f"got {modifier_rank!r}")
        self.modifier_rank = modifier_rank
        self.enabled = enabled
        if fwd_module is not None:
            for rec in self.records:
                register_external_parameter(fwd_module, rec.param)

    def __enter__(self):
        if not self.enabled:
            return self
        for owner in self.owners.values():   # overlap_step: the values the step is writing, whole first
            owner.settle()
        fresh = [r for r in self.records if not r.gathered]
        for r in self.records:
            r.refs += 1
        gather(self.records)
        self._watch = (fresh, _fingerprints(fresh)) if self.modifier_rank is None and fresh else None
        return self

    @torch.no_grad()
    def __exit__(self, *exc):
        if not self.enabled:
            return False
        if self.modifier_rank is not None:
            for r in self.records:
                values = r.param.data
                if r.world > 1:
                    wait_now(dist.broadcast(values, src=self.modifier_rank, group=r.group, async_op=True),
                             ("GatheredParameters", [r]))
                r.set_from_full(values)   # (the master follows)
            publish(self.records)   # same-host ranks: the shared snapshot takes the new slices
        elif self._watch is not None:
            lost = _changed(*self._watch)
            if lost:
                shapes = ", ".join(str(list(r.shape)) for r in lost[:3]) + (", ..." if len(lost) > 3 else "")
                warnings.warn(f"GatheredParameters(modifier_rank=None): {len(lost)} parameter(s) of shape "
                              f"{shapes} were changed inside the block; the change is discarded on exit (as in "
                              f"DeepSpeed). Pass modifier_rank=<the rank whose values to keep> to keep it.",
                              stacklevel=2)
        for r in self.records:
            r.refs -= 1
            r.release()
        return False


# A change made through param.data bumps no version counter (.data is a new tensor each time), so what a block
# without modifier_rank changed is found by content: a float64 sum per parameter and its data pointer, taken after
# the gather and again on exit (one read of the gathered parameters, cheaper than the gather; one sync).
def _fingerprints(records):
    sums = torch.stack([r.param.data.detach().sum(dtype=torch.float64) for r in records])
    return sums, [r.param.data.data_ptr() for r in records]


def _changed(records, before):
    keep = [i for i, r in enumerate(records) if r.gathered]
    if not keep:
        return []
    records = [records[i] for i in keep]
    was, was_ptrs = before[0][keep], [before[1][i] for i in keep]
    sums, ptrs = _fingerprints(records)
    same = ((sums == was) | (sums.isnan() & was.isnan())).tolist()
    return [r for r, ok, p, q in zip(records, same, ptrs, was_ptrs) if not ok or p != q]
