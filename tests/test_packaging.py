"""Every package directory ships: pyproject lists packages explicitly (the package-dir mapping
of kernels/ and pipelines/ rules out plain discovery), so a new folder must be listed too."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if any(part.startswith((".", "_")) for part in rel.parts):
                continue
            sub = ".".join((name,) + rel.parts)
            if not any(sub.startswith(other + ".") or sub == other for other in mapping if other != name and len(other) > len(name)):
                found.add(sub)
    assert found - listed == set(), f"add these to [tool.setuptools] packages: {sorted(found - listed)}"


def test_the_compile_cache_lock_is_a_declared_dependency():
    """compile_cache sets a size limit, which makes jax lock every cache entry through the
    filelock package; a plain `pip install .` must bring it, or every cache read fails."""
    from pfamalign import compile_cache

    assert compile_cache._settings(ROOT)["jax_compilation_cache_max_size"] > 0
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "filelock" for d in deps)


def test_the_source_tree_imports_kernels_and_pipelines_without_an_editable_install(tmp_path):
    """Python started in the repository root imports ./pfamalign ahead of an installed copy
    (a `pip install .`): kernels/ and pipelines/ beside it must still be pfamalign.kernels and
    pfamalign.pipelines. Run without site processing (no editable finder), the site-packages
    on the path for jax and numpy only."""
    import subprocess
    import sys
    import sysconfig

    code = ("import sys; sys.path.append(sys.argv[1]); import pfamalign.kernels.config, "
            "pfamalign.pipelines.config; print(pfamalign.kernels.__file__); "
            "print(pfamalign.pipelines.__file__); import pfamalign.pairwise")
    out = subprocess.run([sys.executable, "-S", "-c", code, sysconfig.get_paths()["purelib"]],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(ROOT / "kernels" / "__init__.py"),
                                  str(ROOT / "pipelines" / "__init__.py")]


# docs/design.md §2: the application modules kernels/ and pipelines/ may import, which import
# nothing of the project beyond each other
LEAF_MODULES = {"jsonio", "residues", "outputs", "interrupts", "limits"}


def _project_imports(path: pathlib.Path) -> set[str]:
    """The ``pfamalign.X`` modules ``path`` imports (``X``: the first name below pfamalign)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] == "pfamalign":
                names.add(parts[1] if len(parts) > 1 else None)
                if len(parts) == 1:  # from pfamalign import jsonio
                    names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name.split(".")[1] for alias in node.names
                      if alias.name.startswith("pfamalign.")}
    return names - {None}


def test_kernels_and_pipelines_import_only_each_their_own_and_the_leaf_modules():
    """A dependency against design.md §2 (pipelines/stockholm.py took MAX_LINE from
    pfamalign.inputs, which imports the pipelines back) fails here, by file."""
    wrong = []
    for package in ("kernels", "pipelines"):
        for path in sorted((ROOT / package).rglob("*.py")):
            extra = _project_imports(path) - LEAF_MODULES - {package}
            wrong += [f"{path.relative_to(ROOT)} imports pfamalign.{name}" for name in sorted(extra)]
    for name in sorted(LEAF_MODULES):
        extra = _project_imports(ROOT / "pfamalign" / f"{name}.py") - LEAF_MODULES
        wrong += [f"pfamalign/{name}.py (a leaf) imports pfamalign.{m}" for m in sorted(extra)]
    assert not wrong, wrong
