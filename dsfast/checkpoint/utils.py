"""deepspeed.checkpoint.utils.clone_tensors_for_torch_save (what Hugging Face's accelerate calls on a state dict)."""
import torch


def clone_tensors_for_torch_save(item, device=torch.device("cpu")):
    """A copy of `item` (nested dicts, lists, tuples of tensors) with every tensor cloned onto `device`, so that
    torch.save writes each tensor's own values and not the whole storage a view shares with others."""
    if torch.is_tensor(item):
        return item.detach().to(device, copy=True)
    if isinstance(item, dict):
        return type(item)((k, clone_tensors_for_torch_save(v, device)) for k, v in item.items())
    if isinstance(item, (list, tuple)):
        return type(item)(clone_tensors_for_torch_save(v, device) for v in item)
    return item
