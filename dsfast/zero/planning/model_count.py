"""A model's parameter count (and its largest layer's) for an offload plan, from what the user has at hand: a number
("7e9", "1.3B", "350M"), a Hugging Face config.json (or the directory holding it), a .safetensors file, or a
torch state-dict file (.pt / .pth / .bin).

A Hugging Face config is counted by building the model on the meta device when transformers is installed, else by
the standard decoder-only formula (embeddings, attention with grouped KV heads, a plain or gated MLP, norms, an
untied LM head).
"""
import json
import os
import struct

_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
STATE_DICT_FILES = (".pt", ".pth", ".bin")
# model types whose MLP is gated (gate, up, down: 3 matrices) and whose norms have no bias
_GATED = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2", "granite", "cohere",
          "internlm2", "yi", "deepseek", "starcoder2_gated"}


def parse_count(text, what="--params"):
    """A positive count from "7e9", "7000000000", "1.3B", "350M"."""
    s = str(text).strip()
    scale = _SUFFIXES.get(s[-1:].upper(), None) if s else None
    try:
        value = float(s[:-1]) * scale if scale else float(s)
    except ValueError:
        raise ValueError(f"{what}={text!r} is not a number; give e.g. 7e9, 1.3B or 350M") from None
    if not value >= 1:
        raise ValueError(f"{what}={text!r} must be at least 1")
    return int(value)


def count_model(spec):
    """(parameters, largest layer's parameters) for `spec`: a count, a config.json / directory, a .safetensors or
    state-dict file. The largest layer is 0 where a bare count gives no way to know it."""
    if not os.path.exists(str(spec)):
        try:
            return parse_count(spec, "model"), 0
        except ValueError as e:
            if "at least 1" in str(e):
                raise
            raise ValueError(f"model {spec!r} is neither a parameter count (7e9, 1.3B) nor an existing file: give "
                             "a count, a Hugging Face config.json or model directory, a .safetensors file or a "
                             f"state-dict file ({', '.join(STATE_DICT_FILES)})") from None
    path = str(spec)
    if os.path.isdir(path):
        config = os.path.join(path, "config.json")
        if not os.path.isfile(config):
            raise ValueError(f"model directory {path!r} has no config.json; point at the config or a weights file")
        path = config
    if path.endswith(".json"):
        with open(path) as f:
            try:
                return count_hf_config(json.load(f), path)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
    if path.endswith(".safetensors"):
        return _count_safetensors(path)
    if path.endswith(STATE_DICT_FILES):
        return _count_state_dict(path)
    raise ValueError(f"model file {path!r}: unknown kind; give a config.json, a .safetensors file or a state-dict "
                     f"file ({', '.join(STATE_DICT_FILES)})")


def _count_safetensors(path):
    """Counted from the header alone (8-byte length, then JSON of name -> dtype, shape, offsets)."""
    with open(path, "rb") as f:
        head = f.read(8)
        size = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < size < 1 << 30:
            raise ValueError(f"{path}: not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(size))
        except ValueError:
            raise ValueError(f"{path}: not a safetensors file (its header is not JSON)") from None
    sizes = [_prod(v["shape"]) for k, v in header.items() if k != "__metadata__"]
    return sum(sizes), max(sizes, default=0)


def _count_state_dict(path):
    import torch
    try:
        sd = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:   # torch raises many kinds for a file that is not a checkpoint
        raise ValueError(f"{path}: cannot be read as a torch state dict ({type(e).__name__}: {e})") from None
    for key in ("module", "state_dict", "model"):   # DeepSpeed / Lightning / plain wrappers
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    sizes = [t.numel() for t in sd.values() if isinstance(t, torch.Tensor)] if isinstance(sd, dict) else []
    if not sizes:
        raise ValueError(f"{path}: holds no tensors at its top level (nor under 'module' / 'state_dict')")
    return sum(sizes), max(sizes)


def _prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def count_hf_config(cfg, source="config"):
    """(parameters, largest layer) of a Hugging Face model config (a dict)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{source}: a Hugging Face config is a JSON object")
    try:
        return _count_on_meta(cfg)
    except ImportError:
        return _count_by_formula(cfg, source)
    except Exception as e:   # transformers raises several kinds for a config it cannot build
        raise ValueError(f"{source}: transformers cannot build a causal LM from this config ({type(e).__name__}: "
                         f"{e}); give the parameter count with --params") from None


def _count_on_meta(cfg):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    from .estimate import model_sizes
    return model_sizes(model)


def _get(cfg, source, *names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    if default is None:
        raise ValueError(f"{source}: none of {', '.join(names)} is set; give the parameter count with --params")
    return default


def _count_by_formula(cfg, source):
    if any(k in cfg for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise ValueError(f"{source}: a mixture-of-experts config; install transformers to count it on the meta "
                         "device, or give the parameter count with --params")
    kind = cfg.get("model_type", "")
    h = int(_get(cfg, source, "hidden_size", "n_embd", "d_model"))
    layers = int(_get(cfg, source, "num_hidden_layers", "n_layer", "num_layers"))
    vocab = int(_get(cfg, source, "vocab_size"))
    heads = int(_get(cfg, source, "num_attention_heads", "n_head"))
    kv = int(_get(cfg, source, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, source, "head_dim", default=h // heads))
    inner = int(_get(cfg, source, "intermediate_size", "n_inner", default=4 * h))
    gated = kind in _GATED
    biased = not gated if cfg.get("attention_bias") is None else bool(cfg["attention_bias"])
    attn = h * head_dim * (heads + 2 * kv) + heads * head_dim * h
    attn += (head_dim * (heads + 2 * kv) + h) if biased else 0
    mlp = (3 if gated else 2) * h * inner + (0 if gated else inner + h)
    norm = h if gated else 2 * h            # RMSNorm: a weight; LayerNorm: weight and bias
    block = attn + mlp + 2 * norm
    embed = vocab * h
    positions = int(cfg.get("n_positions", cfg.get("max_position_embeddings", 0))) if kind == "gpt2" else 0
    tied = cfg.get("tie_word_embeddings", not gated)
    total = embed + positions * h + layers * block + norm + (0 if tied else vocab * h)
    largest = max(embed, h * inner, h * head_dim * heads)
    return total, largest
