"""deepspeed.runtime.swap_tensor: the public constant programs and DeepSpeed's tests size tensors by. dsfast's NVMe
swap (zero/nvme_*.py) is its own and does not read it."""

MIN_SWAPPABLE_BYTES = 1 << 20   # DeepSpeed 0.19.8's value (MIN_AIO_BYTES: 1 MiB)
