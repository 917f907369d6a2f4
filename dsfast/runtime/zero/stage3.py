"""deepspeed.runtime.zero.stage3's memory estimates, over dsfast's model-state formulas (dsfast.zero.estimate)."""
from ...zero.estimate import model_sizes, print_deepspeed_estimate


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
