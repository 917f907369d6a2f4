"""Stage 3's all-gathers must pair the same parameters on every rank; this checks that they did.

Every rank launches its parameter all-gathers in module order. If the ranks run different modules (an MoE block
whose ranks route their samples to different experts, any rank-dependent branch), the collectives pair different
parameters: of equal sizes, nothing fails and each rank computes with a mix of the experts' slices, so training goes
silently wrong. Each rank therefore folds what it launches (each parameter's position in its model, the same on
every rank) into an order-sensitive fingerprint, one per process group, and the stage 3 owner compares the
fingerprints across ranks at the end of each backward: one all-reduce of two integers. A difference is an error
naming the first parameters where the ranks' gathers parted and the fix (a leaf module, gathered as a whole:
deepspeed.utils.set_z3_leaf_modules).
"""
import torch
import torch.distributed as dist

from ...comm.where import wait_now

_MOD = (1 << 61) - 1   # a prime: fingerprints stay int64
_launched = {}         # id(process group) -> fingerprint of the all-gathers launched since the last check
_names = {}            # id(process group) -> the names of the first KEEP parameters gathered (for the error)
KEEP = 4096            # (an engine that never runs backward never checks: what it keeps stays bounded)


def note_launch(records):
    """`records` are being all-gathered together, by a collective (partitioned_param / prefetch)."""
    key = id(records[0].group)
    h = _launched.get(key, 0)
    for r in records:
        ident = r.position if r.position is not None else r.numel   # (not under an owner: its size)
        h = (h * 1_000_003 + ident + 1) % _MOD
    _launched[key] = (h * 1_000_003 + len(records)) % _MOD
    names = _names.setdefault(key, [])
    if len(names) < KEEP:
        names.extend(r.name or f"a parameter of shape {list(r.shape)}" for r in records)


def check_same_gathers(group, device):
    """A collective of every rank of `group`: raises on every rank when their all-gathers since the last check
    differed."""
    h = _launched.pop(id(group), 0)
    names = _names.pop(id(group), [])
    both = torch.tensor([h, -h], dtype=torch.int64, device=device)
    wait_now(dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group, async_op=True), ("gather check",))
    high, neg_low = both.tolist()
    if high != -neg_low:
        every = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, names, group=group)   # (the error path only)
        raise RuntimeError(
            "ZeRO stage 3: the ranks all-gathered different parameters in this forward/backward"
            f"{_first_difference(every)}: they ran different modules (rank-dependent control flow, e.g. an MoE "
            "block whose ranks route their samples to different experts), so the gathers paired different "
            "parameters and the results are wrong. Make the block that holds them a leaf "
            "module, gathered as a whole before its forward: deepspeed.utils.set_z3_leaf_modules(model, "
            "[TheBlockClass]) before deepspeed.initialize, or \"zero_optimization\": {\"leaf_module\": {\"classes\": "
            "[\"TheBlockClass\"]}} (also \"names\" / \"name_suffixes\")")


def _first_difference(every):
    """' (parameter 5 gathered: X on rank 0, Y on rank 1)': the first position where the ranks' gathers differ."""
    for i in range(max(len(names) for names in every)):
        seen = [names[i] if i < len(names) else "nothing more" for names in every]
        if len(set(seen)) > 1:
            q = next(q for q, name in enumerate(seen) if name != seen[0])
            return f" (parameter {i + 1} gathered: {seen[0]} on rank 0, {seen[q]} on rank {q})"
    return ""
