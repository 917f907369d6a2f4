"""Turning what a torch.ops call raises into the ValueError/TypeError dsfast promises.

The stable ABI can only throw std exceptions: a type error crosses it as a RuntimeError tagged
with TYPE_TAG (csrc/bindings/op_abi.h). torch's own argument parsing (a list that holds no
tensors, a str where a float goes) raises RuntimeError too; those are type errors as well."""
TYPE_TAG = "[dsfast:TypeError] "
_TORCH_PARSE = ("Expected a value of type", "expected a value of type")


def retyped(err, explain=None):
    """The exception to raise for `err` from a torch.ops.dsfast call. `explain()`, run only for
    torch's parsing errors, may raise a clearer error naming the bad entry itself."""
    msg = str(err)
    if TYPE_TAG in msg:
        return TypeError(msg[msg.index(TYPE_TAG) + len(TYPE_TAG):].split("\n")[0])
    if any(p in msg for p in _TORCH_PARSE):
        if explain is not None:
            explain()
        return TypeError(msg.split("\n")[0])    # the rest is the schema and a pybind11 note
    return err
