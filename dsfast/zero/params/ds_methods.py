"""The methods DeepSpeed puts on every ZeRO stage 3 parameter that programs call, and the handle types they return:

    param.all_gather_coalesced(params).wait()    every parameter in `params` whole (a collective)
    param.all_gather(param_list=None)            the same, for param_list or this parameter alone
    param.partition(param_list=None)             back to this rank's slice (what nothing else holds)
dsfast's gather completes before it returns, so the handles' wait() has nothing left to do; they exist so that
DeepSpeed's call shapes (h.wait(), MultipleAllGatherHandles([...]).wait(handle_dependency=...)) work unchanged.
"""
from .partitioned_param import gather, record_of


class AllGatherCoalescedHandle:
    """What all_gather_coalesced returns: the gather is complete already."""

    def wait(self, handle_dependency=True):
        return None


class MultipleAllGatherHandles:
    """Several gather handles waited on as one (DeepSpeed's type of the same name)."""

    def __init__(self, handles):
        self.handles = handles

    def wait(self, handle_dependency=True):
        for handle in self.handles:   # by keyword: some handles' wait() takes it keyword-only or as **kwargs
            handle.wait(handle_dependency=handle_dependency)


def _records(params, api):
    if params is None:
        raise TypeError(f"{api}: params must be an iterable of ZeRO stage 3 parameters, got None")
    records = []
    for i, p in enumerate(params):
        rec = record_of(p)
        if rec is None:
            raise ValueError(f"{api}: params[{i}] (shape {tuple(p.shape)}) is not a ZeRO stage 3 parameter (it was "
                             "not partitioned by zero.Init or a stage 3 engine); pass only partitioned parameters")
        records.append(rec)
    return records


def all_gather_coalesced(params, safe_mode=False, quantize=False):
    if quantize:
        raise ValueError("all_gather_coalesced(quantize=True): quantized weight gathers (ZeRO++ "
                         "zero_quantized_weights) are not in dsfast; call it with quantize=False")
    gather(_records(params, "all_gather_coalesced"))
    return AllGatherCoalescedHandle()


def attach(param):
    """Give a just-partitioned parameter DeepSpeed's methods (removed again with the other ds_* attributes)."""
    def all_gather(param_list=None, async_op=False, hierarchy=0):
        handle = all_gather_coalesced([param] if param_list is None else param_list)
        return handle if async_op else None

    def partition(param_list=None, hierarchy=0, has_been_updated=False, free_data=True):
        for rec in _records([param] if param_list is None else param_list, "partition"):
            rec.release()   # (a parameter still in use, e.g. inside GatheredParameters, stays whole until then)

    param.all_gather_coalesced = all_gather_coalesced
    param.all_gather = all_gather
    param.partition = partition
