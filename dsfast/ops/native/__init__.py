"""Python faces of dsfast's torch-library ops (torch.ops.dsfast.*): the functions the rest of dsfast
calls, with the same names and arguments as the pure-torch references, and each op's fake (meta)
implementation. A module here is imported only after its op's binary is loaded (dsfast.ops.load)."""
