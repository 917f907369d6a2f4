"""One rank of the deepspeed.comm API check (2 ranks, gloo): every call against its known result.

Asserts in place; a failed check exits non-zero and dist_launch shows this rank's output. Prints COMM_API_OK.
"""
import datetime
import os
import sys

import torch

import dsfast as deepspeed
from dsfast import comm as dist


def expect_not_initialized():
    for call in (dist.get_rank, dist.get_world_size, dist.get_local_rank, dist.barrier,
                 lambda: dist.all_reduce(torch.ones(1))):
        try:
            call()
        except dist.CommNotInitializedError as err:
            assert "init_distributed" in str(err), err
        else:
            raise AssertionError(f"{call} worked without a process group")
    assert dist.is_initialized() is False and dist.is_available() is True


def main():
    expect_not_initialized()
    assert deepspeed.init_distributed(dist_backend="gloo") == "gloo"
    r, w = dist.get_rank(), dist.get_world_size()
    assert (r, w) == (int(os.environ["RANK"]), 2) and dist.get_local_rank() == r
    assert dist.get_backend() == "gloo" and dist.is_initialized()
    other = 1 - r

    t = torch.tensor([r + 1.0])
    dist.all_reduce(t)
    assert t.item() == 3.0, t
    t = torch.tensor([r + 1.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert t.item() == 2.0, t
    t = torch.tensor([r + 1.0])
    dist.all_reduce(t, op=torch.distributed.ReduceOp.AVG)   # torch's operators are accepted as they are
    assert t.item() == 1.5, t
    t = torch.tensor([r + 1.0])
    dist.all_reduce(t, dist.ReduceOp.SUM, None, True).wait()  # DeepSpeed's positional order: op, group, async_op
    assert t.item() == 3.0, t

    parts = [torch.zeros(2) for _ in range(w)]
    dist.all_gather(parts, torch.full((2,), float(r)))
    assert [p.tolist() for p in parts] == [[0.0, 0.0], [1.0, 1.0]], parts
    out = torch.zeros(6)
    dist.all_gather_into_tensor(out, torch.arange(3.0) + 10 * r)
    assert out.tolist() == [0, 1, 2, 10, 11, 12], out
    out = torch.zeros(6)
    dist.allgather_fn(out, torch.arange(3.0) + 10 * r)
    assert out.tolist() == [0, 1, 2, 10, 11, 12], out

    b = torch.full((3,), float(r))
    dist.broadcast(b, src=1)
    assert b.tolist() == [1.0] * 3, b
    red = torch.tensor([r + 1.0])
    dist.reduce(red, dst=0)
    if r == 0:
        assert red.item() == 3.0, red

    src = torch.arange(4.0) + 10 * r                 # rank k receives the sum of chunk k over ranks
    got = torch.zeros(2)
    dist.reduce_scatter_tensor(got, src)
    assert got.tolist() == [10 + 4 * r, 12 + 4 * r], got
    got = torch.zeros(2)
    dist.reduce_scatter_fn(got, src)
    assert got.tolist() == [10 + 4 * r, 12 + 4 * r], got
    got = torch.zeros(2)
    dist.reduce_scatter(got, list(src.chunk(2)))
    assert got.tolist() == [10 + 4 * r, 12 + 4 * r], got

    a2a = torch.zeros(4)
    dist.all_to_all_single(a2a, torch.arange(4.0) + 10 * r)
    assert a2a.tolist() == [2 * r, 2 * r + 1, 10 + 2 * r, 11 + 2 * r], a2a
    outs = [torch.zeros(1) for _ in range(w)]
    dist.all_to_all(outs, [torch.tensor([10.0 * r + k]) for k in range(w)])
    assert [o.item() for o in outs] == [r, 10 + r], outs

    buf = torch.zeros(2)
    if r == 0:
        dist.send(torch.tensor([7.0, 8.0]), dst=1)
    else:
        dist.recv(buf, src=0)
        assert buf.tolist() == [7.0, 8.0], buf
    buf = torch.zeros(1)
    if r == 1:
        dist.isend(torch.tensor([5.0]), dst=0).wait()
    else:
        dist.irecv(buf, src=1).wait()
        assert buf.item() == 5.0, buf
    ring_in = torch.zeros(1)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.tensor([100.0 + r]), other),
                                    dist.P2POp(dist.irecv, ring_in, other)])
    for work in works:
        work.wait()
    assert ring_in.item() == 100.0 + other, ring_in

    group = dist.new_group([0, 1])
    g = torch.tensor([1.0])
    dist.all_reduce(g, group=group)
    assert g.item() == 2.0 and dist.get_world_size(group) == 2 and dist.get_rank(group) == r
    assert dist.get_global_rank(group, 1) == 1 and dist.get_global_rank(None, 0) == 0
    assert dist.get_all_ranks_from_group() == [0, 1] and dist.get_world_group() is torch.distributed.group.WORLD

    inf = torch.tensor([r + 1.0])
    dist.inference_all_reduce(inf)
    assert inf.item() == 3.0, inf
    co = [torch.tensor([1.0 + r]), torch.tensor([2.0, 3.0])]
    dist.all_reduce_coalesced(co)
    assert co[0].item() == 3.0 and co[1].tolist() == [4.0, 6.0], co
    outs = [torch.zeros(2), torch.zeros(4)]
    dist.all_gather_coalesced(outs, [torch.full((1,), float(r)), torch.full((2,), float(r))])
    assert outs[0].tolist() == [0, 1] and outs[1].tolist() == [0, 0, 1, 1], outs

    objs = [None, None]
    dist.all_gather_object(objs, {"rank": r})
    assert objs == [{"rank": 0}, {"rank": 1}], objs
    lst = [f"from {r}"]
    dist.broadcast_object_list(lst, src=0)
    assert lst == ["from 0"], lst
    gl = [torch.zeros(1) for _ in range(w)] if r == 0 else None
    dist.gather(torch.tensor([float(r)]), gather_list=gl, dst=0)
    if r == 0:
        assert [x.item() for x in gl] == [0.0, 1.0], gl
    sc = torch.zeros(1)
    dist.scatter(sc, scatter_list=[torch.tensor([40.0]), torch.tensor([41.0])] if r == 0 else None, src=0)
    assert sc.item() == 40.0 + r, sc

    assert dist.has_all_gather_into_tensor() and dist.has_reduce_scatter_tensor()
    dist.barrier()
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    assert dist.log_summary() is None and dist.log_summary(return_dict=True) == {}
    dist.destroy_process_group()
    expect_not_initialized()
    print(f"COMM_API_OK rank {r}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
