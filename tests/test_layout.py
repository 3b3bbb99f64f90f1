"""The package's layout, checked on its source with `ast` (nothing is
imported): no import cycles, counting imports inside functions, and each
folder imports only the layers below it.

    kerasdist/common/      framework-neutral runtime: imports only common/
    kerasdist/tensorflow/  the TensorFlow binding: common/ and itself
    kerasdist/torch/       the PyTorch binding: common/ and itself, and no
                           other framework (TensorFlow, Keras, JAX)
    kerasdist/_keras/      the Keras layer: common/, the bindings, itself;
                           its backend-neutral modules and callbacks/ import
                           no binding or framework but Keras at module level
    public modules         kerasdist.keras, .data (+ ._data_arrays), .elastic, ._dispatch
                           and callbacks/:
                           any of the above, and each other
    kerasdist/runner/      the launcher: the standard library and runner/
                           only. The one exception is an import of the
                           public package and its TensorFlow binding
                           (`import kerasdist`, `import kerasdist.tensorflow`)
                           inside a function, run on request in the
                           launcher's process (`kerasdist-run --check-build`,
                           which reports whether the op library loads); the
                           rank-side worker imports the user's code, not
                           kerasdist's.
    kerasdist/__init__.py  loads every public name lazily by module path
                           (`_EXPORTS`), so it imports none of them.

A private module (`pkg/_x.py`) is imported only from its own package, and
a private name (`_x`) only from a module of the importer's own package.
"""

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Modules that setup.py writes when it builds the op library (gitignored).
GENERATED = {"kerasdist._build_info"}
# Frameworks: never imported by kerasdist.common nor runner/.
FRAMEWORKS = {"tensorflow", "keras", "tf_keras", "jax", "torch"}


def _source_modules():
    """{module name: path} of every module of kerasdist and its callbacks."""
    found = {}
    for top, package in ((ROOT / "kerasdist", "kerasdist"),
                         (ROOT / "callbacks", "kerasdist.callbacks")):
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(top)
            if "csrc" in rel.parts or rel.name in GENERATED_FILES:
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package] + parts)] = path
    return found


GENERATED_FILES = {name.rpartition(".")[2] + ".py" for name in GENERATED}
MODULES = _source_modules()
KNOWN = set(MODULES) | GENERATED


def _is_package(module):
    return MODULES[module].name == "__init__.py"


class _Import:
    """One imported kerasdist module (or external top-level package)."""

    def __init__(self, importer, target, names, line, in_function):
        self.importer, self.target, self.names = importer, target, names
        self.line, self.in_function = line, in_function

    def __repr__(self):
        where = "in a function" if self.in_function else "at module level"
        return f"{self.importer}:{self.line} imports {self.target} {where}"


def _resolve(module, node):
    """The absolute module name of a `from ... import` node."""
    if not node.level:
        return node.module
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _imports(module):
    """Every import of `module`, with whether it runs inside a function."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(_target(module, alias.name, [], child.lineno, nested))
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(module, child)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    if sub in KNOWN:  # `from package import module`
                        found.append(_Import(module, sub, [], child.lineno, nested))
                    else:
                        found.append(_target(module, base, [alias.name], child.lineno, nested))
            visit(child, nested)

    visit(tree, False)
    return found


def _target(module, name, names, line, in_function):
    """The longest known kerasdist module that `name` starts with, or the
    external top-level package."""
    if name.split(".")[0] != "kerasdist":
        return _Import(module, name, names, line, in_function)
    parts = name.split(".")
    while ".".join(parts) not in KNOWN:
        parts.pop()
    return _Import(module, ".".join(parts), names, line, in_function)


IMPORTS = {module: _imports(module) for module in MODULES}


def _internal(imports):
    return [i for i in imports if i.target.split(".")[0] == "kerasdist"]


def _layer(module):
    if module == "kerasdist":
        return "package"
    part = module.split(".")[1]
    if part in ("common", "tensorflow", "torch", "jax", "_keras", "runner", "callbacks"):
        return part
    if module in GENERATED:
        return "generated"
    return "public"


ALLOWED = {
    "common": {"common", "generated"},
    "tensorflow": {"common", "tensorflow", "generated"},
    "torch": {"common", "torch", "generated"},
    "jax": {"common", "jax", "generated"},
    "_keras": {"common", "tensorflow", "torch", "jax", "_keras", "generated"},
    "public": {"common", "tensorflow", "torch", "jax", "_keras", "public", "callbacks",
               "package", "generated"},
    "callbacks": {"common", "_keras", "public", "callbacks", "generated"},
    "runner": {"runner"},
    "package": set(),
}


def _graph():
    graph = {module: set() for module in MODULES}
    for module, imports in IMPORTS.items():
        for i in _internal(imports):
            if i.target != module and i.target in MODULES:
                graph[module].add(i.target)
    return graph


def _cycles(graph):
    """The strongly connected components with more than one module
    (Tarjan), each as a sorted list."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _example_cycle(graph, component):
    """One cycle through the first module of `component`, as a path."""
    start, members = component[0], set(component)
    paths = [[start]]
    seen = set()
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & members):
            if w == start:
                return " -> ".join(path + [start])
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return " <-> ".join(component)


def test_the_layout_is_as_documented():
    for folder in ("common", "tensorflow", "torch", "jax", "_keras", "runner"):
        assert f"kerasdist.{folder}" in MODULES, f"kerasdist/{folder}/ is missing"
    for public in ("kerasdist.keras", "kerasdist.data", "kerasdist.elastic",
                   "kerasdist.callbacks", "kerasdist.runner.cli"):
        assert public in MODULES, public
    flat = [m for m in MODULES if m.count(".") == 1 and _layer(m) == "public"]
    assert sorted(flat) == ["kerasdist._data_arrays", "kerasdist._dispatch", "kerasdist.data",
                            "kerasdist.elastic",
                            "kerasdist.keras"], flat


def test_no_import_cycles_counting_imports_in_functions():
    graph = _graph()
    cycles = [f"{', '.join(c)}; e.g. {_example_cycle(graph, c)}" for c in _cycles(graph)]
    assert not cycles, "Modules that import each other:\n" + "\n".join(cycles)


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for module, imports in IMPORTS.items():
        layer = _layer(module)
        for i in _internal(imports):
            if _layer(i.target) in ALLOWED[layer] or i.target == module:
                continue
            if (layer == "runner" and i.in_function
                    and i.target in ("kerasdist", "kerasdist.tensorflow")):
                continue  # `kerasdist-run --check-build` (see the docstring)
            wrong.append(f"{i} ({layer} may import {sorted(ALLOWED[layer])})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("binding,own", [("torch", {"torch"}), ("jax", {"jax", "jaxlib"})])
def test_a_framework_binding_imports_no_other_framework(binding, own):
    other = sorted(str(i) for imports in IMPORTS.values() for i in imports
                   if _layer(i.importer) == binding
                   and i.target.split(".")[0] in FRAMEWORKS - own)
    assert not other, other


# The Keras layer's modules that serve every backend (the rest are one
# backend's: reduce.py and tape.py TensorFlow's, reduce_torch.py PyTorch's).
KERAS_NEUTRAL = ("backend", "compression", "first_update", "fit_guard", "optimizer", "variables",
                 "schedules", "settings", "sync_batch_norm")


def test_the_keras_layer_and_callbacks_load_no_backend_at_module_level():
    wrong = []
    for module, imports in IMPORTS.items():
        layer = _layer(module)
        neutral = (layer == "callbacks" or (
            layer == "_keras" and module.rpartition(".")[2] in KERAS_NEUTRAL))
        if not neutral:
            continue
        for i in imports:
            top = i.target.split(".")[0]
            binding = (_layer(i.target) in ("tensorflow", "torch", "jax") if top == "kerasdist"
                       else False)
            if not i.in_function and (binding or top in FRAMEWORKS - {"keras"}):
                wrong.append(str(i))
    assert not wrong, "\n".join(wrong)


def test_common_imports_no_framework():
    framework = sorted(str(i) for imports in IMPORTS.values() for i in imports
                       if _layer(i.importer) == "common"
                       and i.target.split(".")[0] in FRAMEWORKS)
    assert not framework, framework


def test_runner_imports_the_standard_library_at_module_level():
    wrong = []
    for module, imports in IMPORTS.items():
        if _layer(module) != "runner":
            continue
        for i in imports:
            top = i.target.split(".")[0]
            if top in FRAMEWORKS:
                wrong.append(f"{i}: a framework")
            elif not i.in_function and top not in sys.stdlib_module_names | {"kerasdist"}:
                wrong.append(f"{i}: not the standard library")
    assert not wrong, "\n".join(wrong)


def test_no_private_framework_modules():
    wrong = [str(i) for imports in IMPORTS.values() for i in imports
             if i.target.startswith(("tensorflow.python", "tensorflow.core",
                                     "tensorflow.compiler", "tensorflow.tsl",
                                     "keras.src", "tf_keras", "jax._src", "jaxlib"))]
    assert not wrong, "\n".join(wrong)


def _package_of(module):
    return module if _is_package(module) else module.rpartition(".")[0]


def test_private_modules_and_names_stay_in_their_package():
    wrong = []
    for module, imports in IMPORTS.items():
        mine = _package_of(module) if module in MODULES else module
        for i in _internal(imports):
            owner, _, last = i.target.rpartition(".")
            if last.startswith("_") and not (mine + ".").startswith(owner + "."):
                wrong.append(f"{i}: a private module of {owner}")
            if i.target in MODULES:
                home = _package_of(i.target)
                for name in i.names:
                    if name.startswith("_") and home != mine:
                        wrong.append(f"{i}: its private name {name}")
    assert not wrong, "\n".join(wrong)


def _exports():
    """kerasdist/__init__.py's `_EXPORTS`, evaluated from its source."""
    tree = ast.parse(MODULES["kerasdist"].read_text())
    namespace = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            exec(compile(ast.Module([node], []), "_EXPORTS", "exec"), namespace)
        elif isinstance(node, ast.For) and "_EXPORTS" in ast.unparse(node):
            exec(compile(ast.Module([node], []), "_EXPORTS", "exec"), namespace)
    return namespace["_EXPORTS"]


def _defined_names(module):
    """The names `module` defines or imports at module level."""
    tree = ast.parse(MODULES[module].read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@pytest.mark.parametrize("name", sorted(_exports()))
def test_every_public_name_points_at_a_module_that_defines_it(name):
    module = _exports()[name]
    assert module in MODULES, f"kerasdist.{name}: no module {module}"
    assert name in _defined_names(module), f"kerasdist.{name}: {module} has no {name}"
