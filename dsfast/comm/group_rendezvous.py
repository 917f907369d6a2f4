"""A rendezvous of a process group's ranks, tagged for the hang watch: what same-host ranks wrote to shared memory
before it is visible to every rank after it (the /dev/shm gradient table, stage 3's shared parameter table)."""
import torch
import torch.distributed as dist

from .where import wait_now

_TOKENS = {}


def rendezvous(group, what):
    """Every rank arrives before any leaves: a one-element all-reduce (gloo's barrier costs about twice that: it
    first waits for all earlier work of the group). What a rank wrote to shared memory before is visible after.
    `what`: the hang watch's tag (where.py)."""
    token = _TOKENS.get(group)
    if token is None:
        token = _TOKENS[group] = torch.zeros(1)
    wait_now(dist.all_reduce(token, group=group, async_op=True), what)
