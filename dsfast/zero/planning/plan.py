"""An offload plan from this machine's own figures: which ZeRO configurations fit, and how fast their optimizer
step can be at best.

    dsfast plan --model 7e9 --world-size 8 [--nvme-path /local/nvme] [--out zero.json]
    python -m dsfast.zero.planning.plan --model path/to/config.json --world-size 1 --bandwidth-gbs 20 --host-gib 128

Host figures (dsfast.zero.planning.host_figures): available memory (shared by the --local-ranks ranks of this host),
`ulimit -l`, /dev/shm, the in-place memory bandwidth, the accelerator's memory and bandwidth, and with
--nvme-path that directory's free space and O_DIRECT read/write bandwidth; each can be given instead (--host-gib,
--device-gib, --bandwidth-gbs, ...). Bytes per rank come from dsfast.zero.planning.estimate (the formulas the memory
tests check); a row fits when every local rank's share fits in --headroom of each memory. The predicted step
floor is the bytes one Adam step moves per parameter (STATE_PRECISIONS) over the bandwidth of the memory it runs
in (the accelerator's, or the host's shared by the local ranks), and with NVMe the swap files' bytes read and
written over the disk's bandwidth (less the first units, read ahead during forward and backward), whichever takes
longer. Activations and temporary buffers are not counted:
--headroom leaves room for them.

Order (best first): the highest state precision that fits (fp32 masters and moments, bf16 masters with fp32
moments, fp32 masters with 8-bit moments, bf16 masters and moments; --prefer speed ranks by the floor alone), then
the fastest floor, then the least communication (stage 3 gathers, parameter offload), then the fewest device bytes.
"""
import argparse
import json
import math

from .estimate import estimate_model_states

_GIB = float(1 << 30)

# >>> The optimizer-state precisions a plan considers: the ONE place to add one. <<<
# name -> estimate.py's flags for its bytes, and the bytes one Adam step moves per parameter by the masters'
# precision (read p, g, m, v; write p, m, v; with offload the 16-bit gradient in and parameter copy out), as
# benchmarks/cpu_optim.py counts them. "int8": 8-bit block-wise moments (offload_optimizer.state_precision), host
# optimizer only (estimate.py gives only offload rows), fp32 masters: p r/w 8, bf16 grad 2, codes r/w 4, bf16 copy
# out 2, and two fp32 scales read and written per block of 256.
STATE_PRECISIONS = {
    "fp32": {"states16": False, "states8": False, "moved": {"fp32": 28, "bf16": 22}},
    "bf16": {"states16": True, "states8": False, "moved": {"bf16": 14}},
    "int8": {"states16": False, "states8": True, "moved": {"fp32": 16 + 2 * 2 * 4 / 256}},
}
# precision tiers, most faithful first (--prefer precision ranks by this): fp32 masters keep small updates that
# bf16 masters lose, so fp32 masters with 8-bit moments come before bf16 masters with bf16 moments
_TIER = {("fp32", "fp32"): 0, ("bf16", "fp32"): 1, ("fp32", "int8"): 2, ("bf16", "bf16"): 3}


def candidates(params, world_size, mixed=True, largest_layer=0, nvme=False, buffer_count=4, bucket=5e8):
    """Every (stage, offload, masters, states) row with its bytes per rank (estimate.py's rows plus "masters",
    "states" and "moved": bytes one step moves per parameter)."""
    rows = []
    for masters in (("fp32", "bf16") if mixed else ("fp32",)):
        for states, prec in STATE_PRECISIONS.items():
            moved = prec["moved"].get(masters)
            if moved is None:
                continue
            master16 = masters == "bf16"
            if prec["states16"] and not master16:
                continue   # bf16_optimizer_states needs bf16 masters (DeepSpeed's rule)
            found = estimate_model_states(params, world_size, mixed, largest_layer, None, master16,
                                          prec["states16"], nvme and not master16, buffer_count, bucket,
                                          states8=prec["states8"])
            # bytes both the host and the device columns count: with offload the host keeps its own 16-bit master
            # copy, which on a machine whose CPU trains is the model's parameter shard itself (host_bytes)
            shard = int(float(params)) / world_size
            rows += [{**r, "masters": masters, "states": states, "moved": moved, "buffer_count": buffer_count,
                      "shared": 2 * shard if master16 and r["offload_optimizer"] else 0} for r in found]
    return rows


def host_bytes(row, fig):
    """One rank's host bytes: the row's, plus its device bytes where the CPU trains (no accelerator), less what
    both count once (the 16-bit master copy that is the parameter shard there)."""
    if fig.device_memory is not None:
        return row["host"]
    return row["host"] + row["device"] - row.get("shared", 0)


def _fits(row, fig, local_ranks, headroom):
    """[why it does not fit] (empty when it fits) for all local ranks together."""
    why = []
    device = row["device"]
    host = host_bytes(row, fig) * local_ranks
    if fig.device_memory is not None:
        if device > headroom * fig.device_memory:
            why.append(f"device needs {device / _GIB:.2f} GiB of {headroom * fig.device_memory / _GIB:.2f}")
    if fig.host_available is not None and host > headroom * fig.host_available:
        why.append(f"host needs {host / _GIB:.2f} GiB for {local_ranks} rank(s) of "
                   f"{headroom * fig.host_available / _GIB:.2f}")
    disk = row.get("nvme", 0) * local_ranks
    if disk and fig.nvme_free is not None and disk > fig.nvme_free:
        why.append(f"NVMe needs {disk / _GIB:.2f} GiB of {fig.nvme_free / _GIB:.2f} free")
    return why


def step_floor(row, params, world_size, fig, local_ranks):
    """Seconds one optimizer step takes at least (module docstring), or None where a bandwidth is not known."""
    shard = params / (world_size if row["stage"] > 0 else 1)
    moved = row["moved"] * shard
    on_host = bool(row["offload_optimizer"]) or fig.device_memory is None
    gbs = fig.host_gbs if on_host else fig.device_gbs
    if not gbs:
        return None
    seconds = moved * (local_ranks if on_host else 1) / (gbs * 1e9)
    disk_read = (row.get("nvme", 0) if row["offload_optimizer"] == "nvme" else 0) * local_ranks
    if disk_read and row.get("nvme_unit"):
        # the window reads the step's first buffer_count - 2 units ahead, during forward and backward
        # (nvme_states.windows): the step itself reads the others
        units = math.ceil(shard / row["nvme_unit"])
        ahead = max(1, int(row.get("buffer_count", 4)) - 2)
        disk_read *= max(0, units - ahead) / units
    disk_write = row.get("nvme", 0) * local_ranks   # states written back; offload_param: the updated shards
    if disk_write:
        if not (fig.nvme_read_gbs and fig.nvme_write_gbs):
            return None
        seconds = max(seconds, disk_read / (fig.nvme_read_gbs * 1e9) + disk_write / (fig.nvme_write_gbs * 1e9))
    return seconds


def _comm(row):
    return (row["stage"] == 3) + {False: 0, True: 1, "nvme": 2}[row["offload_param"]]


def rank_key(row, prefer="precision"):
    floor = math.inf if row["floor_s"] is None else row["floor_s"]
    tier = _TIER[row["masters"], row["states"]]
    head = (tier, floor) if prefer == "precision" else (floor, tier)
    return head + (_comm(row), row["device"])


def make_plan(params, world_size, fig, local_ranks=None, mixed=True, largest_layer=0, headroom=0.9,
              prefer="precision", buffer_count=4, bucket=5e8, only=None):
    """All candidate rows with "why_not" (reasons it does not fit; empty: it fits) and "floor_s", the fitting ones
    first, best first. only: a function row -> bool keeping some rows (initialize's "auto" keeps the config's)."""
    world = int(world_size)
    local = world if local_ranks is None else int(local_ranks)
    if world < 1 or local < 1 or local > world:
        raise ValueError(f"world_size must be >= 1 and local_ranks between 1 and world_size (got {world_size!r}, "
                         f"{local_ranks!r})")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1] (got {headroom!r})")
    if prefer not in ("precision", "speed"):
        raise ValueError(f"prefer must be 'precision' or 'speed' (got {prefer!r})")
    rows = candidates(params, world, mixed, largest_layer, fig.nvme_path is not None, buffer_count, bucket)
    if only is not None:
        rows = [r for r in rows if only(r)]
    for r in rows:
        r["why_not"] = _fits(r, fig, local, headroom)
        r["floor_s"] = step_floor(r, int(float(params)), world, fig, local)
    return sorted(rows, key=lambda r: (bool(r["why_not"]),) + rank_key(r, prefer))


def _offload(device, nvme_path, pin):
    out = {"device": device}
    if device == "nvme":
        out["nvme_path"] = nvme_path
    if device != "none":
        out["pin_memory"] = pin
    return out


PLACES = {False: "none", True: "cpu", "nvme": "nvme"}   # estimate.py's row values -> the config's device names


def config_section(row, fig):
    """The config keys of a plan row: {"zero_optimization": ..., and "bf16": ... where it has 16-bit masters}.
    pin_memory only where `ulimit -l` allows this rank's host bytes to be page-locked."""
    device = PLACES
    pin = fig.memlock is None or row["host"] <= fig.memlock
    zero = {"stage": row["stage"]}
    if row["stage"] > 0:
        zero["offload_optimizer"] = _offload(device[row["offload_optimizer"]], fig.nvme_path, pin)
        if STATE_PRECISIONS[row["states"]]["states8"]:
            zero["offload_optimizer"]["state_precision"] = "int8"
    if row["stage"] == 3:
        zero["offload_param"] = _offload(device[row["offload_param"]], fig.nvme_path, pin)
    out = {"zero_optimization": zero}
    if row["masters"] == "bf16":
        out["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True,
                       "bf16_optimizer_states": STATE_PRECISIONS[row["states"]]["states16"]}
    return out


def _gib(n):
    return "-" if n is None else f"{n / _GIB:.2f}"


def format_plan(rows, fig, show_all=False):
    lines = [f"host: {_gib(fig.host_available)} GiB available, ulimit -l "
             f"{'unlimited' if fig.memlock is None else _gib(fig.memlock) + ' GiB'}, /dev/shm {_gib(fig.shm_free)} "
             f"of {_gib(fig.shm_size)} GiB free, {fig.host_gbs or 0:.1f} GB/s in place",
             "device: " + (f"{_gib(fig.device_memory)} GiB, {fig.device_gbs or 0:.1f} GB/s" if fig.device_memory
                           else "none (the CPU trains: device bytes are host memory)")]
    if fig.nvme_path:
        lines.append(f"nvme: {fig.nvme_path}: {_gib(fig.nvme_free)} GiB free, read {fig.nvme_read_gbs or 0:.2f} "
                     f"GB/s, write {fig.nvme_write_gbs or 0:.2f} GB/s (O_DIRECT)")
    lines.append(f"{'#':>3} {'stage':>5} {'offload_opt':>11} {'offload_param':>13} {'masters':>7} {'states':>6} "
                 f"{'device GiB':>10} {'host GiB':>9} {'nvme GiB':>9} {'step floor':>10}")
    for i, r in enumerate(rows):
        if r["why_not"] and not show_all:
            break
        floor = "-" if r["floor_s"] is None else f"{r['floor_s'] * 1e3:.1f} ms"
        where = f"{PLACES[r['offload_optimizer']]:>11} {PLACES[r['offload_param']]:>13}"
        lines.append(f"{i + 1:>3} {r['stage']:>5} {where} "
                     f"{r['masters']:>7} {r['states']:>6} {_gib(r['device']):>10} {_gib(r['host']):>9} "
                     f"{_gib(r.get('nvme', 0)):>9} {floor:>10}" + ("" if not r["why_not"] else
                                                                  "  does not fit: " + "; ".join(r["why_not"])))
    return lines


def build_parser():
    ap = argparse.ArgumentParser(prog="dsfast plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "--params", dest="model", required=True,
                    help="parameter count (7e9, 1.3B), Hugging Face config.json or model directory, .safetensors "
                         "or state-dict file")
    ap.add_argument("--world-size", type=int, required=True, help="data-parallel ranks")
    ap.add_argument("--local-ranks", type=int, default=None, help="ranks on this host (default: --world-size)")
    ap.add_argument("--largest-layer", default=None, help="largest layer's parameters (default: from the file)")
    ap.add_argument("--fp32", action="store_true", help="fp32 training (default: bf16 with fp32 masters)")
    ap.add_argument("--nvme-path", default=None, help="a directory on the disk for offload to NVMe")
    ap.add_argument("--headroom", type=float, default=0.9, help="fraction of each memory model states may take")
    ap.add_argument("--prefer", choices=("precision", "speed"), default="precision")
    ap.add_argument("--host-gib", type=float, default=None, help="available host memory (default: MemAvailable)")
    ap.add_argument("--device-gib", type=float, default=None, help="one accelerator's memory (default: measured)")
    ap.add_argument("--bandwidth-gbs", type=float, default=None, help="host in-place bandwidth (skip measuring)")
    ap.add_argument("--device-bandwidth-gbs", type=float, default=None, help="accelerator bandwidth")
    ap.add_argument("--disk-read-gbs", type=float, default=None)
    ap.add_argument("--disk-write-gbs", type=float, default=None)
    ap.add_argument("--skip-bandwidth", action="store_true", help="measure no bandwidth (floors not predicted)")
    ap.add_argument("--all", action="store_true", help="also print the rows that do not fit, with why")
    ap.add_argument("--out", default=None, help="write the best row's config section here as JSON")
    return ap


def main(argv=None):
    from .host_figures import measure_host
    from .model_count import count_model, parse_count
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        params, largest = count_model(args.model)
        if args.largest_layer is not None:
            largest = parse_count(args.largest_layer, "--largest-layer")
        given = {"host_available": args.host_gib and int(args.host_gib * _GIB),
                 "device_memory": args.device_gib and int(args.device_gib * _GIB), "host_gbs": args.bandwidth_gbs,
                 "device_gbs": args.device_bandwidth_gbs, "nvme_read_gbs": args.disk_read_gbs,
                 "nvme_write_gbs": args.disk_write_gbs}
        for flag, v in (("--host-gib", args.host_gib), ("--device-gib", args.device_gib)):
            if v is not None and not v > 0:
                raise ValueError(f"{flag} must be > 0 (got {v!r})")
        fig = measure_host(args.nvme_path, bandwidth=not args.skip_bandwidth,
                           **{k: v for k, v in given.items() if v is not None})
        if fig.device_memory is not None and not fig.device_gbs and not args.skip_bandwidth:
            raise ValueError("--device-gib without an accelerator here needs --device-bandwidth-gbs (the step "
                             "floor of a row without offload runs at the accelerator's bandwidth)")
        rows = make_plan(params, args.world_size, fig, args.local_ranks, not args.fp32, largest, args.headroom,
                         args.prefer)
    except ValueError as e:
        ap.error(str(e))
    best = None if not rows or rows[0]["why_not"] else config_section(rows[0], fig)
    if best is not None and args.out:   # written first: a reader that stops the output early still gets it
        with open(args.out, "w") as f:
            json.dump(best, f, indent=2)
            f.write("\n")
    layer = f"largest layer {largest / 1e6:.1f}M" if largest else \
        "largest layer unknown: stage 3 rows leave out its gathered layer and NVMe buffers; give --largest-layer " \
        "or a model file"
    print(f"model: {params / 1e9:.3f}B parameters ({layer}), {args.world_size} ranks")
    for line in format_plan(rows, fig, args.all):
        print(line)
    if best is None:
        print("nothing fits: " + ("; ".join(rows[0]["why_not"]) if rows else "no candidate") +
              ". Add ranks or hosts, give --nvme-path, or raise --headroom (less room left for activations)")
        return 1
    print("best: " + json.dumps(best) + (f" (written to {args.out})" if args.out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
