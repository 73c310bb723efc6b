"""The GPU machine's Python, imitated here: this interpreter without its site-packages, and a
folder that links only the distributions the image has (``scripts/gpu_image.py``) or the GPU
check carries (``scripts/gpu_wheels.py``), dist-info included, so that a module or a pytest
plugin the image lacks is missing exactly as it will be there."""

from __future__ import annotations

import importlib.util
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (a script folder, not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def image_python(dest: Path) -> tuple[Path, Path]:
    """An interpreter script and the folder to put on its ``PYTHONPATH``."""
    gpu_image, gpu_wheels = load("gpu_image"), load("gpu_wheels")
    allowed = set(gpu_image.PACKAGES) | {name for name, _ in gpu_wheels.to_carry()}
    site = dest / "site"
    site.mkdir(parents=True)
    for dist in metadata.distributions():
        if gpu_image.normalize(dist.metadata["Name"]) not in allowed:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in tops - {"..", "__pycache__"}:
            src, link = Path(str(dist.locate_file(top))), site / top
            if src.exists() and not link.is_symlink():
                link.symlink_to(src)
    python = dest / "python3"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    return python, site
