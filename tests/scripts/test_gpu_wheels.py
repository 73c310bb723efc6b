"""``scripts/gpu_wheels.py``: what the GPU check carries is what kvstore needs less what the
image has, pinned to this environment's versions. Offline: the list, never the download."""

from __future__ import annotations

import re
from importlib import metadata

from packaging.requirements import Requirement

from tests.scripts.image import load

gpu_image, gpu_wheels = load("gpu_image"), load("gpu_wheels")


def test_carries_what_the_image_lacks_at_our_versions() -> None:
    pins = dict(gpu_wheels.to_carry())
    for name in ("lmdb", "fastapi", "starlette", "pydantic", "pydantic-core", "pydantic-settings",
                 "cbor2", "uvicorn", "annotated-types", "typing-inspection", "python-dotenv"):
        assert name in pins, name
        assert pins[name] == metadata.version(name)
    for name in ("torch", "numpy", "msgpack", "xxhash", "uvloop", "transformers", "pytest",
                 "safetensors", "numba", "prometheus-client", "pyyaml"):
        assert name not in pins, name
    assert "boto3" not in pins  # the s3 extra: no GPU step uses it
    assert set(gpu_wheels.ALSO_CARRY) <= set(pins)


def test_walk_follows_markers_extras_and_stops_at_the_image() -> None:
    requires = {
        "a": ["b>=1", "old; python_version < '3.12'", "win; sys_platform == 'win32'",
              "c[fast]", "img>=2"],
        "b": [],
        "c": ["d; extra == 'fast'", "e; extra == 'slow'"],
        "d": [],
        "img": ["never-walked"],
    }
    versions = {"a": "1.0", "b": "1.5", "c": "2.0", "d": "0.1", "img": "1.0"}
    needs = gpu_wheels.walk([Requirement("a")], versions.get, lambda n: requires.get(n, []),
                            lambda n: n == "img")
    by_name = {n.name: n for n in needs}
    assert set(by_name) == {"a", "b", "c", "d", "img"}
    assert by_name["img"].in_image and not by_name["img"].satisfied
    assert by_name["d"].via == "c"
    assert gpu_wheels.to_carry([n for n in needs if n.name != "img"]) == [
        ("a", "1.0"), ("b", "1.5"), ("c", "2.0"), ("d", "0.1")]


def test_a_requirement_this_environment_misses_is_an_error() -> None:
    needs = gpu_wheels.walk([Requirement("x>=2")], {"x": "1.0"}.get, lambda n: [],
                            lambda n: False)
    try:
        gpu_wheels.to_carry(needs)
    except RuntimeError as exc:
        assert "x>=2" in str(exc)
    else:
        raise AssertionError("a version the requirement refuses was accepted")


def test_image_list_is_dated_and_normalized() -> None:
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", gpu_image.READ_ON)
    assert {"torch", "numpy", "msgpack", "xxhash", "uvloop", "cupy-cuda13x"} <= gpu_image.PACKAGES
    assert all(gpu_image.normalize(p) == p for p in gpu_image.PACKAGES)
    assert gpu_image.has("PyYAML") and gpu_image.has("typing_extensions")
    assert not gpu_image.has("lmdb")


def test_wheel_names_and_the_tree_size() -> None:
    assert gpu_wheels.wheel_id(
        "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl") == ("pydantic-core", "2.50.5")
    assert 0 < gpu_wheels.tree_bytes() < gpu_wheels.LIMIT_BYTES
