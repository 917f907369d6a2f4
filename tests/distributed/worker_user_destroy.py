"""A DeepSpeed-style program: a few ZeRO steps on two gloo ranks, then the program's own last line,
torch.distributed.destroy_process_group(), and a plain exit (no dsfast teardown call).
argv: stage, then "destroy" (the default) or "keep" (the group is left to dsfast's exit hook); "offload" as a third
argument puts the optimizer on the host (with DSFAST_TEST_PLACEMENT=distinct-host its copies run on lane threads).
An exit hook registered before dsfast's (so it runs after it) prints the threads still running: a daemon thread
inside a native call when the interpreter finalises aborts the process."""
import atexit
import sys
import threading


def _threads_left():
    left = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive())
    print(f"THREADS_LEFT {left}", flush=True)


atexit.register(_threads_left)

import torch  # noqa: E402

import dsfast as deepspeed  # noqa: E402

stage = int(sys.argv[1])
destroy = len(sys.argv) < 3 or sys.argv[2] == "destroy"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
zero = {"stage": stage}
if "offload" in sys.argv[3:]:
    zero["offload_optimizer"] = {"device": "cpu"}
config = {"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "zero_optimization": zero}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for _ in range(3):
    loss = engine(torch.randn(4, 16)).pow(2).mean()
    engine.backward(loss)
    engine.step()
print("TRAINED", flush=True)
if destroy:
    torch.distributed.destroy_process_group()
