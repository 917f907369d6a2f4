"""unwrap_model_for_generation (DeepSpeed's deepspeed.runtime.zero name; TRL and OpenRLHF wrap generation in it):
every ZeRO stage 3 parameter of the model whole for the block, gathered once, so that generate()'s many forwards
gather and release nothing (the stage 3 hooks find the parameters whole and held); partitioned again on exit."""
import contextlib

from .gathered import GatheredParameters


@contextlib.contextmanager
def unwrap_model_for_generation(model):
    """model: the engine (or its module). A collective: every rank enters the block. Yields `model` itself, as
    DeepSpeed does. Changes made to the parameters inside are discarded on exit, as GatheredParameters' are."""
    with GatheredParameters(list(model.parameters())):
        yield model
