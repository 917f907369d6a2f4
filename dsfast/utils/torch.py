"""deepspeed.utils.torch: required_torch_version, the check programs (and DeepSpeed's tests) gate features on."""
import torch


def required_torch_version(min_version=None, max_version=None):
    """True when the installed torch is at least `min_version` and at most `max_version` (either may be omitted,
    not both); versions compare as torch's own TorchVersion does ("2.4" < "2.13.0+cpu")."""
    if min_version is None and max_version is None:
        raise ValueError("required_torch_version: give min_version, max_version or both")
    installed = torch.__version__      # a TorchVersion: compares with version strings
    if min_version is not None and installed < str(min_version):
        return False
    return max_version is None or installed <= str(max_version)
