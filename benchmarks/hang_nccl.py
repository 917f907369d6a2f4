"""The hang watch on NCCL (issue 29): the cases of tests/distributed/test_hang_watch.py on 2 GPU ranks.

On NCCL a collective returns before it finishes and the host blocks later (a `.item()`, a sync), so the watch
knows where a rank waits only from the work handles dsfast recorded (dsfast/comm/where.py). Each case must end
both ranks with the watch's verdict (exit code 87, the same HangError line on both, naming the cause) well before
the process group's timeout; the slow rank must raise no alarm. Needs 2 GPUs: on fewer it says so and skips
(exit 0). --gloo runs the same checks on CPU ranks in NCCL's shape (DSFAST_HANG_WATCH_NCCL_SHAPE=1), a dry run.

    python benchmarks/hang_nccl.py [--gloo]        (part of benchmarks/gpu_check.sh)
"""
import argparse
import os
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "distributed"))
from dist_launch import launch  # noqa: E402

WORKER = os.path.join(ROOT, "tests", "distributed", "worker_hang.py")
HANG = 87
AFTER_S = 3.0        # the watch's threshold here; the process group's timeout is TIMEOUT_S
TIMEOUT_S = 120
# case -> what the verdict must say (the collective named may differ from gloo's: NCCL pairs mismatched ones its way)
CAUSES = {"uneven": "different numbers of forward passes", "skip": "issued different collectives",
          "save": "save_checkpoint / load_checkpoint must be called on every rank",
          "eval": "different numbers of forwards in eval mode", "killed": "rank 1 is dead"}


def check(case, results, seconds):
    """'' when the case ended as it must, else what went wrong."""
    if case == "calm":
        bad = [r for r, (rc, out) in enumerate(results) if rc != 0 or "HangError" in out]
        return f"rank(s) {bad} failed or raised a false alarm" if bad else ""
    if case == "killed":   # the watch's verdict (87) or the failed collective's own error, naming the dead rank
        rc, out = results[0]
        return "" if rc != 0 and CAUSES[case] in out else f"rank 0 exit {rc} without {CAUSES[case]!r}"
    lines = []
    for rank, (rc, out) in enumerate(results):
        line = next((ln.split("HangError:")[1] for ln in out.splitlines() if "HangError:" in ln), None)
        if rc != HANG or line is None:
            return f"rank {rank} exit {rc}, verdict {line!r}"
        lines.append(line)
    if lines[0] != lines[1] or CAUSES[case] not in lines[0]:
        return f"verdicts differ or miss {CAUSES[case]!r}: {lines}"
    if seconds > TIMEOUT_S / 2:
        return f"took {seconds:.0f} s"
    return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gloo", action="store_true", help="CPU ranks in NCCL's shape (a dry run of this check)")
    args = parser.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not args.gloo and gpus < 2:
        print(f"hang_nccl: skipped: the NCCL check needs 2 GPUs, this machine has {gpus}")
        return 0
    env = {"DSFAST_HANG_WATCH_S": str(AFTER_S), "DSFAST_SHM_ALLREDUCE": "0", "SLOW_S": str(2 * AFTER_S + 1)}
    if args.gloo:
        env.update(CUDA_VISIBLE_DEVICES="", DSFAST_HANG_WATCH_NCCL_SHAPE="1")
    failed = 0
    for case in ("uneven", "skip", "save", "eval", "killed", "calm"):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.monotonic()
            results = launch(WORKER, [case, out], nprocs=2, timeout=TIMEOUT_S, check=False, extra_env=env)
            seconds = time.monotonic() - t0
        problem = check(case, results, seconds)
        verdict = next((ln.strip() for ln in results[0][1].splitlines()
                        if "HangError:" in ln or "a collective failed" in ln), "(no verdict)")
        print(f"{case:7s} {'ok' if not problem else 'FAILED: ' + problem} in {seconds:.1f} s: {verdict[:400]}")
        if problem:
            failed += 1
            for rank, (rc, text) in enumerate(results):
                print(f"--- rank {rank} exit {rc}:\n{text[-2500:]}")
    print(f"=== summary: hang_nccl {'passed' if not failed else f'{failed} case(s) failed'} "
          f"({'gloo, NCCL shape' if args.gloo else 'nccl, 2 GPUs'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
