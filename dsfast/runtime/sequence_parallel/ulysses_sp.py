"""deepspeed.runtime.sequence_parallel.ulysses_sp: Hugging Face's accelerate imports UlyssesSPAttentionHF and
UlyssesSPDataLoaderAdapter when its sequence-parallel backend is "deepspeed". They import here; using them is
refused: dsfast has no sequence parallelism (no sequence-sharded attention, no all-to-all)."""
import torch

from ...unsupported import refuse

_FEATURE = "Ulysses sequence parallelism (sequence_parallel_size > 1)"
_INSTEAD = "train with sequence_parallel_size 1 (accelerate's parallelism_config sp_size=1), or with DeepSpeed itself"


class UlyssesSPAttentionHF(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        refuse("UlyssesSPAttentionHF(...)", _FEATURE, _INSTEAD)

    @classmethod
    def register_with_transformers(cls, model_name_or_path, core_attn_implementation, sequence_parallel_size,
                                   micro_batch_size, seq_length=None, seq_length_is_variable=True,
                                   disable_in_eval=False, max_length=None):
        refuse(f"UlyssesSPAttentionHF.register_with_transformers(sequence_parallel_size={sequence_parallel_size})",
               _FEATURE, _INSTEAD)


class UlyssesSPDataLoaderAdapter:
    def __init__(self, dl, sp_rank, sp_group, sp_world_size, device):
        refuse(f"UlyssesSPDataLoaderAdapter(sp_world_size={sp_world_size})", _FEATURE, _INSTEAD)
