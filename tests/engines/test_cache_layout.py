"""The engine names its kvstore namespace from its cache layout: a typed ``Layout`` now, named
exactly as the layout document was before, so that an upgraded engine finds the blocks it
stored (a renamed namespace would be a silent zero hit rate)."""

from __future__ import annotations

from engines.decoder.runner import _namespace_name
from kvstore.namespace import Layout

LAYOUT = Layout(model_id="org/tiny", num_layers=2, num_kv_heads=2, head_dim=16, block_size=16,
                dtype="float32", layout_name="engines.decoder:block,layer,kv,token,head,dim")


def test_the_namespace_name_is_the_one_the_layout_document_had() -> None:
    # the value the engine computed from its layout dict before the layout was typed
    assert _namespace_name(LAYOUT, 4096) == "engine.org-tiny.4096.649f4ab73934"


def test_a_layout_with_extra_fields_is_another_namespace() -> None:
    other = Layout(**{**LAYOUT.to_dict(), "extra": {"tp_rank": 1}})
    assert _namespace_name(other, 4096) != _namespace_name(LAYOUT, 4096)
