"""Model-state memory per rank for every ZeRO stage and offload choice (partition.model_state_bytes' formulas,
the ones the memory tests check against memory_breakdown()).

    python -m dsfast.zero.planning.estimate --params 7e9 --world-size 8 [--fp32] [--offload] [--largest-layer 1e8]
                                   [--bf16-master [--bf16-optimizer-states]] [--nvme [--buffer-count 4] [--bucket 5e8]
                                   [--param-buffer-count 5]]
    dsfast.zero.estimate_model_states(7e9, 8) -> [{"stage", "offload_optimizer", "offload_param", "device",
                                                   "host"}, ...]  (bytes per rank)
Adam is assumed (two fp32 moments; bf16 ones with --bf16-optimizer-states). --bf16-master: the masters are the
16-bit parameter shards (bf16_master_weights_and_grads; stages 1-3 only, so no stage 0 row).
Stage 3 adds its gathered working set when the largest layer is given: that
layer whole in the model dtype (the one being computed; prefetching may hold the next one too). Activations and
temporary buffers are not model states and are not counted.

nvme=True adds the rows of offload_optimizer on NVMe (offload_optimizer "nvme", a "nvme" key): every fp32 master
and moment in swap files (12 bytes/param / N, fp32 models too: the masters are copies there; 4 + 2.03 with 8-bit
moments, states8), and on the host only
the window (nvme_states.window_bytes): buffer_count units of this rank's share of a bucket (stages 1-2:
reduce_bucket_size elements) or of the largest layer (stage 3, one unit per parameter). They also add stage 3's
offload_param on NVMe (offload_param "nvme"): the model-dtype shards (2 or 4 bytes/param / N) in swap files too,
and on the host param_buffer_count buffers of this rank's shard of the largest layer (nvme_params.py; max_in_cpu
0, and stage3_param_persistence_threshold's small parameters not counted).
"""
import argparse

from ..nvme.buffers import aligned_size
from ..nvme.states import unit_file_bytes, window_bytes
from ..policy.partition import INT8_MOMENT_BYTES, model_state_bytes
from ..params.partitioned_param import whole_numel

_CHOICES = [(0, False, False), (1, False, False), (1, True, False), (2, False, False), (2, True, False),
            (3, False, False), (3, True, False), (3, False, True), (3, True, True)]
_NVME_CHOICES = [(1, "nvme", False), (2, "nvme", False), (3, "nvme", False), (3, "nvme", True), (3, True, "nvme"),
                 (3, "nvme", "nvme")]


def estimate_model_states(params, world_size, mixed=True, largest_layer=0, offload=None, master16=False,
                          states16=False, nvme=False, buffer_count=4, bucket=5e8, param_buffer_count=5,
                          states8=False):
    """Rows for every (stage, offload_optimizer, offload_param) choice; offload=True/False keeps only the rows with
    (any) / without offload. master16 / states16: 16-bit masters / optimizer states (stages 1-3); nvme=True adds
    offload_optimizer "nvme" rows (module docstring)."""
    if master16 and not mixed:
        raise ValueError("16-bit masters (bf16_master_weights_and_grads) need a 16-bit model, not --fp32")
    if master16 and nvme:
        raise ValueError("16-bit masters with offload_optimizer on NVMe are not supported yet (dsfast refuses the "
                         "config too); leave out --nvme or --bf16-master")
    psi, world = int(float(params)), int(world_size)
    if psi < 1 or world < 1:
        raise ValueError(f"params and world_size must be >= 1 (got {params!r}, {world_size!r})")
    rows = []
    for stage, off_opt, off_param in _CHOICES + (_NVME_CHOICES if nvme else []):
        if offload is not None and bool(offload) != bool(off_opt or off_param):
            continue
        if master16 and (stage == 0 or (not states16 and not off_opt)):
            continue   # where DeepSpeed refuses them (config/master_precision.py)
        if states8 and (not off_opt or stage == 0):
            continue   # 8-bit states are the host optimizer's (offload_optimizer.state_precision "int8")
        b = model_state_bytes(psi, world, stage, mixed, bool(off_opt), off_param, master16, states16, states8)
        if stage == 3 and largest_layer:
            b["device"] += (2 if mixed else 4) * int(float(largest_layer))
        if off_opt == "nvme":
            moments = INT8_MOMENT_BYTES if states8 else 8   # per element, in the unit files beside the fp32 master
            # what offload to the host would keep there: the masters (a copy, for a 16-bit model) and the moments
            on_host = ((4 if mixed else 0) + moments) * psi / world
            whole = min(int(float(bucket)), psi) if stage < 3 else int(float(largest_layer))
            unit = whole // world + 1
            # the window's buffers are made as units come in: a model of fewer units than buffer_count has fewer
            units = -(-psi // whole) if whole > 0 else buffer_count
            b["host"] += window_bytes(unit, min(buffer_count, units), moments) - on_host
            b["nvme"] = unit_file_bytes(psi, moments) / world
            b["nvme_unit"] = unit   # elements of the largest swap unit (the plan counts the step's reads by it)
        if off_param == "nvme":
            shards = (2 if mixed else 4) * psi / world   # what offload_param "cpu" keeps on the host
            largest = (2 if mixed else 4) * (int(float(largest_layer)) // world + 1)
            b["host"] += param_buffer_count * aligned_size(largest) - shards
            b["nvme"] = b.get("nvme", 0) + shards
        rows.append({"stage": stage, "offload_optimizer": off_opt, "offload_param": off_param, **b})
    return rows


def model_sizes(model):
    """(parameters, largest layer's parameters) of a module; a parameter shared by several modules counts once.
    Stage 3 parameters count whole (ds_numel), whether gathered or not."""
    total = sum({id(p): whole_numel(p) for p in model.parameters()}.values())
    largest = max((sum(whole_numel(p) for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return total, largest


def print_deepspeed_estimate(stage, total_params, largest_layer_params=0, num_gpus_per_node=1, num_nodes=1,
                             additional_buffer_factor=1.5):
    """DeepSpeed's estimate_zero{2,3}_model_states_mem_needs_* report over dsfast's formulas: per option, the
    model states of one accelerator and of one node's host memory (times the buffer factor, as DeepSpeed's).
    zero_init=0 (stage 3): every rank builds the whole fp32 model on the host before initialize() partitions it.
    Returns the rows printed."""
    gpn, nodes, factor = int(num_gpus_per_node), int(num_nodes), float(additional_buffer_factor)
    if gpn < 1 or nodes < 1 or factor <= 0:
        raise ValueError(f"num_gpus_per_node and num_nodes must be >= 1 and additional_buffer_factor > 0 "
                         f"(got {num_gpus_per_node!r}, {num_nodes!r}, {additional_buffer_factor!r})")
    total = int(float(total_params))
    rows = []
    for r in estimate_model_states(total, gpn * nodes, largest_layer=largest_layer_params if stage == 3 else 0):
        if r["stage"] != stage:
            continue
        for zero_init in ((True, False) if stage == 3 else (True,)):
            host = r["host"] * gpn if zero_init else max(r["host"] * gpn, 4 * total * gpn)
            rows.append({**r, "zero_init": zero_init, "device": r["device"], "host": host * factor})
    gib = 1024 ** 3
    print(f"Estimated memory needed for params, optim states and gradients for a:\n"
          f"HW: Setup with {nodes} node{'s' if nodes > 1 else ''}, {gpn} GPU{'s' if gpn > 1 else ''} per node.\n"
          f"SW: Model with {total / 1e6:.0f}M total params"
          + (f", {int(largest_layer_params) / 1e6:.0f}M largest layer params." if stage == 3 else "."))
    print("  per CPU  |  per GPU |   Options")
    for r in rows:
        opts = [f"offload_param={'cpu ' if r['offload_param'] else 'none'}"] if stage == 3 else []
        opts.append(f"offload_optimizer={'cpu ' if r['offload_optimizer'] else 'none'}")
        if stage == 3:
            opts.append(f"zero_init={int(r['zero_init'])}")
        print(f"{r['host'] / gib:7.2f}GB | {r['device'] / gib:6.2f}GB | {', '.join(opts)}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dsfast.zero.planning.estimate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", required=True, help="number of model parameters (7e9 is fine)")
    ap.add_argument("--world-size", type=int, required=True, help="data-parallel ranks")
    ap.add_argument("--fp32", action="store_true", help="fp32 training (default: fp16/bf16 with fp32 masters)")
    ap.add_argument("--offload", action="store_true", help="only the rows that offload to host memory")
    ap.add_argument("--largest-layer", default="0", help="parameters of the largest layer (stage 3 working set)")
    ap.add_argument("--bf16-master", action="store_true",
                    help="bf16 masters and gradients (bf16_master_weights_and_grads; without the next flag only "
                         "with offload_optimizer)")
    ap.add_argument("--bf16-optimizer-states", action="store_true", help="bf16 Adam moments (bf16_optimizer_states)")
    ap.add_argument("--int8-optimizer-states", action="store_true",
                    help="8-bit block-wise Adam moments on the host (offload_optimizer.state_precision \"int8\"); "
                         "only the offload_optimizer rows")
    ap.add_argument("--nvme", action="store_true", help="add the rows of offload_optimizer / offload_param on NVMe")
    ap.add_argument("--param-buffer-count", type=int, default=5, help="offload_param.buffer_count (NVMe window)")
    ap.add_argument("--buffer-count", type=int, default=4, help="offload_optimizer.buffer_count (NVMe window)")
    ap.add_argument("--bucket", default="5e8", help="reduce_bucket_size (stages 1-2: the NVMe unit)")
    args = ap.parse_args(argv)
    if args.bf16_optimizer_states and not args.bf16_master:
        ap.error("--bf16-optimizer-states needs --bf16-master (as bf16_optimizer_states needs "
                 "bf16_master_weights_and_grads)")
    try:
        rows = estimate_model_states(args.params, args.world_size, not args.fp32, args.largest_layer,
                                     True if args.offload else None, args.bf16_master, args.bf16_optimizer_states,
                                     args.nvme, args.buffer_count, args.bucket, args.param_buffer_count,
                                     args.int8_optimizer_states)
    except ValueError as err:
        ap.error(str(err))
    gib = 1024 ** 3
    print(f"model states per rank: {float(args.params):.3g} params, {args.world_size} ranks, "
          f"{'fp32' if args.fp32 else 'mixed precision'}, "
          f"{'bf16' if args.bf16_master else 'fp32'} masters, Adam with "
          f"{'int8' if args.int8_optimizer_states else 'bf16' if args.bf16_optimizer_states else 'fp32'} moments")
    print(f"{'stage':>5}  {'offload_optimizer':>17}  {'offload_param':>13}  {'device GiB':>10}  {'host GiB':>9}  "
          f"{'nvme GiB':>9}")
    for r in rows:
        print(f"{r['stage']:>5}  {str(r['offload_optimizer']):>17}  {str(r['offload_param']):>13}  "
              f"{r['device'] / gib:>10.2f}  {r['host'] / gib:>9.2f}  {r.get('nvme', 0) / gib:>9.2f}")
    return rows


if __name__ == "__main__":
    main()
