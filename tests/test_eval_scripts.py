"""eval/ is a results page with its scripts, outside the product's import graph: its scripts use harvest's public
names only, nothing of the product or its tests imports them, and every place that points into eval/ names a
file or a section that exists."""

import ast
import glob
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "eval"
PACKAGES = ("harvest", "predictor", "allocator", "traces", "base")
"""The repository's own packages (pyproject.toml's packages.find)."""
PRODUCT_AND_TESTS = (*PACKAGES, "tests", "scripts")
OUTSIDE_EVAL = [ROOT / "README.md", ROOT / "ARCHITECTURE.md",
                *(p for d in PRODUCT_AND_TESTS for p in sorted((ROOT / d).rglob("*"))
                  if p.suffix in (".py", ".sh", ".md") and p != Path(__file__).resolve())]
"""The product, its tests and docs (this file names pointers into eval/ as examples)."""
POINTERS = OUTSIDE_EVAL + [p for p in sorted(EVAL.rglob("*")) if p.suffix in (".py", ".md")
                           and p.name != "NOTES.md" and p != EVAL / "README.md"]
"""Files that may point into eval/ (the dated notes are verbatim: they point at eval/README.md as it was)."""


def imported_modules(tree: ast.AST):
    """(module, name) for every import in the tree, name None for `import module`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.module, alias.name


def private_imports(source: str) -> list[str]:
    """Names of the repository's packages that `source` imports although a part of them starts with "_"."""
    found = []
    for module, name in imported_modules(ast.parse(source)):
        parts = module.split(".") + ([name] if name else [])
        if parts[0] in PACKAGES and any(part.startswith("_") and part != "__init__" for part in parts):
            found.append(".".join(parts))
    return found


def test_the_private_import_check_sees_a_private_name_and_passes_public_ones():
    assert private_imports("from harvest.colocation.core_partitions import _on_cores") == [
        "harvest.colocation.core_partitions._on_cores"]
    assert private_imports("import harvest.finetune._hidden") == ["harvest.finetune._hidden"]
    assert private_imports("from harvest.finetune import FinetuneEngine\nfrom os import _exit\nimport torch") == []


def test_no_script_under_eval_imports_a_private_name_or_a_test_helper():
    scripts = sorted(EVAL.rglob("*.py"))
    assert scripts, "eval/ holds runnable scripts"
    for path in scripts:
        source = path.read_text()
        assert not private_imports(source), f"{path.relative_to(ROOT)} imports {private_imports(source)}"
        helpers = [m for m, _ in imported_modules(ast.parse(source)) if m == "conftest" or m.startswith("test_")]
        assert not helpers, f"{path.relative_to(ROOT)} imports the tests' {helpers}"


def test_nothing_of_the_product_or_its_tests_imports_eval():
    for path in (p for p in OUTSIDE_EVAL if p.suffix == ".py"):
        tree = ast.parse(path.read_text())
        modules = [m for m, _ in imported_modules(tree) if m == "eval" or m.startswith("eval.")]
        assert not modules, f"{path.relative_to(ROOT)} imports {modules}"
        # A script under eval/ loaded by its path (runpy, importlib) is imported too.
        loaded = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and
                  isinstance(node.value, str) and re.search(r"eval/\S*\.py\b", node.value)]
        assert not loaded, f"{path.relative_to(ROOT)} names the script {loaded}"


def test_every_pointer_into_eval_names_a_file_or_a_section_that_exists():
    headings = [line.lstrip("#").strip() for line in (EVAL / "README.md").read_text().splitlines()
                if line.startswith("#")]
    checked = 0
    for path in POINTERS:
        text = re.sub(r"\s*\n\s*(#\s*)?", " ", path.read_text())  # a pointer may wrap across comment lines
        for target in re.findall(r"\beval/[\w./*-]*\w", text):
            assert glob.glob(str(ROOT / target)), f"{path.relative_to(ROOT)} points at {target}, which does not exist"
            checked += 1
        for section in re.findall(r'eval/README\.md,? \(?"([^"]+)"', text):
            assert any(h.startswith(section) for h in headings), (
                f"{path.relative_to(ROOT)} points at eval/README.md, \"{section}\", which has no such section")
            checked += 1
    assert checked > 10


def test_the_results_page_links_to_what_exists_and_stays_a_page():
    text = (EVAL / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    targets = re.findall(r"\]\(([^)#]+)\)", text) + re.findall(r"`((?:results|recordings)/[^`\s]+)`", text)
    assert targets
    for target in (t for t in targets if "<" not in t):  # results/<date>-<gpu>/ is a pattern
        assert glob.glob(str(EVAL / target)), f"eval/README.md points at {target}, which does not exist"
