"""The offloaded step's timeline (issue 28; benchmarks/gpu_check.sh's `overlap` stage): the same model without
offload, with offload_optimizer cpu, and with overlap_step where the config accepts it, a few steps each, every
piece of work placed on one clock.

    python benchmarks/offload_timeline.py --out DIR        # on a GPU (without one: "skipped: no GPU", exit 0)
    python benchmarks/offload_timeline.py --cpu-standin    # the same on CPU under the test placement (a smoke)

What is recorded, with no hook inside the engine: the engine's lanes (dsfast/accelerator/streams.py) are wrapped at
the class level for the run, so every item submitted to a lane gets a start and an end: on a GPU a pair of
torch.cuda.Events recorded on the lane's stream around the item (the gradient copies to the host and the 16-bit
uploads, on device lanes), on a worker thread (the host step, on a host lane; on the CPU stand-in the copy lanes too)
perf_counter stamps around it. The compute stream gets torch.cuda.Events at each step's forward start, forward end,
backward end and engine.step()'s return. A reference event recorded on an idle device, then synchronized, puts the
GPU's events and the host's stamps on one clock (to within the synchronize's return, microseconds). Where the engine
runs a copy on the compute stream (no lane), it shows inside the forward/backward/step marks and no lane row appears.

Printed per configuration and step: the step's time (forward start to the next forward start), forward, backward,
engine.step() to its return, each lane's busy time and span, and how much of the host lanes' work ran while the next
forward and backward ran (hidden). --out DIR gets offload_timeline.json with every interval (ms from the reference).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from offload_overlap import batch, calibrate, ds_config, make_model, overlap_available  # noqa: E402


class Clock:
    """Marks on one clock: CUDA events on the current stream (converted through a reference event), or
    perf_counter stamps; ms from the reference."""

    def __init__(self, cuda):
        import torch
        self.torch, self.cuda = torch, cuda
        if cuda:
            torch.cuda.synchronize()
            self.ref = torch.cuda.Event(enable_timing=True)
            self.ref.record()
            torch.cuda.synchronize()
        self.t_ref = time.perf_counter()

    def device_mark(self):
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, mark):
        if mark is None:
            return None
        if isinstance(mark, float):
            return 1e3 * (mark - self.t_ref)
        return self.ref.elapsed_time(mark)


class LaneRecorder:
    """Wraps the lane classes for the run: every submitted item's start and end, with its lane's name and kind."""

    def __init__(self):
        self.items, self.kinds, self._undo = [], {}, []

    def install(self):
        import torch
        from dsfast.accelerator import streams

        def patch(cls, name, make):
            orig = getattr(cls, name)
            setattr(cls, name, make(orig))
            self._undo.append((cls, name, orig))

        def lane_getter(kind):
            def make(orig):
                def get(lanes, name):
                    self.kinds[name] = kind
                    return orig(lanes, name)
                return get
            return make
        patch(streams.Lanes, "device_lane", lane_getter("device"))
        patch(streams.Lanes, "host_lane", lane_getter("host"))

        def cuda_submit(orig):
            def submit(lane, fn, what="", after_current=True):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

                def timed():   # runs with the lane's stream current: the events land on it around fn's work
                    start.record()
                    fn()
                    end.record()
                self.items.append({"lane": lane.name, "what": what, "start": start, "end": end})
                return orig(lane, timed, what, after_current)
            return submit

        def thread_submit(orig):
            def submit(lane, fn, what="", after_current=True):
                rec = {"lane": lane.name, "what": what, "start": None, "end": None}

                def timed():
                    rec["start"] = time.perf_counter()
                    fn()
                    rec["end"] = time.perf_counter()
                self.items.append(rec)
                return orig(lane, timed, what, after_current)
            return submit
        patch(streams.CudaLane, "submit", cuda_submit)
        patch(streams.ThreadLane, "submit", thread_submit)

    def uninstall(self):
        for cls, name, orig in reversed(self._undo):
            setattr(cls, name, orig)
        self._undo.clear()


def run_config(name, cfg, a, rows, device, clock, recorder):
    import dsfast
    import torch
    model = make_model(a.width, a.layers)
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]

    def step(i, marks):
        x, y = batch(i, rows, a.width, device)
        marks.append({"forward_start": clock.device_mark()})
        loss = torch.nn.functional.mse_loss(engine(x), y)
        marks[-1]["forward_end"] = clock.device_mark()
        engine.backward(loss)
        marks[-1]["backward_end"] = clock.device_mark()
        engine.step()
        marks[-1]["step_return"] = clock.device_mark()
        marks[-1]["step_return_cpu"] = time.perf_counter()
    for i in range(a.warmup):
        step(i, [])
    if clock.cuda:
        torch.cuda.synchronize()
    first_item = len(recorder.items)
    marks = []
    for i in range(a.warmup, a.warmup + a.steps):
        step(i, marks)
    x, _ = batch(0, rows, a.width, device)
    marks.append({"forward_start": clock.device_mark()})   # the last step's "next forward"
    with torch.no_grad():
        engine(x)
    marks[-1]["forward_end"] = clock.device_mark()
    if clock.cuda:
        torch.cuda.synchronize()
    engine.destroy()   # lanes drained: every item has its end
    steps = [{k: clock.ms(v) for k, v in m.items()} for m in marks]
    items = [{"lane": it["lane"], "kind": recorder.kinds.get(it["lane"], "?"), "what": it["what"],
              "start": clock.ms(it["start"]), "end": clock.ms(it["end"])} for it in recorder.items[first_item:]]
    return {"config": name, "steps": steps, "lane_items": items}


def busy(items, lo, hi):
    """ms of the items' intervals inside [lo, hi] (overlaps between items counted once)."""
    spans = sorted((max(i["start"], lo), min(i["end"], hi)) for i in items if i["start"] is not None
                   and i["end"] is not None and i["end"] > lo and i["start"] < hi)
    total, cur_lo, cur_hi = 0.0, None, None
    for s, e in spans:
        if cur_hi is None or s > cur_hi:
            total += (cur_hi - cur_lo) if cur_hi is not None else 0.0
            cur_lo, cur_hi = s, e
        else:
            cur_hi = max(cur_hi, e)
    return total + ((cur_hi - cur_lo) if cur_hi is not None else 0.0)


def report(run):
    steps, items = run["steps"], run["lane_items"]
    lanes = sorted({(i["lane"], i["kind"]) for i in items})
    print(f"--- {run['config']}: " + (", ".join(f"lane {n} ({k})" for n, k in lanes) if lanes
                                      else "no lane items (every copy on the compute stream)"))
    hidden_total, host_total = 0.0, 0.0
    for i, (s, nxt) in enumerate(zip(steps, steps[1:])):
        lo, hi = s["forward_start"], nxt["forward_start"]
        per_lane = []
        for n, k in lanes:
            mine = [it for it in items if it["lane"] == n]
            per_lane.append(f"{n} {busy(mine, lo, hi):.2f}")
        host = [it for it in items if it["kind"] == "host"]
        # the host work this step started after its backward: how much of it ran under the next forward/backward
        host_after = [it for it in host if it["start"] is not None and it["start"] >= s["backward_end"] - 1e-6
                      and it["start"] < (nxt.get("backward_end") or nxt["forward_end"])]
        h = busy(host_after, s["backward_end"], float("inf"))
        hid = busy(host_after, nxt["forward_start"], nxt.get("backward_end") or nxt["forward_end"])
        host_total, hidden_total = host_total + h, hidden_total + hid
        print(f"step {i}: {hi - lo:.2f} ms (forward {s['forward_end'] - lo:.2f}, backward "
              f"{s['backward_end'] - s['forward_end']:.2f}, step() {s['step_return'] - s['backward_end']:.2f}); "
              f"lanes busy ms: {', '.join(per_lane) or '-'}; host work {h:.2f} ms, of it under the next "
              f"forward/backward {hid:.2f} ms")
    times = [b["forward_start"] - a["forward_start"] for a, b in zip(steps, steps[1:])]
    run["median_step_ms"] = statistics.median(times)
    run["host_ms"], run["hidden_ms"] = host_total, hidden_total
    print(f"median step {run['median_step_ms']:.2f} ms; host-lane work {host_total:.2f} ms, hidden "
          f"{hidden_total:.2f} ms")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="a directory for offload_timeline.json")
    p.add_argument("--cpu-standin", action="store_true",
                   help="no GPU: run on CPU under the test placement (DSFAST_TEST_PLACEMENT=distinct-host)")
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=2)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rows", type=int, default=0, help="batch rows (default: the forward as long as the host step)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args(argv)
    if a.cpu_standin:
        # one OpenMP thread everywhere: the stand-in shares its cores with its own lanes
        os.environ.update(DSFAST_TEST_PLACEMENT="distinct-host", OMP_NUM_THREADS="1")
    import torch
    cuda = torch.cuda.is_available() and not a.cpu_standin
    if not cuda and not a.cpu_standin:
        print("offload_timeline: skipped: no GPU (torch.cuda.is_available() is False; --cpu-standin runs it on CPU)")
        return None
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    host_s, fwd_s, rows = calibrate(a.width, a.layers, a.rows, sync=sync, device=device)
    print(f"{device}: {a.layers} x Linear({a.width}, {a.width}), ZeRO stage {a.stage}, fp32; host step (CPUAdam, "
          f"{torch.get_num_threads()} threads) {1e3 * host_s:.2f} ms, forward at {rows} rows {1e3 * fwd_s:.2f} ms")
    overlap_ok, why = overlap_available(a.stage, "cpu")
    configs = [("no offload", ds_config(a.stage, rows, a.width)),
               ("offload serial", ds_config(a.stage, rows, a.width, "cpu"))]
    if overlap_ok:
        configs.append(("offload overlap", ds_config(a.stage, rows, a.width, "cpu", True)))
    recorder = LaneRecorder()
    recorder.install()
    runs = []
    try:
        clock = Clock(cuda)
        for name, cfg in configs:
            runs.append(run_config(name, cfg, a, rows, device, clock, recorder))
    finally:
        recorder.uninstall()
    for run in runs:
        report(run)
    if not overlap_ok:
        print(f"--- offload overlap: overlap: not available ({why})")
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu stand-in", "args": vars(a), "rows": rows,
           "host_step_ms": 1e3 * host_s, "forward_ms": 1e3 * fwd_s, "overlap_available": overlap_ok,
           "overlap_refusal": why, "runs": runs}
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "offload_timeline.json"), "w") as f:
            json.dump(res, f, indent=1)
    by = {r["config"]: r["median_step_ms"] for r in runs}
    print("=== summary: median step ms " + ", ".join(f"{k} {v:.2f}" for k, v in by.items())
          + "".join(f"; {k} vs no offload {100 * (v / by['no offload'] - 1):+.1f}%" for k, v in by.items()
                    if k != "no offload"))
    return res


if __name__ == "__main__":
    main()
