"""deepspeed.runtime.zero.stage_1_and_2's memory estimates, over dsfast's model-state formulas
(dsfast.zero.estimate)."""
from ...zero.estimate import model_sizes, print_deepspeed_estimate


def estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Print the stage 2 estimate for this model."""
    return print_deepspeed_estimate(2, model_sizes(model)[0], 0, num_gpus_per_node, num_nodes,
                                    additional_buffer_factor)


def estimate_zero2_model_states_mem_needs_all_cold(total_params, num_gpus_per_node=1, num_nodes=1,
                                                   additional_buffer_factor=1.5):
    """Print the stage 2 estimate for a model of this many parameters."""
    return print_deepspeed_estimate(2, total_params, 0, num_gpus_per_node, num_nodes, additional_buffer_factor)
