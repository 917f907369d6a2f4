"""deepspeed.runtime.zero.stage_1_and_2: DeepSpeedZeroOptimizer (an engine's optimizer at ZeRO stage 1 or 2 is an
instance, dsfast.runtime.base_optimizer) and the memory estimates, over dsfast's model-state formulas
(dsfast.zero.planning.estimate)."""
from ...engine import optimizer_roles
from ...zero.planning.estimate import model_sizes, print_deepspeed_estimate
from ..base_optimizer import EngineBuiltOptimizer


class DeepSpeedZeroOptimizer(EngineBuiltOptimizer):
    """The ZeRO stage 1 / 2 optimizer: isinstance() is true of engine.optimizer at those stages."""
    _engine_roles = frozenset({optimizer_roles.ZERO_1_2})


def estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Print the stage 2 estimate for this model."""
    return print_deepspeed_estimate(2, model_sizes(model)[0], 0, num_gpus_per_node, num_nodes,
                                    additional_buffer_factor)


def estimate_zero2_model_states_mem_needs_all_cold(total_params, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Print the stage 2 estimate for a model of this many parameters."""
    return print_deepspeed_estimate(2, total_params, 0, num_gpus_per_node, num_nodes, additional_buffer_factor)
