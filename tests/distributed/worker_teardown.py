"""One rank that joins a gloo group with dsfast.init_distributed, does one all-reduce and exits through
dsfast's exit hook. Env: SLEEP<rank> seconds before leaving, DIE=<rank> (os._exit(3), no hooks), RAISE=<rank>
(an uncaught exception). Prints LEAVING/DESTROY lines with wall-clock times for the test to order."""
import os
import sys
import time

import torch
import torch.distributed as dist

import dsfast
from dsfast.comm import teardown

_destroy = teardown.dist.destroy_process_group


def traced_destroy():
    print(f"DESTROY {time.time():.3f}", flush=True)
    _destroy()


teardown.dist.destroy_process_group = traced_destroy
dsfast.init_distributed(dist_backend="gloo", verbose=False)
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
assert t.tolist() == [2.0] * 4
time.sleep(float(os.environ.get(f"SLEEP{rank}", "0")))
if os.environ.get("DIE") == str(rank):
    os._exit(3)
print(f"LEAVING {time.time():.3f}", flush=True)
if os.environ.get("RAISE") == str(rank):
    raise RuntimeError("this rank fails")
sys.exit(0)
