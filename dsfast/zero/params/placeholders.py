"""What state_dict() of a ZeRO stage 3 module holds for a partitioned parameter: a placeholder, never weights.

DeepSpeed answers state_dict() of a partitioned module with empty tensors, and programs rely on that call working
(DeepSpeed-Chat's save_hf_format takes it on rank 0, saves it, and only then gathers the real weights over the same
file). dsfast gives the same placeholders, marked so that no file made of them passes for a model:
  torch.save          works, with a warning naming what to call to save the weights instead;
  torch.load          of such a file fails naming the parameter and that fix (with weights_only=True, torch's own
                      refusal names the global `dsfast.zero.params.placeholders.zero3_placeholder_without_weights`;
                      allowing
                      it reaches the same error);
  load_state_dict     of a state_dict holding one fails the same way (param_hooks' load hook, save16's loader).
"""
import warnings

import torch

FIX = ("call engine.save_16bit_model(save_dir) to write whole weights, or take the state_dict inside `with "
       "deepspeed.zero.GatheredParameters(list(model.parameters())): sd = model.state_dict()` (on every rank: it "
       "is a collective)")


def partitioned_message(names):
    return (f"state_dict() of a ZeRO stage 3 model: parameter(s) {', '.join(names[:3])} are partitioned across "
            f"ranks (this rank holds a slice only), so its state_dict() holds placeholders, not weights; {FIX}")


SAVE_WARNING = ("saving placeholders, not weights: a ZeRO stage 3 model's state_dict() taken while its parameters "
                "were partitioned holds empty tensors; the file written refuses to load (as DeepSpeed-Chat does, "
                f"it can be overwritten with the gathered weights). To save the weights, {FIX}")


class PartitionedPlaceholder(torch.Tensor):
    """The empty tensor state_dict() holds for a partitioned parameter (DeepSpeed's placeholder), knowing its name
    and whole shape; pickled, it becomes a call that refuses to load (zero3_placeholder_without_weights)."""

    @staticmethod
    def of(tensor, key, shape=None):
        out = torch.Tensor._make_subclass(PartitionedPlaceholder, tensor.detach(), False)
        out._dsfast_key = key
        out._dsfast_shape = tuple(shape) if shape is not None else None
        return out

    def __deepcopy__(self, memo):
        return PartitionedPlaceholder.of(torch.empty(0, dtype=self.dtype, device=self.device),
                                         getattr(self, "_dsfast_key", "?"), getattr(self, "_dsfast_shape", None))

    def __reduce_ex__(self, protocol):
        key = getattr(self, "_dsfast_key", "?")
        warnings.warn(SAVE_WARNING, stacklevel=2)   # (one text for every parameter: shown once, not per tensor)
        return zero3_placeholder_without_weights, (key, getattr(self, "_dsfast_shape", None), str(self.dtype))


def zero3_placeholder_without_weights(key, shape, dtype):
    """What unpickling a saved placeholder calls: the file holds no weights for `key`, so loading it is an error."""
    raise RuntimeError(f"this file holds no weights for {key!r} (shape {list(shape) if shape else '?'}, {dtype}): "
                       f"it was saved from a ZeRO stage 3 model's state_dict() while its parameters were "
                       f"partitioned (DeepSpeed's placeholders). Save it again from the training run: {FIX}")


def is_placeholder(value):
    return isinstance(value, PartitionedPlaceholder)


def refuse_placeholders(state_dict, keys, where="load_state_dict"):
    """An error naming the first of `keys` whose value in `state_dict` is a placeholder (nothing to load)."""
    bad = [k for k in keys if is_placeholder(state_dict.get(k))]
    if bad:
        raise RuntimeError(f"{where}: {', '.join(bad[:3])} hold(s) placeholders, not weights (a ZeRO stage 3 "
                           f"model's state_dict() taken while its parameters were partitioned); to get the "
                           f"weights, {FIX}")
