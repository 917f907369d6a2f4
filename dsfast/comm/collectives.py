"""deepspeed.comm's collectives and point-to-point calls: DeepSpeed's signatures, torch.distributed underneath.

DeepSpeed's comm API mirrors torch.distributed; the extra `prof`, `log_name` and `debug` arguments feed its
communication logger, which dsfast does not have: they are accepted and have no effect. `ReduceOp` is
torch's, so torch's and deepspeed.comm's operators are the same objects here.
"""
import functools
import inspect

import torch.distributed as dist

from .queries import needs_group
from .where import at, done, issued, wait_now

ReduceOp = dist.ReduceOp

# torch 2.13 renamed these two (the old names still work but warn on every call)
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _watched(fn):
    """Tag the call for the hang watch (where.py) while it runs; the work handle an async call returns is recorded
    (the watch asks it whether it finished). A blocking call that takes async_op is issued async and waited on its
    recorded handle: on NCCL a blocking collective returns once queued, and the host then hangs later, elsewhere;
    the handle is what tells the watch which collective that is."""
    what = ("deepspeed.comm", fn.__name__)
    params = list(inspect.signature(fn).parameters)
    # (inference_all_reduce has async_op for DeepSpeed's signature only: it is always synchronous)
    at_pos = params.index("async_op") if "async_op" in params and fn.__name__ != "inference_all_reduce" else None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if at_pos is not None:
            asked = args[at_pos] if len(args) > at_pos else kwargs.get("async_op", False)
            if not asked:
                if len(args) > at_pos:
                    args = args[:at_pos] + (True,) + args[at_pos + 1:]
                else:
                    kwargs["async_op"] = True
                work = fn(*args, **kwargs)
                if work is not None:
                    wait_now(work, what)
                return None
        at(what)
        out = fn(*args, **kwargs)
        done()
        if out is not None and hasattr(out, "is_completed"):
            issued(out, what)
        elif type(out) is list:   # batch_isend_irecv
            for work in out:
                issued(work, what)
        return out
    return wrapper


class _Handles:
    """Several async works that the caller waits on as one (DeepSpeed's coalesced calls return one handle)."""

    def __init__(self, works):
        self.works = [w for w in works if w is not None]

    def wait(self):
        for w in self.works:
            w.wait()
        return True

    def is_completed(self):
        return all(w.is_completed() for w in self.works)


@needs_group
@_watched
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name="all_reduce",
               debug=None):
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


@needs_group
@_watched
def inference_all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name="all_reduce",
                         debug=None):
    # DeepSpeed's shared-memory kernel for inference; the result is the same synchronous all-reduce
    if dist.get_world_size(group=group) <= 1:
        return tensor
    return wait_now(dist.all_reduce(tensor, op=op, group=group, async_op=True), ("deepspeed.comm", "all_reduce"))


@needs_group
@_watched
def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name="all_reduce",
                         debug=None):
    works = [dist.all_reduce(t, op=op, group=group, async_op=True) for t in tensors]
    handle = _Handles(works)
    if async_op:
        return handle
    handle.wait()
    return None


@needs_group
@_watched
def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name="reduce", debug=None):
    return dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)


@needs_group
@_watched
def broadcast(tensor, src, group=None, async_op=False, prof=False, log_name="broadcast", debug=None):
    return dist.broadcast(tensor, src, group=group, async_op=async_op)


@needs_group
@_watched
def broadcast_object_list(object_list, src, group=None, device=None, prof=False, log_name="broadcast_object_list",
                          debug=None):
    return dist.broadcast_object_list(object_list, src, group=group, device=device)


@needs_group
@_watched
def all_gather(tensor_list, tensor, group=None, async_op=False, prof=False, log_name="all_gather", debug=None):
    return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


@needs_group
@_watched
def all_gather_object(object_list, obj, group=None, prof=False, log_name="all_gather_object", debug=None):
    return dist.all_gather_object(object_list, obj, group=group)


@needs_group
@_watched
def all_gather_into_tensor(output_tensor, tensor, group=None, async_op=False, prof=False,
                           log_name="all_gather_into_tensor", debug=None):
    return _all_gather_single(output_tensor, tensor, group=group, async_op=async_op)


def allgather_fn(output_tensor, input_tensor, group=None, async_op=False, debug=None):
    return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


@needs_group
@_watched
def all_gather_coalesced(output_tensors, input_tensors, group=None, async_op=False):
    if len(output_tensors) != len(input_tensors):
        raise ValueError(f"all_gather_coalesced: {len(output_tensors)} output tensors for {len(input_tensors)} "
                         "inputs; give one output per input")
    handle = _Handles([_all_gather_single(o, i, group=group, async_op=True)
                       for o, i in zip(output_tensors, input_tensors)])
    if async_op:
        return handle
    handle.wait()
    return None


@needs_group
@_watched
def reduce_scatter_tensor(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
                          log_name="reduce_scatter_tensor", debug=None):
    return _reduce_scatter_single(output_tensor, tensor, op=op, group=group, async_op=async_op)


def reduce_scatter_fn(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False, debug=None):
    return reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)


@needs_group
@_watched
def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
                   log_name="reduce_scatter", debug=None):
    return dist.reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)


@needs_group
@_watched
def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False,
                      prof=False, log_name="all_to_all_single", debug=None):
    return dist.all_to_all_single(output, tensor, output_split_sizes=output_split_sizes,
                                  input_split_sizes=input_split_sizes, group=group, async_op=async_op)


@needs_group
@_watched
def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, prof=False, log_name="all_to_all",
               debug=None):
    return dist.all_to_all(output_tensor_list, input_tensor_list, group=group, async_op=async_op)


@needs_group
@_watched
def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, prof=False, log_name="gather", debug=None):
    return dist.gather(tensor, gather_list=gather_list, dst=dst, group=group, async_op=async_op)


@needs_group
@_watched
def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, prof=False, log_name="scatter",
            debug=None):
    return dist.scatter(tensor, scatter_list=scatter_list, src=src, group=group, async_op=async_op)


@needs_group
@_watched
def send(tensor, dst, group=None, tag=0, prof=False, log_name="send", debug=None):
    return dist.send(tensor, dst, group=group, tag=tag)


@needs_group
@_watched
def recv(tensor, src=None, group=None, tag=0, prof=False, log_name="recv", debug=None):
    return dist.recv(tensor, src, group=group, tag=tag)


@needs_group
@_watched
def isend(tensor, dst, group=None, tag=0, prof=False, log_name="isend", debug=None):
    return dist.isend(tensor, dst, group=group, tag=tag)


@needs_group
@_watched
def irecv(tensor, src=None, group=None, tag=0, prof=False, log_name="irecv", debug=None):
    return dist.irecv(tensor, src, group=group, tag=tag)


class P2POp:
    """One send or receive for batch_isend_irecv; `op` is deepspeed.comm.isend or deepspeed.comm.irecv."""

    def __init__(self, op, tensor, peer, group=None, tag=0):
        if op not in (isend, irecv, dist.isend, dist.irecv):
            raise ValueError(f"P2POp: op must be deepspeed.comm.isend or deepspeed.comm.irecv, got {op!r}")
        self.op = "isend" if op in (isend, dist.isend) else "irecv"
        self.tensor, self.peer, self.group, self.tag = tensor, peer, group, tag


@needs_group
@_watched
def batch_isend_irecv(p2p_op_list, prof=False, log_name="batch_isend_irecv", debug=None):
    ops = [dist.P2POp(getattr(dist, p.op), p.tensor, p.peer, p.group, p.tag) for p in p2p_op_list]
    return dist.batch_isend_irecv(ops)


@needs_group
@_watched
def barrier(group=None, async_op=False, device_ids=None, prof=False, log_name="barrier", debug=None):
    return dist.barrier(group=group, async_op=async_op, device_ids=device_ids)


@needs_group
@_watched
def monitored_barrier(group=None, timeout=None, wait_all_ranks=False, prof=False, log_name="monitored_barrier",
                      debug=None):
    return dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


__all__ = ["ReduceOp", "all_reduce", "inference_all_reduce", "all_reduce_coalesced", "reduce", "broadcast",
           "broadcast_object_list", "all_gather", "all_gather_object", "all_gather_into_tensor", "allgather_fn",
           "all_gather_coalesced", "reduce_scatter_tensor", "reduce_scatter_fn", "reduce_scatter",
           "all_to_all_single", "all_to_all", "gather", "scatter", "send", "recv", "isend", "irecv", "P2POp",
           "batch_isend_irecv", "barrier", "monitored_barrier"]
