"""The layers of the package: the application wing (gqa/apps), the transformers integration
(gqa/transformers) and the benchmarks (asv_bench)
use the library's public names only -- or the internal API the library documents for them
(``gqa._kernels``: the raw kernel entry points, no argument checks, for kernel benchmarks) --
and nothing in the library imports the wing."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTED_INTERNALS = {"gqa._kernels"}


def _modules(*globs):
    return sorted(p for g in globs for p in ROOT.glob(g))


def _imported(path):
    """(line, module or module.name) of every import and every `gqa.<name>` attribute read in
    the file; relative imports resolved against the file's package."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                yield node.lineno, f"{base}.{a.name}" if base else a.name
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "gqa"):
            yield node.lineno, f"gqa.{node.attr}"


def _private(name):
    """The first private part of a gqa name (gqa._kvcache.x -> gqa._kvcache), else None."""
    parts = name.split(".")
    if parts[0] != "gqa" or parts[1:2] in (["apps"], ["transformers"]):   # their own names
        return None
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i + 1])
    return None


@pytest.mark.parametrize("path", _modules("gqa/apps/**/*.py", "gqa/transformers/*.py", "asv_bench/*.py"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_wing_uses_public_names_only(path):
    bad = [f"line {line}: {name}" for line, name in _imported(path)
           if _private(name) and _private(name) not in DOCUMENTED_INTERNALS]
    assert not bad, f"{path.relative_to(ROOT)} reaches into the library's private names: {bad}"


@pytest.mark.parametrize("path", _modules("gqa/*.py", "gqa/*.pyx", "gqa/*.pxd"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_library_does_not_import_the_wing(path):
    if path.suffix != ".py":           # Cython: a textual check of its imports and cimports
        text = path.read_text()
        assert "gqa.apps" not in text and "from .apps" not in text and "from . import apps" not in text
        return
    if path.name == "__main__.py":     # the command line is the wing's entry point
        return
    bad = [f"line {line}: {name}" for line, name in _imported(path)
           if name == "gqa.apps" or name.startswith("gqa.apps.")]
    assert not bad, f"{path.relative_to(ROOT)} imports the application wing: {bad}"


def test_the_check_finds_a_private_import(tmp_path):
    """The walk sees the three spellings of a private import (the check can fail)."""
    f = ROOT / "gqa" / "apps" / "_probe_for_test.py"
    f.write_text("import gqa\nfrom gqa import _kvcache\nfrom .. import _formats\nx = gqa._dispatch\n")
    try:
        found = {_private(n) for _, n in _imported(f)} - {None}
    finally:
        f.unlink()
    assert found == {"gqa._kvcache", "gqa._formats", "gqa._dispatch"}
