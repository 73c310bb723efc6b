"""The wheels the GPU check carries: what kvstore and the check need that the image lacks.

``make gpu-wheels`` runs this here, where the network is: it walks kvstore's requirements
(``pyproject.toml``: the dependencies, the ``engine`` extra and the test tools the check runs)
and, through ``importlib.metadata``, the requirements of each distribution that must be
carried, stopping at distributions the GPU image already has (``scripts/gpu_image.py``:
their own requirements are the image's business). Markers are evaluated for the machine
there (CPython 3.12, Linux x86-64). Every distribution left is pinned to the version this
environment has and downloaded into ``.whl/`` as a cp312 manylinux x86-64 wheel (pure-python
ones as ``py3-none-any``); wheels of other versions are removed, since two versions of one
distribution stop the install there. Last, the wheels plus the working tree that travels with
them must fit 64 MiB (``LIMIT_BYTES``), the most the check copies to the GPU machine.

The same walk runs on the GPU machine (``scripts/gpu_check.py``, step ``imports``) over what
is installed there, to report requirements that are missing or at another version.

    python scripts/gpu_wheels.py [--list] [--dest .whl]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_image

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
LIMIT_BYTES = 64 * MiB  # the working tree plus the carried wheels, copied to the GPU machine
EXTRAS = ("engine",)  # the decoder against transformers
CHECK_TOOLS = ("pytest", "pytest-timeout", "hypothesis")  # from the dev extra: the tests run
# The interpreter there, for requirement markers (``python_version < "3.12"`` and the like).
TARGET_ENV = {
    "python_version": gpu_image.PYTHON, "python_full_version": f"{gpu_image.PYTHON}.3",
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
    "os_name": "posix",
}
# Carried although the image has them: the version there is not known here and a carried
# distribution needs a recent one. Pure python and backward compatible, so shadowing the
# image's copy is safe.
ALSO_CARRY = {
    "typing-extensions": "pydantic 2.14 and pydantic-core 2.50 need >=4.16.0",
}
PLATFORMS = ("manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")


class Need(NamedTuple):
    """One requirement met (or not) along the walk."""

    name: str  # normalized distribution name
    spec: str  # the requirement as written, e.g. ``lmdb>=1.4,<4``
    via: str  # who requires it: ``kvstore`` or a distribution name
    version: str | None  # the version installed in the environment walked; None: missing
    in_image: bool  # the GPU image has it: not carried, not walked further

    @property
    def satisfied(self) -> bool:
        """Installed at a version the requirement accepts."""
        if self.version is None:
            return False
        try:
            return Requirement(self.spec).specifier.contains(Version(self.version),
                                                             prereleases=True)
        except InvalidVersion:
            return True  # a local build string we cannot compare: do not cry wolf


def roots(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """kvstore's own requirements that the GPU check needs."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    extras = project.get("optional-dependencies", {})
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in EXTRAS:
        reqs += [Requirement(r) for r in extras[extra]]
    tools = {gpu_image.normalize(t) for t in CHECK_TOOLS}
    reqs += [r for r in map(Requirement, extras.get("dev", []))
             if gpu_image.normalize(r.name) in tools]
    return reqs


def applies(req: Requirement, extras: Iterable[str] = ()) -> bool:
    """Whether ``req`` holds on the machine there, for a distribution asked with ``extras``."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**TARGET_ENV, "extra": e}) for e in ("", *extras))


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_requires(name: str) -> list[str]:
    try:
        return metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return []


def walk(
    start: Iterable[Requirement],
    version: Callable[[str], str | None] = installed_version,
    requires: Callable[[str], list[str]] = installed_requires,
    in_image: Callable[[str], bool] | None = None,
) -> list[Need]:
    """Every requirement reached from ``start`` that holds there, breadth first: one
    :class:`Need` per requirement (a distribution asked for by two others appears twice),
    each distribution walked into once per set of extras; one the image has is not walked
    into."""
    if in_image is None:
        in_image = lambda name: gpu_image.has(name) and name not in ALSO_CARRY  # noqa: E731
    needs: list[Need] = []
    queue: list[tuple[Requirement, str]] = [(r, "kvstore") for r in start if applies(r)]
    walked: dict[str, set[str]] = {}  # distribution -> extras whose requirements are queued
    while queue:
        req, via = queue.pop(0)
        name = gpu_image.normalize(req.name)
        need = Need(name, str(req), via, version(name), in_image(name))
        needs.append(need)
        if need.in_image or need.version is None:
            continue
        done = walked.get(name)
        extras = set(req.extras)
        if done is not None and extras <= done:
            continue
        walked[name] = (done or set()) | extras
        for raw in requires(name):
            sub = Requirement(raw)
            if applies(sub, extras) and (done is None or not applies(sub, done)):
                queue.append((sub, name))
    return needs


def to_carry(needs: list[Need] | None = None) -> list[tuple[str, str]]:
    """``(name, version)`` of every distribution to carry, sorted; raises ``RuntimeError``
    for one this environment lacks (nothing to pin it to) or holds at a version its
    requirement refuses."""
    needs = walk(roots()) if needs is None else needs
    out: dict[str, str] = {}
    for n in needs:
        if n.in_image:
            continue
        if not n.satisfied:
            raise RuntimeError(f"{n.spec} (required by {n.via}) is "
                               f"{'not installed' if n.version is None else n.version} here: "
                               "run `make venv` first")
        assert n.version is not None
        out[n.name] = n.version
    return sorted(out.items())


def wheel_id(filename: str) -> tuple[str, str]:
    """``(normalized name, version)`` of a wheel file name."""
    name, ver = filename.split("-")[:2]
    return gpu_image.normalize(name), ver


def download(pins: list[tuple[str, str]], dest: Path) -> list[Path]:
    """Bring ``dest`` to exactly the wheels of ``pins``: fetch the missing ones, remove the
    others. Returns the wheel files."""
    dest.mkdir(parents=True, exist_ok=True)
    want = {(n, v) for n, v in pins}
    for f in dest.glob("*.whl"):
        if wheel_id(f.name) not in want:
            f.unlink()
    have = {wheel_id(f.name) for f in dest.glob("*.whl")}
    missing = [f"{n}=={v}" for n, v in pins if (n, v) not in have]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--only-binary=:all:", "--python-version", gpu_image.PYTHON,
               "--implementation", "cp", "-d", str(dest)]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        subprocess.run(cmd + missing, check=True)
    files = sorted(dest.glob("*.whl"))
    got = {wheel_id(f.name) for f in files}
    if got != want:
        raise RuntimeError(f"wheels missing after download: {sorted(want - got)}")
    return files


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the working tree that travels: tracked files and untracked ones git does not
    ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, capture_output=True, check=True).stdout
    total = 0
    for rel in filter(None, out.decode().split("\0")):
        path = root / rel
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dest", default=str(ROOT / ".whl"), help="wheel folder (default .whl)")
    ap.add_argument("--list", action="store_true", help="print what would be carried; no download")
    args = ap.parse_args(argv)
    pins = to_carry()
    print(f"image packages read {gpu_image.READ_ON} from {gpu_image.SOURCE}")
    print(f"to carry: {len(pins)} distributions: "
          + ", ".join(f"{n}=={v}" for n, v in pins))
    if args.list:
        return 0
    files = download(pins, Path(args.dest))
    wheels, tree = sum(f.stat().st_size for f in files), tree_bytes()
    for f in files:
        print(f"  {f.stat().st_size / MiB:7.2f} MiB  {f.name}")
    room = LIMIT_BYTES - tree
    print(f"wheels: {len(files)} files, {wheels / MiB:.2f} MiB; working tree: {tree / MiB:.2f} "
          f"MiB; room under 64 MiB for wheels: {room / MiB:.2f} MiB")
    if wheels > room:
        print("TOO BIG: the wheels and the working tree exceed 64 MiB (LIMIT_BYTES)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
