"""Issue 28's numbers: the offloaded step against the same model without offload, serial and overlapped
(`zero_optimization.offload_optimizer.overlap_step`), on a CPU stand-in for a GPU; and the NVMe step against the
disk's floor.

    python benchmarks/offload_overlap.py                       # stage 2, NVMe row in /var/tmp
    python benchmarks/offload_overlap.py --stage 3 --rounds 9 --nvme-dir /local/nvme
    python benchmarks/offload_overlap.py --nvme-dir none       # no NVMe row
    python benchmarks/offload_overlap.py --quick               # a smoke of every row (seconds; figures meaningless)

The stand-in: one rank on CPU under the test placement (DSFAST_TEST_PLACEMENT=distinct-host: host buffers distinct
from the "device", so every offload copy runs, and the copy lanes are worker threads). The "device" is the main
thread, pinned to one core (--device-core), running forward and backward with torch threads 1; every other thread of
the process (the engine's lanes: the gradient copies, the host step, the 16-bit uploads; the NVMe I/O pool) is pinned
to the other core (--host-core), with OMP_NUM_THREADS=1 so the CPU Adam op (whose thread count is
torch.get_num_threads() of the thread that calls it) runs on one thread wherever it is called. Pinning is per
thread (os.sched_setaffinity on each thread id of /proc/self/task), redone before every timed block so that lanes
started on first use are caught; without two usable cores nothing is pinned and the run says so.

The model (an MLP of --layers Linear(width, width) + Tanh, one reduce bucket per layer so that each layer is one
shard unit at stages 1-2; the default width 1000 keeps a layer's weight and bias under the engine's 2**20-element
bucket cap: at 1024 each layer was two units, a 4 MiB one and a 4 KiB one, and each took a buffer of the NVMe
window; stage 3's units are parameters) gets its batch size from a measurement at start: the host step (dsfast's
CPUAdam over all the parameters, one thread) and the forward per row are timed, and the rows are chosen so the
forward takes as long as the host step; both are printed.

Rows, interleaved over --rounds (each round runs every row's block, in a rotating order), median and spread
(min-max) of each block's time per step:
  floor            forward + backward of the same model alone (no engine, no step): a device whose optimizer is free
  no offload       ZeRO --stage on the device (the stand-in's device optimizer is the same one-core CPU Adam, which a
                   GPU would run in a fraction of the time: compare against the floor too)
  offload serial   offload_optimizer cpu
  offload overlap  offload_optimizer cpu + overlap_step (only where the engine accepts the key; else the row says
                   "overlap: not available")
A block's time per step is taken from the end of one forward to the end of the forward --block steps later (a
forward waits for the units it reads, so work a step leaves running is counted where it delays the next one); after
each block a no-grad forward settles the engine's last step before the next row runs. Then: each offloaded row's
overhead against no offload (target: overlap <= +20%) and against the floor, the serial host step (engine.step()
of the serial row), and the share of it hidden: (serial - overlap) / host step.

NVMe (--nvme-dir, default /var/tmp; "none" skips it; a tmpfs is refused): offload_optimizer nvme with
--nvme-buffers buffers (the model's states must exceed that window), serial and with overlap_step (where the config
accepts it with nvme; else the row says "overlap: not available" and why), interleaved with
the disk's O_DIRECT bandwidth (dsfast.zero.planning.host_figures.disk_bandwidth, the probe `dsfast plan` uses, with
two streams: the engine's I/O pool has two threads, and on this VM's disk two streams move more than one) in
each round; the bytes read and written per step (/proc/self/io) over that bandwidth are the disk's floor, and the
step time over it is the figure (target <= 1.15x), median of the per-round ratios.

Correctness first: every row trains from the same weights on the same batches; the serial and overlapped rows' losses
and final fp32 masters must be bitwise equal, and every offloaded row's losses must match no offload's closely,
or the run fails before printing any figure.
Timings are for an idle machine: on a shared one they say nothing (--quick's never do).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

OVERLAP_KEY = "zero_optimization.offload_optimizer.overlap_step"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=2)
    p.add_argument("--width", type=int, default=1000)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rows", type=int, default=0, help="batch rows (default 0: the forward as long as the host step)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block", type=int, default=4, help="timed steps per block")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per row before the rounds")
    p.add_argument("--device-core", type=int, default=0, help="the core of the main thread (forward, backward)")
    p.add_argument("--host-core", type=int, default=1, help="the core of every other thread (lanes, host step)")
    p.add_argument("--nvme-dir", default="/var/tmp", help='a directory on the disk for the NVMe row ("none": no row)')
    p.add_argument("--nvme-buffers", type=int, default=None,
                   help="offload_optimizer.buffer_count of the NVMe row (default 4: the config's default; 2 with "
                        "--quick, whose 4 small layers' states must exceed the window)")
    p.add_argument("--json", default=None, help="also write every figure to this file")
    p.add_argument("--quick", action="store_true",
                   help="a smoke of every row on a tiny model (seconds): checks the script, measures nothing")
    a = p.parse_args(argv)
    if a.quick:
        a.width, a.layers, a.rounds, a.block, a.warmup = 64, 4, 2, 2, 1
        a.rows = a.rows or 8
    if a.nvme_buffers is None:
        a.nvme_buffers = 2 if a.quick else 4
    for name in ("width", "layers", "rounds", "block", "nvme_buffers"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(a, name)})")
    if a.layers < 2:
        p.error("--layers must be >= 2: the overlap needs more than one shard unit")
    return a


# ------------------------------------------------------------------------------------------- shared with the timeline
def overlap_available(stage=2, device="cpu"):
    """(True, "") where this dsfast's config accepts offload_optimizer.overlap_step at `stage` with the states on
    `device` ("cpu" or "nvme"), else (False, the config's reason)."""
    from dsfast.config import DsConfigError, parse_config
    cfg = ds_config(stage, 1, 8, device, overlap=True, nvme_dir="/nvme-dir-not-read-by-the-check")
    try:
        parse_config(cfg)
    except DsConfigError as e:
        if "overlap_step" not in str(e):
            raise
        return False, next(x for x in str(e).splitlines() if "overlap_step" in x).strip(" -")
    return True, ""


def make_model(width, layers):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
                                 for _ in range(layers)])


def ds_config(stage, rows, width, offload=None, overlap=False, nvme_dir=None, buffers=4):
    """One rank's config: AdamW, clipping 1.0, fp32, one reduce bucket (one shard unit) per layer."""
    zero = {"stage": stage, "reduce_bucket_size": width * width + width, "sub_group_size": width * width + width}
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu"}
    elif offload == "nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_dir, "buffer_count": buffers}
    elif offload is not None:
        raise ValueError(f"offload must be None, 'cpu' or 'nvme' (got {offload!r})")
    if overlap:
        zero["offload_optimizer"]["overlap_step"] = True
    return {"train_micro_batch_size_per_gpu": rows, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 9,
            "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
            "zero_optimization": zero}


def batch(step, rows, width, device="cpu"):
    import torch
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, width, generator=g).to(device), torch.randn(rows, width, generator=g).to(device)


def calibrate(width, layers, rows, sync=lambda: None, device="cpu"):
    """(host step s, forward s at the chosen rows, rows): the host step is dsfast's CPUAdam over the model's
    parameters (fp32, on the host, with the calling thread's torch thread count); the rows make the forward as long
    as it, unless `rows` is given."""
    import torch
    from dsfast.optim import CPUAdam
    model = make_model(width, layers)
    params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = CPUAdam(params, lr=1e-4, weight_decay=0.01)

    def median_s(fn, n=5):
        fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    host = median_s(opt.step)
    model = model.to(device)

    def forward_s(r):
        x = torch.randn(r, width, device=device)
        with torch.no_grad():
            return median_s(lambda: model(x))
    if not rows:
        probe = 16
        per_row = forward_s(probe) / probe
        rows = max(1, round(host / per_row))
        for _ in range(2):   # the forward is not linear in the rows at small sizes: refine on the measured one
            rows = max(1, round(rows * host / forward_s(rows)))
    return host, forward_s(rows), rows


# ------------------------------------------------------------------------------------------------ the stand-in's cores
class Pinning:
    """The main thread on the device core; every other thread of the process on the host core."""

    def __init__(self, device_core, host_core):
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        self.on = device_core != host_core and {device_core, host_core} <= usable
        self.device_core, self.host_core = device_core, host_core
        self.why = "" if self.on else (f"cores {device_core} and {host_core} are not two usable cores of "
                                       f"{sorted(usable)}: nothing pinned")
        self.main_tid = None

    def main(self):
        if self.on:
            import threading
            self.main_tid = threading.main_thread().native_id
            os.sched_setaffinity(0, {self.device_core})   # Linux: the calling thread only

    def others(self):
        """Pin every thread but the main one (lanes start on first use, so this runs before each block)."""
        if not self.on:
            return 0
        n = 0
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != self.main_tid:
                try:
                    os.sched_setaffinity(int(tid), {self.host_core})
                    n += 1
                except OSError:   # the thread ended meanwhile
                    pass
        return n


def disk_io():
    """This process's bytes read from and written to storage so far (all threads; O_DIRECT included)."""
    d = dict(line.split(":") for line in open("/proc/self/io"))
    return int(d["read_bytes"]), int(d["write_bytes"])


# ---------------------------------------------------------------------------------------------------------- the rows
class Row:
    """One engine (or the bare model for the floor) stepped on its own batch sequence."""

    def __init__(self, name, rows, width, engine=None, model=None):
        self.name, self.rows, self.width = name, rows, width
        self.engine, self.model = engine, model
        self.steps = 0
        self.losses, self.per_step, self.step_call, self.io, self.floor_ratio = [], [], [], [], []

    def forward(self):
        import torch
        x, y = batch(self.steps, self.rows, self.width)
        out = self.engine(x) if self.engine is not None else self.model(x)
        return torch.nn.functional.mse_loss(out, y)

    def rest(self, loss):
        if self.engine is None:
            loss.backward()
            for p in self.model.parameters():
                p.grad = None
        else:
            self.engine.backward(loss)
            t0 = time.perf_counter()
            self.engine.step()
            self.step_call.append(time.perf_counter() - t0)
        self.losses.append(float(loss.detach()))
        self.steps += 1

    def settle(self):
        """A no-grad forward: it waits for every unit the last step updates (all of them: every layer is read)."""
        import torch
        if self.engine is not None:
            with torch.no_grad():
                self.engine(batch(0, 1, self.width)[0])

    def block(self, k):
        """Seconds per step over k steps, from the end of a forward to the end of the forward k steps later."""
        before = disk_io()
        loss = self.forward()
        t0 = time.perf_counter()
        for _ in range(k):
            self.rest(loss)
            loss = self.forward()
        took = (time.perf_counter() - t0) / k
        self.rest(loss)
        self.settle()
        self.io.append([(n - b) / (k + 1) for n, b in zip(disk_io(), before)])
        self.per_step.append(took)
        return took

    def masters(self):
        from dsfast.utils import safe_get_full_fp32_param
        return [safe_get_full_fp32_param(p) for p in self.engine.module.parameters()]


def build_engine(cfg, width, layers):
    import dsfast
    model = make_model(width, layers)
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


def run_rounds(rows, a, pin, between=None):
    for _ in range(a.warmup):
        for r in rows:
            r.rest(r.forward())
        for r in rows:
            r.settle()
    for i in range(a.rounds):
        order = rows[i % len(rows):] + rows[:i % len(rows)]   # rotating, so no row always follows the same one
        for r in order:
            pin.others()
            r.block(a.block)
        if between is not None:
            between()


def check_equal(rows):
    """Serial and overlapped offload bitwise equal; every row's losses close to no offload's."""
    import torch
    by = {r.name: r for r in rows}
    ref = by["no offload"].losses
    for r in rows:
        if r.engine is None or r is by["no offload"]:
            continue
        if not torch.allclose(torch.tensor(r.losses), torch.tensor(ref), rtol=1e-4, atol=1e-6):
            sys.exit(f"offload_overlap: the {r.name!r} row's losses {r.losses} differ from no offload's {ref}")
    for serial, overlap in (("offload serial", "offload overlap"), ("nvme serial", "nvme overlap")):
        if serial in by and overlap in by:
            s, o = by[serial], by[overlap]
            if s.losses != o.losses or not all(torch.equal(x, y) for x, y in zip(s.masters(), o.masters())):
                sys.exit(f"offload_overlap: {overlap!r} is not bitwise {serial!r}: losses {o.losses} vs {s.losses}")


def summary(r):
    ms = [1e3 * t for t in r.per_step]
    return statistics.median(ms), min(ms), max(ms)


DISK_STREAMS = 2   # the floor's probe: as many O_DIRECT streams as the engine's I/O pool has threads (aio default)


def nvme_rows(a, rows_n, overlap_ok, work):
    import torch  # noqa: F401  (the engines below)
    layer = a.width * a.width + a.width
    largest = a.width * a.width if a.stage == 3 else layer   # stage 3's units are parameters, else one per layer
    # fp32 masters and two moments: 12 bytes an element; the window holds buffer_count of the largest unit
    states, window = 12 * layer * a.layers, 12 * largest * a.nvme_buffers
    if states <= window:
        sys.exit(f"offload_overlap: the NVMe row's states ({mib(states)}) fit its window of {a.nvme_buffers} "
                 f"buffers ({mib(window)}): give more --layers or fewer --nvme-buffers")
    out = []
    for name, overlap in (("nvme serial", False), ("nvme overlap", True)):
        if overlap and not overlap_ok:
            continue
        d = os.path.join(work, name.replace(" ", "-"))
        os.makedirs(d)
        cfg = ds_config(a.stage, rows_n, a.width, "nvme", overlap, d, a.nvme_buffers)
        out.append(Row(name, rows_n, a.width, build_engine(cfg, a.width, a.layers)))
    return out, states, window


def mib(n):
    return f"{n / 2 ** 20:.1f} MiB"


def fs_type(path):
    import subprocess
    return subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True).stdout.strip()


def main(argv=None):
    a = parse(argv)
    if a.nvme_dir != "none":   # refused before anything is measured
        kind = fs_type(a.nvme_dir) if os.path.isdir(a.nvme_dir) else None
        if kind is None:
            sys.exit(f"offload_overlap: --nvme-dir {a.nvme_dir}: no such directory (or --nvme-dir none)")
        if kind == "tmpfs":
            sys.exit(f"offload_overlap: --nvme-dir {a.nvme_dir} is tmpfs: it is memory, not a disk (give a "
                     "directory on the disk, or --nvme-dir none)")
    # before torch starts: one OpenMP thread in every thread (the lane workers' CPU Adam included), and the test
    # placement that makes the host distinct from the "device"
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", DSFAST_TEST_PLACEMENT="distinct-host")
    import threading
    import torch
    torch.set_num_threads(1)
    seen = []
    probe = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    probe.start()
    probe.join()
    if seen != [1]:
        sys.exit(f"offload_overlap: a worker thread sees torch.get_num_threads() == {seen}, not 1")
    pin = Pinning(a.device_core, a.host_core)
    pin.main()
    overlap_ok, why = overlap_available(a.stage, "cpu")
    nvme_ok, nvme_why = overlap_available(a.stage, "nvme")
    out = {"args": vars(a), "overlap_available": {"cpu": overlap_ok, "nvme": nvme_ok},
           "overlap_refusal": {"cpu": why, "nvme": nvme_why}}

    host_s, fwd_s, rows_n = calibrate(a.width, a.layers, a.rows)
    numel = a.layers * (a.width * a.width + a.width)
    out.update(host_step_s=host_s, forward_s=fwd_s, batch_rows=rows_n, params=numel)
    print(f"model: {a.layers} x Linear({a.width}, {a.width}) + Tanh, {numel / 1e6:.2f}M params, ZeRO stage {a.stage},"
          f" fp32")
    print(f"calibration: host step (CPUAdam, 1 thread, {numel / 1e6:.2f}M params) {1e3 * host_s:.2f} ms; forward at "
          f"{rows_n} rows {1e3 * fwd_s:.2f} ms" + (" (--rows given)" if a.rows else " (rows chosen to match)"))
    print("pinning: " + (f"main thread (forward, backward, the serial step) -> core {a.device_core}; every other "
                         f"thread (lanes: copies, host step; NVMe I/O) -> core {a.host_core}; OMP_NUM_THREADS=1"
                         if pin.on else pin.why))

    rows = [Row("floor", rows_n, a.width, model=make_model(a.width, a.layers)),
            Row("no offload", rows_n, a.width, build_engine(ds_config(a.stage, rows_n, a.width), a.width, a.layers)),
            Row("offload serial", rows_n, a.width,
                build_engine(ds_config(a.stage, rows_n, a.width, "cpu"), a.width, a.layers))]
    if overlap_ok:
        rows.append(Row("offload overlap", rows_n, a.width,
                        build_engine(ds_config(a.stage, rows_n, a.width, "cpu", True), a.width, a.layers)))
    units = len(rows[2].engine.state_owner.units)
    print(f"shard units: {units} ({'one per layer' if units == a.layers else 'not one per layer'})")
    out["units"] = units
    run_rounds(rows, a, pin)

    nvme = []
    if a.nvme_dir != "none":
        import shutil
        import tempfile
        from dsfast.zero.planning.host_figures import disk_bandwidth
        work = tempfile.mkdtemp(prefix="offload-overlap-", dir=a.nvme_dir)
        try:
            nvme, states, window = nvme_rows(a, rows_n, nvme_ok, work)
            bw = []
            probe_bytes = (8 << 20) if a.quick else max(64 << 20, states)

            def probe_disk():
                bw.append(disk_bandwidth(work, probe_bytes, streams=DISK_STREAMS))
            probe_disk()
            run_rounds(nvme, a, pin, between=probe_disk)
            bw = bw[1:]   # the rounds' probes: one after each round, beside its blocks
            for r in nvme:
                for (rd, wr), (w_mbs, r_mbs), t in zip(r.io, bw, r.per_step):
                    r.floor_ratio.append(t / (rd / (r_mbs * 1e6) + wr / (w_mbs * 1e6)) if rd + wr else float("nan"))
            out["nvme"] = {"dir": a.nvme_dir, "fs": kind, "states_bytes": states, "window_bytes": window,
                           "bandwidth_write_read_mbs": bw}
            check_equal(rows + nvme)   # (before the NVMe engines go: their masters are read from their swap)
        finally:
            for r in nvme:
                r.engine.destroy()
            shutil.rmtree(work, ignore_errors=True)

    if not nvme:
        check_equal(rows)

    by = {r.name: summary(r) for r in rows + nvme}
    base, floor = by["no offload"][0], by["floor"][0]
    serial_row = next(r for r in rows if r.name == "offload serial")
    serial_host = 1e3 * statistics.median(serial_row.step_call[a.warmup:])   # the rounds' steps only
    print(f"\n{'row':<18}{'ms/step':>9}{'min':>8}{'max':>8}{'vs no offload':>15}{'vs floor':>10}"
          f"   ({a.rounds} rounds x {a.block} steps, median)")
    for r in rows + nvme:
        med, lo, hi = by[r.name]
        print(f"{r.name:<18}{med:>9.2f}{lo:>8.2f}{hi:>8.2f}{100 * (med / base - 1):>+14.1f}%"
              f"{100 * (med / floor - 1):>+9.1f}%")
    for name, ok, reason in (("offload overlap", overlap_ok, why), ("nvme overlap", nvme_ok or not nvme, nvme_why)):
        if not ok:
            print(f"{name:<18}overlap: not available ({reason})")
    print(f"serial host step (engine.step() of the offload serial row): {serial_host:.2f} ms")
    res = {"rows": {r.name: {"ms_per_step": [1e3 * t for t in r.per_step], "median_ms": by[r.name][0],
                             "losses": r.losses, "io_per_step": r.io, "disk_floor_ratio": r.floor_ratio}
                    for r in rows + nvme}, "serial_host_step_ms": serial_host}
    if overlap_ok:
        ovl = by["offload overlap"][0]
        hidden = (by["offload serial"][0] - ovl) / serial_host
        res["hidden_share"] = hidden
        print(f"host step hidden behind compute: (serial - overlap) / host step = {100 * hidden:.0f}%; overlap vs "
              f"no offload {100 * (ovl / base - 1):+.1f}% (target <= +20%)")
    for r in nvme:
        rd, wr = (statistics.median(x[j] for x in r.io) for j in range(2))
        w_mbs, r_mbs = (statistics.median(x[j] for x in out["nvme"]["bandwidth_write_read_mbs"]) for j in range(2))
        print(f"{r.name}: read {rd / 2 ** 20:.1f} MiB + written {wr / 2 ** 20:.1f} MiB per step; disk O_DIRECT read "
              f"{r_mbs:.0f} MB/s, write {w_mbs:.0f} MB/s; step / disk floor {statistics.median(r.floor_ratio):.2f}x "
              f"(median of the rounds; target <= 1.15x); states {mib(out['nvme']['states_bytes'])} > window "
              f"{mib(out['nvme']['window_bytes'])}")
    if a.quick:
        print("(--quick: a smoke of every row; these figures are not measurements)")
    out.update(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    for r in rows:
        if r.engine is not None:
            r.engine.destroy()
    return out


if __name__ == "__main__":
    main()
