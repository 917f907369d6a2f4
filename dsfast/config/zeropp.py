"""The ZeRO++ keys of zero_optimization, decided by meaning (DeepSpeed 0.19.8 acts on them at stage 3 only).

  zero_hpz_partition_size     hpZ: a secondary copy of stage 3's parameters partitioned over groups of this many
                              ranks (min(size, world), which must divide the world). A group of every rank is the
                              primary partition itself, so 1 and the world size (one node's ranks on one node,
                              e.g. open-instruct's 8 on 8 GPUs) are the same as none: accepted. A smaller group
                              needs the secondary copy, which dsfast does not keep: refused.
  zero_quantized_weights      qwZ / qgZ: all-gathers or gradient reductions in int8/int4. dsfast moves the exact
  zero_quantized_nontrainable_weights    16-bit values and quantizes nothing: refused at stage 3.
  zero_quantized_gradients
Below stage 3 they change nothing, in DeepSpeed neither: accepted with a note.
"""
from typing import List, Optional, Tuple

QUANTIZED = {
    "zero_quantized_weights": "quantized all-gathers of the weights (ZeRO++ qwZ)",
    "zero_quantized_nontrainable_weights": "frozen weights stored quantized (ZeRO++)",
    "zero_quantized_gradients": "quantized gradient reduction (ZeRO++ qgZ)",
}
HPZ = "zero_hpz_partition_size"


def zeropp_errors(zero, world: int) -> List[Tuple[Tuple, str]]:
    """(path, message) for each ZeRO++ setting dsfast cannot honour exactly."""
    if zero.stage != 3:
        return []
    out = []
    for key, what in QUANTIZED.items():
        if getattr(zero, key):
            out.append(((key,), f"true asks for {what}; dsfast does not quantize (its all-gathers and reductions "
                                "carry the exact 16-bit values): set it to false or remove it"))
    size = min(zero.zero_hpz_partition_size, world)
    if world % size:
        out.append(((HPZ,), f"{zero.zero_hpz_partition_size} must divide the number of ranks ({world}), as in "
                            "DeepSpeed; 1 means no secondary partition"))
    elif size not in (1, world):
        out.append(((HPZ,), f"{zero.zero_hpz_partition_size} asks for a secondary copy of the parameters "
                            f"partitioned over groups of {size} of the {world} ranks (ZeRO++ hpZ), which dsfast "
                            f"does not keep; set 1 (or {world}: every rank, the same as none): training is the same, "
                            "hpZ only trades memory for all-gather traffic between nodes"))
    return out


def zeropp_note(zero, world: int) -> Optional[str]:
    """What an accepted non-default ZeRO++ setting means here (the config's notes and --explain)."""
    set_keys = [k for k in (HPZ, *QUANTIZED) if getattr(zero, k) != type(zero).model_fields[k].default]
    if not set_keys:
        return None
    if zero.stage != 3:
        return (f"zero_optimization.{', '.join(set_keys)}: ZeRO++ acts at stage 3 only; at stage {zero.stage} it "
                "changes nothing (in DeepSpeed 0.19.8 neither)")
    return (f"zero_optimization.{HPZ}={zero.zero_hpz_partition_size} makes one group of all {world} rank(s): the "
            "primary partition itself, the same as no secondary partition (1)")


def explain_note(path: str, cfg) -> Optional[str]:
    """The --explain note of a ZeRO++ key (None: not one, or at its default)."""
    section, _, key = path.partition(".")
    if section != "zero_optimization" or key not in (HPZ, *QUANTIZED):
        return None
    zero = cfg.zero_optimization
    if getattr(zero, key) == type(zero).model_fields[key].default:
        return ("ZeRO++ off: accepted; dsfast quantizes nothing" if key != HPZ else
                "no secondary partition: accepted (a value other than 1 or the world size is refused at stage 3)")
    if zero.stage != 3:
        return f"accepted: ZeRO++ acts at stage 3 only, at stage {zero.stage} it changes nothing (DeepSpeed neither)"
    return "accepted: a group of every rank is the primary partition itself, the same as 1"
