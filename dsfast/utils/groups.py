"""deepspeed.utils.groups: the process groups a DeepSpeed engine trains over, as DeepSpeed answers without tensor,
sequence, pipeline or expert parallelism (dsfast has none of them).

data parallel     every rank: the world group (None and world size 1 without a process group, as dsfast's engine
                  runs single-process without one); the public getters answer the same instead of DeepSpeed's
                  "not initialized" assertion, which only a tensor-parallel (AutoTP) setup avoids there
model / tensor    a world of 1, rank 0, and this rank alone as its group's first rank (get_*_src_rank)
sequence          world 1, rank 0; _get_sequence_parallel_group() raises KeyError as DeepSpeed's does without one;
                  the sequence-data-parallel group is the data-parallel one
expert            no expert groups: the dicts are empty, a named group is a KeyError naming what exists
"""
import torch.distributed as dist

from ..comm.data_parallel import data_parallel

mpu = None               # DeepSpeed keeps a model-parallel unit here; dsfast never sets one
mesh_device = None
expert_tensor_parallel_world_size = 1


def _world():
    return data_parallel()


# ---- data parallel -------------------------------------------------------------------------------------------
def _get_data_parallel_group():
    return dist.group.WORLD if _world().distributed else None


def _get_data_parallel_world_size():
    return _world().world


def _get_data_parallel_rank():
    return _world().rank


def _get_data_parallel_group_ranks():
    return range(_world().world)


def _get_broadcast_src_rank():
    return 0


def _clone_world_group():
    return _get_data_parallel_group()


get_data_parallel_group = _get_data_parallel_group
get_data_parallel_world_size = _get_data_parallel_world_size
get_data_parallel_rank = _get_data_parallel_rank


# ---- model / tensor parallel: one rank each --------------------------------------------------------------------
def _get_model_parallel_world_size():
    return 1


def get_tensor_model_parallel_world_size():
    return 1


def get_model_parallel_world_size():
    return 1


def get_tensor_model_parallel_rank():
    return 0


def get_model_parallel_rank():
    return 0


def get_tensor_model_parallel_src_rank():
    return _world().rank        # a group of one: this rank is its first


def _no_model_parallel(what):
    raise RuntimeError(f"deepspeed.utils.groups.{what}(): dsfast has no tensor / model parallelism, so there is no "
                       "such group (its world size is 1: get_tensor_model_parallel_world_size())")


def get_tensor_model_parallel_group():
    _no_model_parallel("get_tensor_model_parallel_group")


def get_model_parallel_group():
    _no_model_parallel("get_model_parallel_group")


# ---- sequence parallel: none ------------------------------------------------------------------------------------
def _get_sequence_parallel_world_size():
    return 1


def _get_sequence_parallel_rank():
    return 0


def _get_sequence_parallel_group():
    raise KeyError("No sequence parallel group found (dsfast has no sequence parallelism)")


def _get_sequence_data_parallel_world_size():
    return _get_data_parallel_world_size()


def _get_sequence_data_parallel_rank():
    return _get_data_parallel_rank()


def _get_sequence_data_parallel_group():
    return _get_data_parallel_group()


# ---- expert parallel: no groups -----------------------------------------------------------------------------------
def _get_expert_parallel_group_dict():
    return {}


def _get_expert_data_parallel_group_dict():
    return {}


def _get_max_expert_size():
    return None


def _get_max_expert_size_name():
    return f"ep_size_{_get_max_expert_size()}"


def _get_expert_model_parallel_world_size():
    return expert_tensor_parallel_world_size


def _no_expert_group(group_name):
    raise KeyError(f"expert parallel group {group_name!r} not found: dsfast has no MoE expert parallelism, so there "
                   "are no expert groups (_get_expert_parallel_group_dict() is empty)")


def _get_expert_parallel_group(group_name):
    _no_expert_group(group_name)


_get_expert_data_parallel_group = _get_expert_parallel_world_size = _get_expert_parallel_rank = \
    _get_expert_data_parallel_world_size = _get_expert_data_parallel_rank = _get_expert_parallel_src_rank = \
    _get_expert_broadcast_src_rank = _get_expert_parallel_group_ranks = _get_expert_data_parallel_group_ranks = \
    _get_expert_parallel_group


def _get_max_expert_parallel_group():
    return _get_expert_parallel_group(_get_max_expert_size_name())


def initialize(ep_size=1, mpu=None):
    raise RuntimeError("deepspeed.utils.groups.initialize() is deprecated in DeepSpeed (pass ep_size to "
                       "deepspeed.moe.layer.MoE instead) and dsfast has no MoE expert parallelism")
