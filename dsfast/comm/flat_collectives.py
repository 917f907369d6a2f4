"""The two flat collectives ZeRO uses, under the name the running torch prefers.

torch 2.13 renamed reduce_scatter_tensor / all_gather_into_tensor to reduce_scatter_single / all_gather_single
(the old names warn); torch 2.4-2.12 only have the old ones. Same arguments either way.
"""
import torch.distributed as dist

reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
