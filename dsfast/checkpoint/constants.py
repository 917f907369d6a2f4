"""deepspeed.checkpoint.constants: the key and file names of DeepSpeed's checkpoint layout (0.19), for programs that
read DeepSpeed checkpoints themselves (`sd[OPTIMIZER_STATE_DICT]`, `FP32_FLAT_GROUPS`) and for dsfast's reader of
them (deepspeed_import.py, zero_to_fp32.py, utils.py). tests/test_deepspeed_surface.py checks them against files
DeepSpeed wrote."""

# the optimizer states file (zero_pp_rank_R_mp_rank_00_optim_states.pt) and its inner dict
OPTIMIZER_STATE_DICT = "optimizer_state_dict"
FP32_GROUPS = "fp32_groups"                       # stage 0 with fp16 / bf16: per-parameter masters
FP32_FLAT_GROUPS = "fp32_flat_groups"             # stage 3: the rank's flat master partition per group
BASE_OPTIMIZER_STATE = "base_optimizer_state"     # stages 1-2: the wrapped optimizer's state_dict
BASE_OPTIMIZER_STATE_STEP = "base_optimizer_state_step"
SINGLE_PARTITION_OF_FP32_GROUPS = "single_partition_of_fp32_groups"   # stages 1-2: the rank's flat masters
GROUP_PADDINGS = "group_paddings"
PARTITION_COUNT = "partition_count"
ZERO_STAGE = "zero_stage"
CLIP_GRAD = "clip_grad"
FP32_WEIGHT_KEY = "fp32"

# the model states file (mp_rank_00_model_states.pt)
PARAM = "param"
PARAM_SHAPES = "param_shapes"
BUFFER_NAMES = "buffer_names"
FROZEN_PARAM_SHAPES = "frozen_param_shapes"
FROZEN_PARAM_FRAGMENTS = "frozen_param_fragments"

# file names
MODEL_FILE_PREFIX = "mp_rank_"
ZERO_FILE_PREFIX = "zero_pp_rank_"
OPTIM_FILE_SUFFIX = "_optim_states.pt"
MODEL_FILE_SUFFIX = "_model_states.pt"
LAYER_FILE_PREFIX = "layer_"
BF16_ZERO_FILE_PREFIX = "bf16_" + ZERO_FILE_PREFIX
FP16_ZERO_FILE_PREFIX = "fp16_" + ZERO_FILE_PREFIX

DS_VERSION = "ds_version"

# universal checkpoints (dsfast refuses converting to them: checkpoint/ds_to_universal.py)
UNIVERSAL_CHECKPOINT_INFO = "universal_checkpoint_info"
UNIVERSAL_CHECKPOINT_VERSION_KEY = "universal_checkpoint_version"
UNIVERSAL_CHECKPOINT_VERSION_VALUE = 0.2
VOCAB_DIVISIBILITY_PADDING_TENSOR = "vocab_divisibility_padding_tensor"
PADDED_VOCAB_SIZE = "padded_vocab_size"
ORIGINAL_VOCAB_SIZE = "original_vocab_size"
PARAM_SLICE_MAPPINGS = "param_slice_mappings"     # stages 1-2: each parameter's fragment_address in the partition
CAT_DIM = "cat_dim"
VOCABULARY_PARAMETER_PATTERNS = "vocabulary_parameter_patterns"
PIPELINE_REPLICATED_PARAMETER_PATTERNS = "pipeline_replicated_parameter_patterns"
PARAMETER_TO_AVERAGE_PATTERNS = "parameter_to_average_patterns"
PARAMETER_WITH_ROW_PARALLELISM_PATTERNS = "parameter_with_row_parallelism_patterns"
