"""deepspeed.runtime.zero.stage3: DeepSpeedZeroOptimizer_Stage3 (an engine's optimizer at ZeRO stage 3 is an
instance, dsfast.runtime.base_optimizer) and the memory estimates, over dsfast's model-state formulas
(dsfast.zero.planning.estimate)."""
from ...engine import optimizer_roles
from ...zero.planning.estimate import model_sizes, print_deepspeed_estimate
from ..base_optimizer import EngineBuiltOptimizer


class DeepSpeedZeroOptimizer_Stage3(EngineBuiltOptimizer):
    """The ZeRO stage 3 optimizer: isinstance() is true of engine.optimizer at stage 3."""
    _engine_roles = frozenset({optimizer_roles.ZERO_3})


def estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Print the stage 3 estimate for this model (its parameters and largest layer counted)."""
    total, largest = model_sizes(model)
    return print_deepspeed_estimate(3, total, largest, num_gpus_per_node, num_nodes, additional_buffer_factor)


def estimate_zero3_model_states_mem_needs_all_cold(total_params, largest_layer_params, num_gpus_per_node=1,
                                                   num_nodes=1, additional_buffer_factor=1.5):
    """Print the stage 3 estimate for a model of this many parameters, the largest layer this big."""
    return print_deepspeed_estimate(3, total_params, largest_layer_params, num_gpus_per_node, num_nodes,
                                    additional_buffer_factor)
