"""deepspeed.comm's questions about the job: ranks, sizes, groups, backend (thin names over torch.distributed).

DeepSpeed asserts that its backend exists before answering (get_rank() before init_distributed() fails with
"DeepSpeed backend not set"); dsfast fails the same way, with an error that says what to call first.
"""
import functools
import os

import torch.distributed as dist


class CommNotInitializedError(RuntimeError, AssertionError):
    """A deepspeed.comm call that needs the process group came before init_distributed().

    Also an AssertionError: DeepSpeed raises one here, and programs that catch it keep working."""


def is_available() -> bool:
    return dist.is_available()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def require_group(what):
    if not is_initialized():
        raise CommNotInitializedError(
            f"deepspeed.comm.{what}() needs the process group, which does not exist yet: call "
            "deepspeed.init_distributed() first (deepspeed.initialize(...) also calls it)")


def needs_group(fn):
    """Decorator: raise CommNotInitializedError before `fn` runs without a process group."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        require_group(fn.__name__)
        return fn(*args, **kwargs)
    return wrapper


@needs_group
def get_rank(group=None) -> int:
    return dist.get_rank(group=group)


@needs_group
def get_world_size(group=None) -> int:
    return dist.get_world_size(group=group)


def _env_int(keys, default):
    for key in keys:
        value = os.environ.get(key)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {key}={value!r} is not an integer") from None
    return default


def get_local_rank_from_launcher() -> int:
    return _env_int(("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"), 0)


def get_world_rank_from_launcher() -> int:
    return _env_int(("RANK", "OMPI_COMM_WORLD_RANK"), 0)


def get_world_size_from_launcher() -> int:
    return _env_int(("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"), 1)


@needs_group
def get_local_rank() -> int:
    """This process's rank on its node, from the launcher (init_distributed exports LOCAL_RANK for MPI/Slurm)."""
    return get_local_rank_from_launcher()


@needs_group
def get_global_rank(group=None, group_rank: int = 0) -> int:
    return dist.get_global_rank(group if group is not None else dist.group.WORLD, group_rank)


@needs_group
def get_all_ranks_from_group(group=None):
    return dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)


@needs_group
def get_world_group():
    return dist.group.WORLD


@needs_group
def get_backend(group=None) -> str:
    return dist.get_backend(group)


@needs_group
def new_group(ranks, **kwargs):
    return dist.new_group(ranks, **kwargs)


@needs_group
def destroy_process_group(group=None):
    """The default group: torn down the way dsfast does at exit (every rank meets the others first, bounded, then
    the group and the cycles holding it go), so a peer that finishes first cannot make gloo abort this one."""
    if group is None:
        from .teardown import destroy_at_exit
        return destroy_at_exit()
    return dist.destroy_process_group(group)


# torch has had these since 1.13 / 2.0; DeepSpeed programs probe for them before choosing a code path
@needs_group
def has_all_gather_into_tensor() -> bool:
    return True


@needs_group
def has_reduce_scatter_tensor() -> bool:
    return True


@needs_group
def has_all_reduce_coalesced() -> bool:
    return True


@needs_group
def has_coalescing_manager() -> bool:
    return True


# DeepSpeed's communication logger. dsfast does not time collectives (a "comms_logger" config section is
# reported as ignored at initialize), so there is nothing to configure or summarise.
def configure(deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None, debug=None):
    return None


def log_summary(show_straggler=False, return_dict=False):
    return {} if return_dict else None


def reset_log():
    return None


__all__ = ["CommNotInitializedError", "is_available", "is_initialized", "get_rank", "get_world_size",
           "get_local_rank", "get_global_rank", "get_all_ranks_from_group", "get_world_group", "get_backend",
           "new_group", "destroy_process_group", "get_local_rank_from_launcher", "get_world_rank_from_launcher",
           "get_world_size_from_launcher", "has_all_gather_into_tensor", "has_reduce_scatter_tensor",
           "has_all_reduce_coalesced", "has_coalescing_manager", "configure", "log_summary", "reset_log"]
