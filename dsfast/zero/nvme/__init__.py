"""NVMe offload: the swap files of the optimizer states (states.py) and of stage 3's shards (params.py)."""
