"""One rank of the safe_set_* checks on 2 gloo ranks (setters_common.run at stages 1-3, full and local setters);
rank 0 saves every rank's results. argv: out_path."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
import setters_common as C  # noqa: E402
from dp_common import gather_records  # noqa: E402

CASES = [(1, "bf16", False, False), (2, "fp32", True, False), (3, "bf16", False, False), (3, "fp32", True, True),
         (2, "bf16", False, True)]


def main():
    dsfast.init_distributed()
    record = {case: C.run(*case) for case in CASES}
    gathered = gather_records(record)
    if torch.distributed.get_rank() == 0:
        torch.save(gathered, sys.argv[1])


if __name__ == "__main__":
    main()
