"""deepspeed.init_inference (dsfast.inference): the model in the requested dtype on this rank's device, in eval
mode, its forward and generate unchanged; settings merged from config and arguments; what dsfast does not do is
an error or, where outputs are the same either way, a warning naming the key."""
import json

import pytest
import torch

import dsfast


class Gen(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))

    def generate(self, x, steps=2):
        for _ in range(steps):
            x = self(x)
        return x


@pytest.mark.parametrize("how", ["kwargs", "config", "file"])
def test_the_model_runs_in_the_requested_dtype_in_eval_mode(how, tmp_path):
    torch.manual_seed(0)
    ref = Gen()
    model = Gen()
    model.load_state_dict(ref.state_dict())
    if how == "kwargs":
        engine = dsfast.init_inference(model, dtype=torch.bfloat16, tensor_parallel={"tp_size": 1})
    elif how == "config":
        engine = dsfast.init_inference(model, config={"dtype": "bf16", "mp_size": 1})
    else:
        path = tmp_path / "inf.json"
        path.write_text(json.dumps({"dtype": "bfloat16"}))
        engine = dsfast.init_inference(model, config=str(path))
    assert isinstance(engine, dsfast.InferenceEngine) and engine.module is model
    assert model.lin.weight.dtype == torch.bfloat16 and not model.training
    x = torch.randn(3, 8)
    want = ref.eval().to(torch.bfloat16)(x.to(torch.bfloat16))
    assert torch.equal(engine(x.to(torch.bfloat16)), want)             # dropout off: eval
    assert torch.equal(engine.generate(x.to(torch.bfloat16), steps=3), ref.generate(x.to(torch.bfloat16), 3))


def test_default_dtype_is_fp16_as_deepspeed_s():
    assert dsfast.init_inference(Gen()).module.lin.weight.dtype == torch.float16


def test_what_dsfast_does_not_do_is_said():
    with pytest.warns(UserWarning, match=r"replace_with_kernel_inject=True has no effect in dsfast"):
        dsfast.init_inference(Gen(), dtype=torch.float32, replace_with_kernel_inject=True)
    with pytest.raises(NotImplementedError, match=r"tensor parallelism \(tp_size / mp_size 2\) is not supported"):
        dsfast.init_inference(Gen(), tensor_parallel={"tp_size": 2})
    with pytest.raises(NotImplementedError, match="dtype=int8"):
        dsfast.init_inference(Gen(), dtype=torch.int8)
    with pytest.raises(NotImplementedError, match="checkpoint"):
        dsfast.init_inference(Gen(), checkpoint="ckpt.json")
    with pytest.raises(ValueError, match=r"unknown setting 'replace_with_kernel_injct'; did you mean "
                                         r"'replace_with_kernel_inject'"):
        dsfast.init_inference(Gen(), replace_with_kernel_injct=True)
    with pytest.raises(ValueError, match=r"'dtype' is 'fp16' in config but torch.bfloat16 as an argument"):
        dsfast.init_inference(Gen(), config={"dtype": "fp16"}, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"dtype='fp8'; valid: a torch dtype or one of fp16"):
        dsfast.init_inference(Gen(), dtype="fp8")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        dsfast.init_inference(object())
