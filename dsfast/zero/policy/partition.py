"""ZeRO partition maths as pure functions: which rank owns which slice of which flat bucket.

Every trainable parameter lives in one flat bucket. Buckets never mix param groups (a shard must belong to one
learning rate), dtypes or devices; they are filled in reverse parameter order (roughly the order backward produces
gradients) and cut at `bucket_elems`. Each bucket is padded to a multiple of `world * align` elements and cut into
`world` equal slices: rank r owns [r * shard, (r + 1) * shard). So a bucket's reduce-scatter can start as soon as its
gradients are complete (overlapping the rest of backward), and a rank's optimizer state is one slice per bucket,
each `align`-aligned for the vector kernels.

Nothing here touches a process group or allocates tensors: the owners (sharded.py), the checkpoint manifest and the
memory estimates all read the same plan.
"""
from dataclasses import dataclass
from typing import List, Tuple

ALIGN = 16  # elements: 64 bytes of fp32, one AVX-512 vector; every shard starts on such a boundary


@dataclass(frozen=True)
class Entry:
    """One parameter inside a bucket: its index in the owner's parameter list, offset and size (elements)."""
    param: int
    offset: int
    numel: int


@dataclass(frozen=True)
class BucketPlan:
    index: int
    group: int            # param-group index
    entries: Tuple[Entry, ...]
    numel: int            # elements used by parameters
    padded: int           # numel rounded up to world * align
    world: int

    @property
    def shard(self) -> int:
        return self.padded // self.world

    def shard_range(self, rank: int) -> Tuple[int, int]:
        return rank * self.shard, (rank + 1) * self.shard


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def plan_buckets(sizes, groups, kinds, bucket_elems: int, world: int, align: int = ALIGN) -> List[BucketPlan]:
    """Buckets over parameters given by parallel lists: `sizes[i]` elements, param group `groups[i]`, and a
    hashable `kinds[i]` (dtype and device) that must agree inside a bucket. Parameters are taken in reverse order.
    A parameter larger than `bucket_elems` gets a bucket of its own."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if bucket_elems < 1:
        raise ValueError(f"bucket_elems must be >= 1, got {bucket_elems}")
    if not (len(sizes) == len(groups) == len(kinds)):
        raise ValueError("sizes, groups and kinds must have one entry per parameter")
    plans, pending, used, key = [], [], 0, None

    def close():
        nonlocal pending, used
        if pending:
            plans.append(BucketPlan(len(plans), key[0], tuple(pending), used, round_up(max(used, 1), world * align),
                                    world))
        pending, used = [], 0

    for i in reversed(range(len(sizes))):
        k = (groups[i], kinds[i])
        if pending and (k != key or used + sizes[i] > bucket_elems):
            close()
        key = k
        pending.append(Entry(i, used, int(sizes[i])))
        used += int(sizes[i])
    close()
    return plans


def owned_pieces(plan: BucketPlan, rank: int):
    """The parts of each parameter that rank `rank` owns in this bucket, as
    (entry, start, stop, shard_offset): elements [start, stop) of the flattened parameter live at
    shard_offset within the rank's shard. Parameters outside the rank's slice are left out."""
    lo, hi = plan.shard_range(rank)
    out = []
    for e in plan.entries:
        a, b = max(lo, e.offset), min(hi, e.offset + e.numel)
        if a < b:
            out.append((e, a - e.offset, b - e.offset, a - lo))
    return out


# 8-bit block-wise moments (offload_optimizer.state_precision "int8"): 2 code bytes a parameter plus 2 fp32 scales
# per block of 256 (dsfast.ops.reference.adam8bit.QUANT_BLOCK), instead of 8 (fp32) or 4 (16-bit) bytes
INT8_MOMENT_BYTES = 2 + 2 * 4 / 256


def model_state_bytes(psi: int, world: int, stage: int, mixed: bool, offload: bool = False,
                      offload_param: bool = False, master16: bool = False, states16: bool = False,
                      states8: bool = False):
    """ZeRO's model-state formulas for Adam (bytes per rank): {"device": ..., "host": ...}.

    Mixed precision (16-bit model, fp32 masters + 2 fp32 moments = 12 bytes/param of optimizer state):
      stage 0: 16 psi          stage 1: 4 psi + 12 psi/N      stage 2: 2 psi + 14 psi/N    stage 3: 16 psi/N
    fp32 (the parameters are the masters):
      stage 0: 16 psi          stage 1: 8 psi + 8 psi/N       stage 2: 4 psi + 12 psi/N    stage 3: 16 psi/N
    16-bit masters (master16: bf16_master_weights_and_grads / fp16_master_weights_and_grads, stages 1-3): the
    masters are the 16-bit parameter shards themselves, and the moments fp32 (8 bytes) or, with states16
    (bf16_optimizer_states), 16-bit (4 bytes):
      stage 1: 4 psi + 4 psi/N      stage 2: 2 psi + 6 psi/N      stage 3: 8 psi/N      (fp32 moments: 4 more psi/N)
      with offload_optimizer the host keeps its own 16-bit master copy beside the moments: 6 psi/N (fp32 moments:
      10 psi/N), DeepSpeed's "6 bytes per parameter instead of 12"
    offload_optimizer moves masters and moments (12 or 8 bytes/param, /N from stage 1 on) to the host;
    states8 (offload_optimizer.state_precision "int8", offload only) keeps the moments in INT8_MOMENT_BYTES;
    offload_param (stage 3 only) moves the parameter partitions there too (the fp32 one doubles as the master
    only when both are on the same side, which the counts here ignore: they are upper bounds by a p psi/N)."""
    if master16 and not (mixed and stage in (1, 2, 3)):
        raise ValueError(f"16-bit masters need a 16-bit model at ZeRO stage 1-3 (got mixed={mixed}, stage {stage})")
    if states16 and not master16:
        raise ValueError("16-bit optimizer states need 16-bit masters (bf16_optimizer_states needs "
                         "bf16_master_weights_and_grads)")
    n = world
    p, g = (2, 2) if mixed else (4, 4)       # 16-bit or fp32 params and grads
    opt = 12 if mixed else 8                 # masters + exp_avg + exp_avg_sq (fp32 keeps no master copy)
    if master16:                             # the parameter shards are the masters, but for the host's own copy
        opt = (2 if offload else 0) + 2 * (2 if states16 else 4)
    if states8:                              # the moments' 8 (or 4) bytes become INT8_MOMENT_BYTES
        if not offload or stage == 0 or states16:
            raise ValueError("8-bit optimizer states need offload_optimizer at ZeRO stage 1-3, without 16-bit states")
        opt = opt - 2 * (2 if states16 else 4) + INT8_MOMENT_BYTES
    if stage == 0:
        params, grads, states = p * psi, (4 if mixed else g) * psi, opt * psi
    elif stage == 1:
        params, grads, states = p * psi, g * psi, opt * psi / n
    elif stage == 2:
        params, grads, states = p * psi, g * psi / n, opt * psi / n
    elif stage == 3:
        params, grads, states = p * psi / n, g * psi / n, opt * psi / n
    else:
        raise ValueError(f"ZeRO stage must be 0-3, got {stage}")
    if offload_param and stage != 3:
        raise ValueError(f"offload_param needs ZeRO stage 3 (got stage {stage})")
    device, host = grads, 0
    device, host = (device, host + states) if offload else (device + states, host)
    device, host = (device, host + params) if offload_param else (device + params, host)
    return {"device": device, "host": host}
