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
