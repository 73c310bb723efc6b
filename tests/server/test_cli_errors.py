"""``kvstore serve`` refuses every start that cannot work with one line on stderr naming the
setting and what to do, exit code 2, never a traceback and never after saying it is serving; a
misspelled flag, command or config key is named with the one meant; ``kvstore stats | head``
ends quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.testing.cli import assert_one_line as one_line
from kvstore.testing.proc import ROOT, free_port
from kvstore.testing.server import ServerProc, kvstore_cmd
from kvstore.tiers.segment import memory_available


def serve(tmp: Path, *args: str, data_dir: Path | None = None, port: int | None = None,
          data_port: int | None = None, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    """``kvstore serve`` expected to refuse at once (it would otherwise run until killed)."""
    cmd = [*kvstore_cmd(), "serve", "--data-dir", str(data_dir or tmp / "data"),
           "--port", str(port or free_port()), "--data-port", str(data_port or free_port()),
           "--host-capacity", "8MiB", "--disk-capacity", "32MiB", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp,
                          env={**os.environ, **(env or {})})


def assert_one_line(run: subprocess.CompletedProcess[str], *words: str) -> str:
    return one_line(run, *words, never=("Traceback", "kvstore serving"))


def test_yaml_with_a_syntax_error(tmp_path: Path) -> None:
    (tmp_path / "kv.yaml").write_text("port: [1\n")
    line = assert_one_line(serve(tmp_path, "--config", "kv.yaml"), "kv.yaml", "--config",
                           "not valid YAML")
    assert "line 2, column 1" in line


def test_yaml_that_is_a_list(tmp_path: Path) -> None:
    (tmp_path / "kv.yaml").write_text("- port: 1\n- host: x\n")
    assert_one_line(serve(tmp_path, "--config", "kv.yaml"), "kv.yaml", "--config", "mapping")


def test_yaml_with_unknown_keys_names_the_file_and_the_setting_meant(tmp_path: Path) -> None:
    (tmp_path / "kv.yaml").write_text("host_capcity: 8MiB\nhost-capacity: 8MiB\nzzz: 1\n")
    line = assert_one_line(serve(tmp_path, "--config", "kv.yaml"))
    assert "unknown setting 'host_capcity' in config file kv.yaml (did you mean " \
        "'host_capacity'?)" in line, line
    assert "unknown setting 'host-capacity' in config file kv.yaml (did you mean " \
        "'host_capacity'?)" in line, line
    assert "unknown setting 'zzz' in config file kv.yaml (see kvstore serve --help)" in line


def test_a_bad_value_from_the_yaml_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "kv.yaml").write_text("policy: fifo\n")
    assert_one_line(serve(tmp_path, env={"KVSTORE_CONFIG": "kv.yaml"}),
                    "policy (--policy, KVSTORE_POLICY) in config file kv.yaml: unknown")


@pytest.mark.parametrize("argv,words", [
    (("serve", "--hst-capacity", "1GiB"), (
        "kvstore serve: unrecognized arguments: --hst-capacity 1GiB; did you mean "
        "--host-capacity? (see kvstore serve --help)",)),
    (("sreve",), ("did you mean 'serve'? (see kvstore --help)",)),
])
def test_a_misspelled_flag_or_command_names_the_one_meant(tmp_path: Path, argv: tuple[str, ...],
                                                         words: tuple[str, ...]) -> None:
    run = subprocess.run([*kvstore_cmd(), *argv], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert_one_line(run, *words)


@pytest.mark.parametrize("args,words", [
    (("--policy", "fifo"), ("--policy", "known: lfu, lru, s3fifo")),
    (("--log-level", "verbose"), ("--log-level", "'debug'", "verbose")),
    (("--host-capacity", "lots"), ("--host-capacity", "512MiB")),
    (("--device", "cuda:0"), ("--device", "cuda:0", "--device-capacity")),
])
def test_bad_values(tmp_path: Path, args: tuple[str, ...], words: tuple[str, ...]) -> None:
    assert_one_line(serve(tmp_path, *args), *words)


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("precious")
    assert_one_line(serve(tmp_path, data_dir=tmp_path / "afile"), "--data-dir",
                    "is not a folder")
    assert (tmp_path / "afile").read_text() == "precious"


def test_data_port_in_use(tmp_path: Path, listening: int) -> None:
    assert_one_line(serve(tmp_path, data_port=listening), "--data-port", str(listening),
                    "in use")


def test_rest_port_in_use_fails_before_announcing(tmp_path: Path, listening: int) -> None:
    assert_one_line(serve(tmp_path, port=listening), "--port", str(listening), "in use")


def test_host_capacity_beyond_free_memory(tmp_path: Path) -> None:
    room = memory_available()
    if room is None:
        pytest.skip("this machine does not say how much memory is free")
    # far beyond what is free: the check must refuse it before a byte is reserved
    run = serve(tmp_path, "--host-capacity", str(4 * room))
    assert_one_line(run, "--host-capacity", "memory available")


def test_device_tier_on_a_device_torch_cannot_use(tmp_path: Path) -> None:
    import torch

    device = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU, or cuda:0 on a CPU
    run = serve(tmp_path, "--device", device, "--device-capacity", "16MiB")
    assert_one_line(run, "--device", device)


def test_data_dir_in_use_by_another_server(tmp_path: Path, server: ServerProc) -> None:
    assert_one_line(serve(tmp_path, data_dir=server.data_dir), "--data-dir", "in use")


def test_stats_into_a_closed_pipe_ends_quietly(server: ServerProc) -> None:
    read, write = os.pipe()
    os.close(read)  # `kvstore stats | head` once head has exited
    try:
        run = subprocess.run([*kvstore_cmd(), "stats", "--url", server.url], stdout=write,
                             stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT)
    finally:
        os.close(write)
    assert run.returncode == 0 and run.stderr == "", run.stderr


# ``kvstore serve`` in an install without an extra's package (a plain ``pip install kvstore``):
# the module is hidden as an uninstalled one is, and nothing else changes.
WITHOUT = ("import sys; sys.modules[{module!r}] = None; from server.main import main; "
           "sys.exit(main())")


@pytest.mark.parametrize(("module", "flags", "words"), [
    ("torch", ("--device-capacity", "16MiB"), ("--device-capacity", "kvstore[gpu]")),
    ("boto3", ("--s3-bucket", "b", "--s3-endpoint", "http://127.0.0.1:1"),
     ("--s3-bucket", "kvstore[s3]")),
])
def test_tier_whose_extra_is_not_installed(tmp_path: Path, module: str,
                                           flags: tuple[str, ...], words: tuple[str, ...]) -> None:
    cmd = [sys.executable, "-c", WITHOUT.format(module=module), "serve", "--data-dir",
           str(tmp_path / "data"), "--port", str(free_port()), "--data-port", str(free_port()),
           "--host-capacity", "8MiB", "--disk-capacity", "32MiB", *flags]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_one_line(run, *words)
