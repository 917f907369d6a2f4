"""deepspeed.moe.layer.MoE: importable (programs import it at the top), refused when constructed."""
import torch

from ..unsupported import UnsupportedFeatureError


class MoEUnsupportedError(UnsupportedFeatureError):
    """A DeepSpeed mixture-of-experts feature was used; dsfast trains dense models only."""


class MoE(torch.nn.Module):
    """DeepSpeed's mixture-of-experts layer. dsfast has no expert parallelism or gating kernels."""

    def __init__(self, hidden_size=None, expert=None, num_experts=1, ep_size=1, k=1, *args, **kwargs):
        raise MoEUnsupportedError(
            f"deepspeed.moe.layer.MoE(num_experts={num_experts}, ep_size={ep_size}, k={k}) is not supported by "
            "dsfast: it trains dense models only (no expert parallelism, gating or all-to-all dispatch). Build the "
            "model without MoE layers, or run this program with DeepSpeed itself")
