"""The `import deepspeed` -> dsfast shim (deepspeed_shim.py) that program tests run through: every import form
DeepSpeed programs use resolves to the dsfast object."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from deepspeed_shim import shim_env  # noqa: E402

CHECK = """
import deepspeed, dsfast
import deepspeed.comm as dist
from deepspeed import comm
from deepspeed.accelerator import get_accelerator
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from deepspeed.moe.layer import MoE
assert dist is comm is dsfast.comm and deepspeed.accelerator is dsfast.accelerator
assert get_accelerator is dsfast.accelerator.get_accelerator and deepspeed.get_accelerator is get_accelerator
assert deepspeed.initialize is dsfast.initialize and deepspeed.init_distributed is dsfast.init_distributed
assert deepspeed.add_config_arguments is dsfast.add_config_arguments and deepspeed.moe.layer.MoE is MoE
assert deepspeed.__version__ == dsfast.__version__ and deepspeed.ops is dsfast.ops
print("SHIM_OK", deepspeed.__file__)
"""


def test_every_import_form_reaches_dsfast(tmp_path):
    env = {**os.environ, **shim_env(tmp_path)}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "SHIM_OK" in done.stdout, done.stdout + done.stderr
    assert str(tmp_path) in done.stdout           # the shim, not an installed DeepSpeed
