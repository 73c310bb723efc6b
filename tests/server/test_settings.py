"""Settings: sizes, precedence (flag > env > YAML > default), validation, tiers built."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from server.runtime import loop_factory
from server.settings import load_settings


@pytest.mark.parametrize("text,expected", [
    ("512MiB", 512 << 20), ("10GiB", 10 << 30), ("1.5GB", 1_500_000_000), ("4096", 4096),
    (4096, 4096), ("64 KiB", 64 << 10), ("2kb", 2000), ("0", 0),
])
def test_sizes_parse(tmp_path: Path, text: object, expected: int) -> None:
    s = load_settings(None, data_dir=str(tmp_path), host_slot_bytes=text)
    assert s.host_slot_bytes == expected and type(s.host_slot_bytes) is int


@pytest.mark.parametrize("bad", ["ten", "5XB", "-1", -1, True, "1e3", [1]])
def test_sizes_reject(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValidationError, match="host_slot_bytes"):
        load_settings(None, data_dir=str(tmp_path), host_slot_bytes=bad)


def test_precedence_flag_over_env_over_yaml(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("port: 9001\nhost_capacity: 512MiB\ndata_port: 9002\ndisk_capacity: 1GiB\n")
    monkeypatch.setenv("KVSTORE_PORT", "9101")
    monkeypatch.setenv("KVSTORE_DISK_CAPACITY", "2GiB")
    s = load_settings(cfg, disk_capacity="3GiB")
    assert s.port == 9101  # env beats YAML
    assert s.data_port == 9002  # YAML beats the default
    assert s.host_capacity == 512 << 20
    assert s.disk_capacity == 3 << 30  # flag beats env


def test_defaults_serve_without_configuration(tmp_path: Path) -> None:
    s = load_settings(data_dir=str(tmp_path))
    assert s.host == "127.0.0.1"
    cfg = s.store_config()
    assert [t.kind for t in cfg.tiers] == ["host", "disk"]
    assert cfg.tiers[0].options["shm_name"] == s.shm
    assert cfg.tiers[1].options["path"] == str(tmp_path / "lmdb")
    assert cfg.namespaces_path == str(tmp_path / "namespaces.json")
    assert s.socket_path == str(tmp_path / "kvstore.sock")


def test_optional_tiers(tmp_path: Path) -> None:
    s = load_settings(data_dir=str(tmp_path), device_capacity="1GiB", device="cuda:0",
                      s3_bucket="b", s3_endpoint="http://127.0.0.1:9000", disk_capacity=0)
    tiers = s.store_config().tiers
    assert [t.kind for t in tiers] == ["device", "host", "s3"]
    assert tiers[0].options == {"device": "cuda:0"}
    assert tiers[2].options["bucket"] == "b"


def test_bad_values_fail_loudly(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        load_settings(port=0)
    with pytest.raises(ValidationError):
        load_settings(host_capacity="lots")
    with pytest.raises(ValidationError):
        load_settings(no_such_setting=1)
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "missing.yaml")
    with pytest.raises(ValidationError, match="at least one tier"):
        load_settings(host_capacity=0, disk_capacity=0)


def test_shm_name_is_stable_per_data_dir(tmp_path: Path) -> None:
    a = load_settings(data_dir=str(tmp_path / "a")).shm
    assert a == load_settings(data_dir=str(tmp_path / "a")).shm
    assert a != load_settings(data_dir=str(tmp_path / "b")).shm


def test_too_long_socket_path_is_refused_with_advice(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    with pytest.raises(ValidationError, match="unix_socket"):
        load_settings(data_dir=str(deep))
    assert load_settings(data_dir=str(deep), unix_socket=str(tmp_path / "s.sock")).socket_path


def test_event_loop_choice(tmp_path: Path) -> None:
    import uvloop

    assert load_settings(None, data_dir=str(tmp_path)).event_loop == "auto"
    assert loop_factory("auto") is uvloop.new_event_loop
    assert loop_factory("uvloop") is uvloop.new_event_loop
    assert loop_factory("asyncio") is None
    with pytest.raises(ValidationError, match="event_loop"):
        load_settings(None, data_dir=str(tmp_path), event_loop="trio")


def test_lease_cap_and_pin_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_settings(data_dir=str(tmp_path), host_capacity="1GiB").store_config()
    assert cfg.max_lease_s == 300.0
    assert cfg.max_pinned_bytes_per_tenant == 256 << 20  # a quarter of the top tier
    monkeypatch.setenv("KVSTORE_MAX_LEASE_S", "45")
    s = load_settings(data_dir=str(tmp_path), max_pinned_bytes_per_tenant="64MiB",
                      grant_grace_s="0")
    assert (s.max_lease_s, s.grant_grace_s) == (45.0, 0.0)
    assert s.store_config().max_pinned_bytes_per_tenant == 64 << 20
    assert load_settings(data_dir=str(tmp_path), lease_s=60).store_config().default_lease_s \
        == 45.0  # the default lease is cut to the cap like every other
    for bad in ("inf", "nan", "-1", "0"):
        with pytest.raises(ValidationError):
            load_settings(data_dir=str(tmp_path), max_lease_s=bad)


def test_tenant_connections_and_prefetch_bounds(tmp_path: Path) -> None:
    s = load_settings(data_dir=str(tmp_path))
    assert s.tenant_connections() == 256  # a quarter of max_connections
    assert s.store_config().max_prefetch_blocks == 262144
    assert s.max_prefetch_blocks_per_connection == 65536
    s = load_settings(data_dir=str(tmp_path), max_connections=6, max_prefetch_blocks=10)
    assert s.tenant_connections() == 1 and s.store_config().max_prefetch_blocks == 10
    assert load_settings(data_dir=str(tmp_path),
                         max_connections_per_tenant=9).tenant_connections() == 9
    for field in ("max_prefetch_blocks", "max_prefetch_blocks_per_connection"):
        with pytest.raises(ValidationError):
            load_settings(data_dir=str(tmp_path), **{field: 0})
    with pytest.raises(ValidationError):
        load_settings(data_dir=str(tmp_path), max_connections_per_tenant=-1)


def test_whatif_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The policies to simulate: comma-separated in a flag or a variable, a list in YAML;
    a sample rate of 0 turns the curves off."""
    data = str(tmp_path / "d")
    assert load_settings(None, data_dir=data, whatif_policies="lfu, s3fifo").whatif_policies \
        == ["lfu", "s3fifo"]
    monkeypatch.setenv("KVSTORE_WHATIF_POLICIES", "s3fifo")
    assert load_settings(None, data_dir=data).whatif_policies == ["s3fifo"]
    monkeypatch.delenv("KVSTORE_WHATIF_POLICIES")
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("whatif_policies: [lfu]\nwhatif_sample_rate: 0.05\n")
    loaded = load_settings(cfg, data_dir=data)
    whatif = loaded.store_config().whatif
    assert whatif is not None and whatif.policies == ("lfu",) and whatif.sample_rate == 0.05
    assert load_settings(None, data_dir=data, whatif_sample_rate=0).store_config().whatif \
        is None
    with pytest.raises(ValidationError, match="unknown eviction policy 'nope'"):
        load_settings(None, data_dir=data, whatif_policies="nope")
    with pytest.raises(ValidationError, match="whatif_sample_rate"):
        load_settings(None, data_dir=data, whatif_sample_rate=2)
