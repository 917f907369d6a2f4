"""`dsfast report` / `python -m dsfast.report`: what this machine has and what state every op is in.

Builds nothing: it reads versions, CPU flags and the op cache, so it is safe to run anywhere,
including on a machine where an op's build is broken (that is when you want it).
"""
import argparse
import json
import os
import platform
import sys

from .version import __version__ as dsfast_version


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect():
    """Everything the report shows, as a plain dict (also printed by --json)."""
    import torch

    import dsfast
    from dsfast.ops import env, paths, status, toolchain
    from dsfast.ops.registry import OPS

    try:
        csrc = str(paths.csrc_root())
    except FileNotFoundError as e:
        csrc = f"NOT FOUND: {e}"
    try:
        torch_isa = torch.backends.cpu.get_cpu_capability()
    except AttributeError:          # older torch
        torch_isa = None
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            gpus.append(f"{torch.cuda.get_device_name(i)} (sm_{major}{minor})")
    cxx = toolchain.cxx_path()
    nvcc = toolchain.nvcc_path()
    ops = {}
    for name, spec in sorted(OPS.items()):
        try:
            state, detail = status.op_status(spec)
        except Exception as e:      # the report must survive any one op's problem
            state, detail = status.UNAVAILABLE, f"{type(e).__name__}: {e}"
        try:
            op_abi = status.op_abi(spec)
        except Exception:       # noqa: BLE001 (the report must survive any one op's problem)
            op_abi = None
        ops[name] = {"state": state, "detail": detail, "cuda": spec.with_cuda, "reference": spec.reference,
                     "abi": op_abi}
    return {
        "dsfast": {"version": dsfast_version, "location": os.path.dirname(dsfast.__file__), "csrc": csrc},
        "python": f"{platform.python_version()} ({sys.executable})",
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda,
                  "location": os.path.dirname(torch.__file__)},
        "compilers": {"c++": f"{cxx}: {toolchain.tool_version(cxx)}" if cxx else "not found",
                      "nvcc": f"{nvcc}: {toolchain.tool_version(nvcc)}" if nvcc else "not found",
                      "ninja": toolchain.tool_version(toolchain.ninja_path()) or "not found"},
        "cpu": {"model": _cpu_model(), "machine": platform.machine(), "cores": os.cpu_count(),
                "torch_threads": torch.get_num_threads(), "isa": toolchain.cpu_isa(),
                "torch_capability": torch_isa},
        "gpu": {"visible": bool(gpus), "devices": gpus},
        "cache_dir": str(env.cache_root()),
        "settings": {k: v for k, v in sorted(os.environ.items())
                     if k.startswith("DSFAST_") or k in ("CXX", "CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS")},
        "ops": ops,
    }


def format_report(info):
    lines = []

    def row(label, value):
        lines.append(f"{label:<22}{value}")

    d, t, c, cpu, gpu = info["dsfast"], info["torch"], info["compilers"], info["cpu"], info["gpu"]
    row("dsfast", f"{d['version']} ({d['location']})")
    row("kernel sources", d["csrc"])
    row("python", info["python"])
    row("torch", f"{t['version']} ({t['location']})")
    row("torch CUDA", t["cuda"] or "none (CPU-only torch)")
    row("c++ compiler", c["c++"])
    row("nvcc", c["nvcc"])
    row("ninja", c["ninja"])
    row("cpu", f"{cpu['model']} [{cpu['machine']}], {cpu['cores']} cores, torch threads {cpu['torch_threads']}")
    row("cpu isa", " ".join(cpu["isa"]) or "none of avx2/avx512/fma")
    row("torch cpu capability", cpu["torch_capability"] or "unknown")
    row("gpu visible", ("yes: " + "; ".join(gpu["devices"])) if gpu["visible"] else "no")
    row("op cache", info["cache_dir"])
    if info["settings"]:
        row("settings", " ".join(f"{k}={v}" for k, v in info["settings"].items()))
    lines.append("")
    lines.append("ops:")
    if not info["ops"]:
        lines.append("  (none registered)")
    for name, op in info["ops"].items():
        abi = f"[{op['abi']} ABI] " if op.get("abi") else ""
        lines.append(f"  {name:<16}{op['state']:<12}{abi}{op['detail']}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="dsfast report",
                                     description="Show versions, CPU/GPU and the state of every dsfast op. "
                                                 "Builds nothing.")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    info = collect()
    print(json.dumps(info, indent=1) if args.json else format_report(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
