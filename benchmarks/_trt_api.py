"""What edgecap asks of the TensorRT modules (`tensorrt`, `tensorrt_rtx`) and cuda-python, read from edgecap's own source,
and whether a given module has it. A development tool (benchmarks/trt_api_check.py and
tests/test_tensorrt_api.py run it), not part of the installed package.

The uses are not a hand-written list: the TensorRT code (export/tensorrt.py, the engine
runner in runtime/engines.py) is parsed, and every attribute read or called on a TensorRT
object is collected, with how it is used (read or called, how many positional arguments,
which keywords). An object's class comes from the variable it is held in (`builder` is a
`Builder`, `config` an `IBuilderConfig`, `self.context` an `IExecutionContext`, ... see
ROLES), and the check confirms it: a call's documented return class must be the class of the
variable its result is stored in, so a TensorRT object held under another name is reported
instead of silently escaping the check. `trt.X.Y` chains are read from the module itself; a
class deriving from a TensorRT class must override methods that class has. Code that only runs on some API releases
(a distribution and its major: 'tensorrt-10', 'tensorrt-11', 'tensorrt-rtx-1') sits in a function decorated
`@trt_apis(...)` (edgecap.runtime.tensorrt_dist), and its uses are checked against those releases only.

`missing_api(trt)` checks the collected uses against a live module (the installed `tensorrt` or
`tensorrt_rtx`, or the real pybind11 bindings of any release loaded offline by benchmarks/trt_api_check.py): each
name must exist, a call must be a method (not a property), a read must not be a method, and
the call's arguments must fit the signature pybind11 writes into the method's docstring.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import edgecap
from edgecap.runtime import tensorrt_dist
from edgecap.runtime.tensorrt_dist import SUPPORTED_RELEASES, release_of

# variable name -> the TensorRT class it holds throughout the TensorRT code ("" = the module)
ROLES = {
    "trt": "", "builder": "Builder", "config": "IBuilderConfig", "network": "INetworkDefinition",
    "parser": "OnnxParser", "layer": "ILayer", "tensor": "ITensor", "output": "ITensor",
    "engine": "ICudaEngine", "context": "IExecutionContext", "runtime": "Runtime", "cache": "ITimingCache",
    "plan": "IHostMemory", "dtype": "DataType", "logger": "Logger", "error": "ParserError",
    "runtime_config": "IRuntimeConfig", "runtime_cache": "IRuntimeCache",
}
CUDA_CLASSES = {"props": "cudaDeviceProp"}  # variable -> the cuda-python class it holds
CUDA_ROLE = "cudart"  # cuda-python's runtime module, checked by missing_cuda_api

_ROOT = Path(edgecap.__file__).resolve().parent
SOURCES = (_ROOT / "export" / "tensorrt.py", _ROOT / "runtime" / "engines.py", _ROOT / "runtime" / "tensorrt_dist.py")


@dataclass(frozen=True)
class Use:
    owner: str  # a class name, "" for the module itself, or "cudart"
    path: tuple[str, ...]  # attribute chain below the owner
    called: bool
    positional: int
    keywords: tuple[str, ...]
    where: str  # file:line
    apis: tuple[str, ...] = SUPPORTED_RELEASES  # the API releases the use runs on
    override: bool = False  # a method defined in a subclass of owner
    holder: str = ""  # the variable a call's result is stored in

    @property
    def name(self) -> str:
        return ".".join(((self.owner or "tensorrt"),) + self.path)


def _chain(node) -> tuple[str | None, tuple[str, ...]]:
    """(root variable, attribute chain) of `a.b.c`; `self.engine.x` -> ("engine", ("x",))."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None, ()
    parts.reverse()
    if node.id == "self" and parts:
        return parts[0], tuple(parts[1:])
    return node.id, tuple(parts)


def _constants(tree) -> dict:
    """The module's NAME = literal assignments and tensorrt_dist's tuples of releases (a
    decorator may say `@trt_apis(*RTX_RELEASES)`)."""
    found = {name: value for name, value in vars(tensorrt_dist).items()
             if name.isupper() and isinstance(value, tuple) and all(isinstance(v, str) for v in value)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def _decorated_apis(node, constants: dict) -> tuple[str, ...] | None:
    for dec in getattr(node, "decorator_list", []):
        if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "trt_apis":
            apis = []
            for arg in dec.args:
                if isinstance(arg, ast.Starred):
                    apis += constants[arg.value.id]
                else:
                    apis.append(ast.literal_eval(arg))
            return tuple(str(a) for a in apis)
    return None


class _Collector(ast.NodeVisitor):
    def __init__(self, tree, file: str):
        self.file, self.constants = file, _constants(tree)
        self.uses, self.apis, self.calls, self.holders = [], [SUPPORTED_RELEASES], {}, {}
        for node in ast.walk(tree):  # before visiting: an attribute needs to know whether it is called
            if isinstance(node, ast.Call):
                self.calls[id(node.func)] = node
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call):
                target = node.targets[0]
                self_attr = isinstance(target, ast.Attribute) and getattr(target.value, "id", "") == "self"
                name = target.id if isinstance(target, ast.Name) else target.attr if self_attr else ""
                self.holders[id(node.value.func)] = name

    def _scoped(self, node):
        apis = _decorated_apis(node, self.constants)
        self.apis.append(apis or self.apis[-1])
        self.generic_visit(node)
        self.apis.pop()

    visit_FunctionDef = _scoped

    def visit_ClassDef(self, node):
        for base in node.bases:
            root, chain = _chain(base)
            if root == "trt" and len(chain) == 1:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                        self._add(chain[0], (item.name,), False, 0, (), item, override=True)
        self._scoped(node)

    def visit_Attribute(self, node):
        root, chain = _chain(node)
        if root is None or not chain:
            self.generic_visit(node)  # rooted in a call's result: the call's own chain is read below
            return
        owner = CUDA_ROLE if root in (CUDA_ROLE, *CUDA_CLASSES) else ROLES.get(root)
        if owner is None:
            self.generic_visit(node)
            return
        call = self.calls.get(id(node))
        if root not in (CUDA_ROLE, "trt") and len(chain) > 1:  # obj.field.more: what follows is the field's own
            chain, call = chain[:1], None
        if root in CUDA_CLASSES:
            chain = (CUDA_CLASSES[root], *chain)
        if owner == "" and len(chain) >= 2 and chain[0] in ROLES.values():
            owner, chain = chain[0], chain[1:]
        self._add(owner, chain, call is not None, len(call.args) if call else 0,
                  tuple(k.arg for k in call.keywords if k.arg) if call else (), node, holder=self.holders.get(id(node), ""))

    def _add(self, owner, chain, called, positional, keywords, node, override=False, holder=""):
        self.uses.append(Use(owner, chain, called, positional, keywords, f"{self.file}:{node.lineno}",
                             self.apis[-1], override, holder))


def api_uses(sources=SOURCES) -> list[Use]:
    """Every TensorRT / cuda-python use in `sources`, in source order."""
    uses = []
    for path in sources:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        collector = _Collector(tree, Path(path).name)
        collector.visit(tree)
        uses += collector.uses
    return uses


_SIGNATURE = re.compile(r"^(?:\d+\. )?(\w+)\((.*)\)(?: -> ([\w.:]+))?$")


def signatures(obj) -> list[tuple[list[str], int]]:
    """[(parameter names, how many have no default)] of each overload pybind11 documented
    for `obj` (self dropped); [] when the docstring has none."""
    found = []
    for line in (getattr(obj, "__doc__", None) or "").splitlines():
        match = _SIGNATURE.match(line.strip())
        if not match:
            continue
        params = [p.strip() for p in _split_params(match.group(2)) if p.strip()]
        names = [p.split(":")[0].split("=")[0].strip() for p in params]
        if names and names[0] == "self":
            params, names = params[1:], names[1:]
        found.append((names, sum("=" not in p for p in params)))
    return found


def _split_params(text: str) -> list[str]:
    """Split a signature's parameters on the commas outside brackets (types like list[int, str])."""
    out, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "[(" and 1 or (-1 if ch in "])" else 0)
        if ch == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += ch
    return out + [current]


def returned_class(member, module) -> str:
    """The module's class a call of `member` returns, as documented ('' if none or not a class)."""
    if inspect.isclass(member):
        return member.__name__
    for line in (getattr(member, "__doc__", None) or "").splitlines():
        match = _SIGNATURE.match(line.strip())
        if match and match.group(3):
            name = re.split(r"[.:]", match.group(3))[-1]
            return name if inspect.isclass(getattr(module, name, None)) else ""
    return ""


def _held_right(use: Use, member, module) -> str:
    """'' when the variable the call's result is stored in is read as the class it returns."""
    returned = returned_class(member, module) if use.holder else ""
    expected = ROLES.get(use.holder, "")
    if returned and returned != expected:
        return (f"returns {returned}, stored in {use.holder!r}, which the check reads as {expected or 'nothing'} "
                f"(hold it in a variable trt_api.ROLES maps to {returned})")
    return ""


def _fits(use: Use, member) -> str:
    """'' when the call fits one documented overload, else what does not."""
    target = member.__init__ if inspect.isclass(member) else member
    overloads = signatures(target)
    if not overloads:
        return ""  # undocumented (a plain Python function or a class without a doc): nothing to compare
    for names, required in overloads:
        given = use.positional + len(use.keywords)
        if use.positional <= len(names) and set(use.keywords) <= set(names[use.positional:]) and given >= required:
            return ""
    documented = " | ".join("(" + ", ".join(n) + ")" for n, _ in overloads)
    return f"called with {use.positional} positional and keywords {list(use.keywords)}, documented as {documented}"


def check_use(use: Use, module) -> str:
    """'' when `module` has what `use` needs, else the problem in a few words."""
    obj = module if use.owner in ("", CUDA_ROLE) else getattr(module, use.owner, None)
    if obj is None:
        return "no such class"
    for i, part in enumerate(use.path):
        holder, static = obj, inspect.getattr_static(obj, part, None) if inspect.isclass(obj) else None
        if not hasattr(obj, part):
            return "missing"
        obj = getattr(obj, part)
        last = i == len(use.path) - 1
        if not last:
            continue
        is_property = isinstance(static, property)
        if use.override:
            return "" if callable(obj) else "not a method of the base class"
        if use.called and is_property:
            return "a property, called as a method"
        if use.called and not callable(obj):
            return f"not callable ({type(obj).__name__})"
        if not use.called and inspect.isclass(holder) and not is_property and _is_method(obj):
            return "a method, read as a property"
        return (_fits(use, obj) or (_held_right(use, obj, module) if use.owner != CUDA_ROLE else "")) if use.called else ""
    return ""


def _is_method(obj) -> bool:
    return inspect.isroutine(obj) or type(obj).__name__ in ("instancemethod", "method_descriptor")


def missing_api(module, uses: list[Use] | None = None, release: str | None = None) -> list[str]:
    """'name (file:line): problem' for each TensorRT use `module` does not satisfy on its API
    release ('tensorrt-11', 'tensorrt-rtx-1', ...: read from the module unless given)."""
    release = release_of(module) if release is None else release
    problems = []
    for use in uses if uses is not None else api_uses():
        if use.owner == CUDA_ROLE or release not in use.apis:
            continue
        problem = check_use(use, module)
        if problem:
            problems.append(f"{use.name} ({use.where}): {problem}")
    return sorted(set(problems))


def missing_cuda_api(cudart, uses: list[Use] | None = None) -> list[str]:
    """The same for the cuda-python runtime module the engine runner allocates with."""
    problems = []
    for use in uses if uses is not None else api_uses():
        if use.owner == CUDA_ROLE:
            problem = check_use(use, cudart)
            if problem:
                problems.append(f"cudart.{'.'.join(use.path)} ({use.where}): {problem}")
    return sorted(set(problems))
