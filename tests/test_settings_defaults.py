"""A training setting's default is stated once, in core/settings.py: every other module that needs it reads the
table. A setting whose table default is None leaves its value to the schedule; that schedule's own value may
be stated in one place beside the table."""
from __future__ import annotations

import ast
from pathlib import Path

from blender_addon.core.settings import TRAINING

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "blender_addon" / "core" / "settings.py"
# The benchmarks' options name their own scenes' values (a random model's seed, say), not training defaults.
NOT_SCANNED = (ROOT / "backend" / "tools" / "bench", ROOT / "backend" / "bench")
LITERALS = (ast.Constant, ast.Tuple, ast.List, ast.UnaryOp)


def stated(node) -> bool:
    """A literal value; None is not one (an option left unset, which the table's default then fills)."""
    return isinstance(node, LITERALS) and not (isinstance(node, ast.Constant) and node.value is None)


def sources() -> list[Path]:
    files = [*(ROOT / "blender_addon").rglob("*.py"), *(ROOT / "backend").rglob("*.py")]
    return sorted(p for p in files if p != TABLE and not any(p.is_relative_to(n) for n in NOT_SCANNED))


def stated_defaults(path: Path) -> list[tuple[str, int, str]]:
    """(setting, line, value) for each literal default of a training setting's name in `path`: a field's or a
    Blender property's default, a parameter's, a dict entry's, a message field's, a command-line option's."""
    names, found = set(TRAINING.fields), []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names \
                and node.value is not None:
            value = node.value
            if isinstance(value, ast.Call):  # a bpy property: its default=
                value = next((k.value for k in value.keywords if k.arg == "default"), None)
            if stated(value):
                found.append((node.target.id, node.lineno, ast.unparse(value)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults),
                     *zip(args.kwonlyargs, args.kw_defaults)]
            found += [(a.arg, node.lineno, ast.unparse(d)) for a, d in pairs
                      if a.arg in names and stated(d)]
        elif isinstance(node, ast.Dict):
            found += [(k.value, node.lineno, ast.unparse(v)) for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value in names and stated(v)]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Fields":  # a message's optional field
            found += [(k.arg, node.lineno, ast.unparse(k.value.args[1])) for k in node.keywords
                      if k.arg in names and isinstance(k.value, ast.Call) and len(k.value.args) > 1
                      and getattr(k.value.func, "id", "") == "optional" and stated(k.value.args[1])]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args \
                and isinstance(node.args[0], ast.Constant):
            name = str(node.args[0].value).lstrip("-").replace("-", "_")
            found += [(name, node.lineno, ast.unparse(k.value)) for k in node.keywords
                      if name in names and k.arg == "default" and stated(k.value)]
    return found


def test_a_training_settings_default_is_stated_once():
    places: dict[str, list[str]] = {}
    for path in sources():
        for name, line, value in stated_defaults(path):
            places.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{line} ({value})")
    wrong = []
    for name, where in sorted(places.items()):
        allowed = 1 if TRAINING.fields[name].default is None else 0  # the schedule's own value
        if len(where) > allowed:
            wrong.append(f"{name}: the table (core/settings.py) states its default; also {', '.join(where)}")
    assert not wrong, "\n".join(wrong)


def test_the_scan_finds_a_stated_default(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(sh_degree=3, other=1, preset=None):\n    return {'seed': 0}\n"
                      "F = Fields(background=optional(RGB, [1, 1, 1]))\n")
    assert {name for name, _, _ in stated_defaults(module)} == {"sh_degree", "seed", "background"}
