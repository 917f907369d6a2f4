"""The package's layers point one way: ops <- optim <- zero <- checkpoint <- engine (DESIGN.md).

Every import in every module of these five packages (module level or inside a function: both run) is resolved to
the package it names; importing a higher layer is an error naming the file and line, and so is any cycle between
the packages (which the order already rules out, but the message then says which). Packages outside the five
(comm, config, accelerator, utils, ...) are not ranked here.
"""
import ast
import os

import pytest

import dsfast

ROOT = os.path.dirname(dsfast.__file__)
LAYERS = ["ops", "optim", "zero", "checkpoint", "engine"]
# DeepSpeed's import paths that dsfast keeps where DeepSpeed has them: re-exports, not dependencies of the layer
COMPAT_PATHS = {"ops/adam.py": "deepspeed.ops.adam re-exports dsfast.optim's DeepSpeedCPUAdam / FusedAdam",
                "ops/adagrad.py": "deepspeed.ops.adagrad re-exports dsfast.optim's DeepSpeedCPUAdagrad",
                "ops/lion.py": "deepspeed.ops.lion re-exports dsfast.optim's DeepSpeedCPULion",
                "utils/zero_to_fp32.py": "deepspeed.utils.zero_to_fp32 re-exports dsfast.checkpoint.zero_to_fp32"}


def _package_of(module_name):
    parts = module_name.split(".")
    if len(parts) >= 2 and parts[0] == "dsfast" and parts[1] in LAYERS:
        return parts[1]
    return None


def _imports(path, module_name):
    """(line, imported dsfast module name) for every import in the file."""
    tree = ast.parse(open(path).read(), path)
    package = module_name.rsplit(".", 1)[0] if not path.endswith("__init__.py") else module_name
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            out += [(node.lineno, n) for n in names]
    return out


def _edges():
    edges = []
    for layer in LAYERS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, layer)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                if os.path.relpath(path, ROOT) in COMPAT_PATHS:
                    continue
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                module_name = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
                for line, target in _imports(path, module_name):
                    to = _package_of(target)
                    if to is not None and to != layer:
                        edges.append((layer, to, f"{os.path.relpath(path, ROOT)}:{line} imports {target}"))
    return edges


def test_no_layer_imports_a_layer_above_it():
    upward = [where for src, dst, where in _edges() if LAYERS.index(dst) > LAYERS.index(src)]
    assert upward == [], "imports against the layer order " + " < ".join(LAYERS) + ":\n" + "\n".join(upward)


def test_no_import_cycle_between_the_packages():
    graph = {}
    for src, dst, where in _edges():
        graph.setdefault(src, {}).setdefault(dst, where)

    def reach(start, seen):
        for nxt in graph.get(start, {}):
            if nxt not in seen:
                seen.add(nxt)
                reach(nxt, seen)
        return seen
    cycles = [(a, b, w) for a in graph for b, w in graph[a].items() if a in reach(b, set())]
    assert cycles == [], "\n".join(f"{a} -> {b} ({w}) and back" for a, b, w in cycles)


def test_the_check_sees_a_real_upward_import(tmp_path):
    # the resolver itself: a relative import from zero/ into engine/ is found as one
    path = tmp_path / "mod.py"
    path.write_text("from ..engine.engine import Engine\n\ndef f():\n    import dsfast.checkpoint.load\n")
    found = [_package_of(t) for _, t in _imports(str(path), "dsfast.zero.mod")]
    assert found == ["engine", "checkpoint"]


@pytest.mark.parametrize("layer", LAYERS)
def test_every_layer_imports_alone(layer):
    import subprocess
    import sys
    # importing a lower layer first must not need a higher one to be loaded (no hidden upward dependency)
    code = f"import dsfast.{layer}, sys; bad = [m for m in sys.modules if m.startswith('dsfast.') and " \
           f"m.split('.')[1] in {LAYERS!r} and {LAYERS!r}.index(m.split('.')[1]) > {LAYERS.index(layer)}]; " \
           "print(bad); assert not bad"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(ROOT))


@pytest.mark.parametrize("rel", sorted(COMPAT_PATHS))
def test_compat_paths_only_re_export(rel):
    # the one reason a compat path may import a higher layer is that DeepSpeed's programs import the name there:
    # such a file holds imports, __all__ and at most a __getattr__ that refuses a missing name, no logic
    tree = ast.parse(open(os.path.join(ROOT, rel)).read())
    for node in tree.body[1:] if ast.get_docstring(tree) else tree.body:
        ok = isinstance(node, (ast.Import, ast.ImportFrom)) or \
            (isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]) \
            or (isinstance(node, ast.FunctionDef) and node.name == "__getattr__")
        assert ok, f"{rel}:{node.lineno}: a compat path re-exports only ({COMPAT_PATHS[rel]})"
