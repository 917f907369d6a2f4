"""The import rule of dsfast (checked here on the source, by AST, without importing anything):

1. No import cycle among the modules of dsfast.zero: a module may import only what does not import it back,
   directly or through other zero modules (the protocol and the pieces below it never import an owner; the one
   builder imports the owners).
2. No private name crosses a file: `from x import _name`, `import x` then `x._name`, and `from . import x` then
   `x._name` are refused anywhere in dsfast when x is another dsfast module. A name two files need is public
   (no leading underscore) in the file that owns it. Dunder names (__version__, __all__) are not private.
3. Nothing in dsfast.zero imports dsfast.engine or dsfast.checkpoint (they sit above it: tests/test_layers.py).
4. dsfast.zero is laid out as its architecture, in layers (ZERO_LAYERS, lowest first): a zero module imports zero
   modules of its own folder or of a lower layer only; folders of one layer do not import each other.
     policy, transport        partition maths, placement, precision: pure data; the transports (one rank, c10d,
                              the /dev/shm table) that reduce and all-gather every layer's buffers
     nvme, step               the swap files and their window; the step's decision and its application
     units, params, grads     the shard unit and its storage; stage 3's parameters; the gradient intake, buckets
                              and reducer
     owner.py                 the protocol every owner answers
     owners                   the owners, composing the layers below (one file per owner)
     build.py                 the one place that names a stage and builds its owner
     planning                 memory estimates and the offload plan (they build owners' layouts to count them)
   zero/__init__.py (the public names) may load from any of them.

Imports inside functions count as module-level ones do: both run. Each violation names the file and line.
"""
import ast
import os

import dsfast

ROOT = os.path.dirname(dsfast.__file__)
# DeepSpeed's own API spells these with a leading underscore (programs call deepspeed.utils.groups._get_...), so
# dsfast keeps the names and its own modules use them as the public API they are
DEEPSPEED_NAMES = {"dsfast.utils.groups._get_data_parallel_group", "dsfast.utils.groups._get_data_parallel_world_size"}


def _module_name(path, root):
    rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _resolve(module_name, is_package, node):
    """The absolute module a `from ... import` names (its level resolved against the importing module)."""
    if not node.level:
        return node.module or ""
    base = module_name.split(".") if is_package else module_name.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def modules(root=ROOT):
    """{module name: path} of every .py file under root."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                out[_module_name(path, root)] = path
    return out


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def scan(path, module_name, known):
    """(imports, private uses) of one file: imports as (line, module) of dsfast modules, private uses as
    (line, text) of private names taken from another dsfast module. known: every dsfast module name."""
    tree = ast.parse(open(path).read(), path)
    is_package = path.endswith("__init__.py")
    imports, private, aliases = [], [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("dsfast"):
                    imports.append((node.lineno, a.name))
                    aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module_name, is_package, node)
            if not target.startswith("dsfast"):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in known:   # `from pkg import module`
                    imports.append((node.lineno, sub))
                    aliases[a.asname or a.name] = sub
                    continue
                imports.append((node.lineno, target))
                if _private(a.name) and target != module_name:
                    private.append((node.lineno, f"from {target} import {a.name}"))
    for node in ast.walk(tree):   # module._name, for a dsfast module bound by an import above
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name):
                dotted = ".".join([inner.id] + chain[:0:-1])   # the object the private name is read from
                for alias, real in aliases.items():
                    if dotted == alias or dotted.startswith(alias + "."):
                        owner = real + dotted[len(alias):]
                        if owner in known and owner != module_name and f"{owner}.{node.attr}" not in DEEPSPEED_NAMES:
                            private.append((node.lineno, f"{owner}.{node.attr}"))
    return imports, private


def _all_scans(root=ROOT):
    found = modules(root)
    known = set(found)
    return {name: (os.path.relpath(path, root), *scan(path, name, known)) for name, path in found.items()}


def private_imports(scans):
    return [f"{path}:{line}: {text}"
            for name, (path, _, private) in sorted(scans.items()) for line, text in private]


def zero_cycles(scans):
    """Each import cycle among dsfast.zero modules, as 'a -> b -> ... -> a' (one per strongly connected set)."""
    graph = {}
    for name, (_, imports, _) in scans.items():
        if name.startswith("dsfast.zero."):
            graph[name] = sorted({t for _, t in imports if t.startswith("dsfast.zero.") and t != name and t in scans})
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(" <-> ".join(sorted(comp)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def zero_upward(scans):
    return [f"{path}:{line}: imports {target}"
            for name, (path, imports, _) in sorted(scans.items()) if name.startswith("dsfast.zero")
            for line, target in imports if target.split(".")[:2] in (["dsfast", "engine"], ["dsfast", "checkpoint"])]


ZERO_LAYERS = [("policy", "transport"), ("nvme", "step"), ("units", "params", "grads"), ("owner",), ("owners",),
               ("build",), ("planning",)]


def _zero_place(name):
    """(layer index, folder) of a dsfast.zero module; None for the package itself."""
    parts = name.split(".")
    if len(parts) < 3:
        return None
    for i, layer in enumerate(ZERO_LAYERS):
        if parts[2] in layer:
            return i, parts[2]
    raise AssertionError(f"{name}: dsfast/zero/{parts[2]} is in no layer of ZERO_LAYERS: put it where it belongs")


def zero_layer_violations(scans):
    out = []
    for name, (path, imports, _) in sorted(scans.items()):
        here = _zero_place(name) if name.startswith("dsfast.zero.") else None
        if here is None:
            continue
        for line, target in imports:
            there = _zero_place(target) if target.startswith("dsfast.zero.") else None
            if there is not None and there[1] != here[1] and there[0] >= here[0]:
                out.append(f"{path}:{line}: {here[1]} imports {target} ({there[1]} is not below it)")
    return out


def test_zero_folders_import_only_lower_layers():
    bad = zero_layer_violations(_all_scans())
    assert bad == [], "dsfast.zero's layers (ZERO_LAYERS):\n" + "\n".join(bad)


def test_no_import_cycle_among_zero_modules():
    cycles = zero_cycles(_all_scans())
    assert cycles == [], "import cycles in dsfast.zero:\n" + "\n".join(cycles)


def test_no_private_name_crosses_a_file():
    bad = private_imports(_all_scans())
    assert bad == [], "private names imported across files (make them public where they live):\n" + "\n".join(bad)


def test_zero_imports_neither_engine_nor_checkpoint():
    bad = zero_upward(_all_scans())
    assert bad == [], "dsfast.zero imports a layer above it:\n" + "\n".join(bad)


def _plant(tmp_path, files):
    """A fake dsfast package under tmp_path with the given {relative path: source}."""
    for rel, text in files.items():
        path = tmp_path / "dsfast" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in ["", "zero", "engine"]:
        init = tmp_path / "dsfast" / d / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("")
    return _all_scans(str(tmp_path / "dsfast"))


def test_the_rules_see_planted_violations(tmp_path):
    scans = _plant(tmp_path, {
        "zero/a.py": "from .b import thing\n",
        "zero/b.py": "def f():\n    from . import a\n    return a._hidden\n",
        "zero/c.py": "from ..engine.engine import Engine\nfrom .a import _secret\n",
        "zero/d.py": "import dsfast.zero.b\nx = dsfast.zero.b._hidden\ny = dsfast.zero.b.__name__\n",
        "engine/engine.py": "from ..zero import b\nb._own\nfrom .engine import _self_is_fine\n",
    })
    assert zero_cycles(scans) == ["dsfast.zero.a <-> dsfast.zero.b"]
    assert sorted(private_imports(scans)) == [
        "engine/engine.py:2: dsfast.zero.b._own",
        "zero/b.py:3: dsfast.zero.a._hidden",
        "zero/c.py:2: from dsfast.zero.a import _secret",
        "zero/d.py:2: dsfast.zero.b._hidden"]
    assert zero_upward(scans) == ["zero/c.py:1: imports dsfast.engine.engine"]


def test_the_layer_rule_sees_planted_violations(tmp_path):
    scans = _plant(tmp_path, {
        "zero/policy/p.py": "from ..owners.o import thing\n",
        "zero/owners/o.py": "from ..policy import p\nfrom ..grads import g\nthing = 1\n",
        "zero/grads/g.py": "from ..units.u import x\nfrom ..policy.p import y\n",
        "zero/units/u.py": "x = 1\n",
        "zero/build.py": "from .owners import o\n",
    })
    assert sorted(zero_layer_violations(scans)) == [
        "zero/grads/g.py:1: grads imports dsfast.zero.units.u (units is not below it)",
        "zero/policy/p.py:1: policy imports dsfast.zero.owners.o (owners is not below it)"]
