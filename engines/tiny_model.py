"""A random Llama checkpoint and a word-level tokenizer, written locally with no download:
``kvstore-engine make-model`` and the tests' and benches' tiny models.

The checkpoint is a Hugging Face folder (``config.json`` + ``model.safetensors``, float32) that
the built-in decoder, ``transformers`` and vLLM load. Its tensors are named and shaped by the
decoder's own module tree (which mirrors ``transformers``' ``LlamaForCausalLM``) and drawn as
``transformers`` draws them: normal with ``initializer_range`` for every matrix, ones for the
norms. The tokenizer (``tokenizer.json`` + ``tokenizer_config.json``, built with ``tokenizers``)
maps word ``i`` of :func:`words` to token ``i``: ``<unk> <s> </s> system user assistant :``, then
``w7``, ``w8``, ... up to the vocabulary size, split on whitespace, so any text of those words
is a prompt; its ``chat_template`` renders ``<s>role: content ... assistant:``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# what LlamaForCausalLM(LlamaConfig(...)) needs beyond the caller's sizes; the special tokens'
# ids are the tokenizer's
BASE_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "float32",
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 2048, "initializer_range": 0.02, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
}
SPECIAL_WORDS = ("<unk>", "<s>", "</s>", "system", "user", "assistant", ":")
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} "
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
# random init gives near-uniform logits; widened, greedy choices are well separated, so a KV
# that differs only by rounding (another kernel, another chunking) never flips a token
WIDE_LOGITS = 8.0
WEIGHTS_FILE = "model.safetensors"


def llama_config(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int | None = None,
                 intermediate: int | None = None, vocab: int = 512,
                 **extra: Any) -> dict[str, Any]:
    """A Llama ``config.json`` document; ``extra`` takes any other ``LlamaConfig`` field
    (``head_dim``, ``rope_scaling``, ``tie_word_embeddings``, ...). Raises ``ValueError``
    naming the size that does not fit."""
    kv_heads = heads if kv_heads is None else kv_heads
    intermediate = 2 * hidden if intermediate is None else intermediate
    sizes = {"layers": layers, "hidden": hidden, "heads": heads, "kv-heads": kv_heads,
             "intermediate": intermediate, "vocab": vocab}
    for name, value in sizes.items():
        if value <= 0:
            raise ValueError(f"--{name} must be positive, got {value}")
    if vocab < len(SPECIAL_WORDS) + 1:
        raise ValueError(f"--vocab must be at least {len(SPECIAL_WORDS) + 1} (the special "
                         f"words {' '.join(SPECIAL_WORDS)} and one more), got {vocab}")
    if heads % kv_heads:
        raise ValueError(f"--heads {heads} is not a multiple of --kv-heads {kv_heads}")
    head_dim = extra.get("head_dim") or hidden // heads
    if "head_dim" not in extra and hidden % heads:
        raise ValueError(f"--hidden {hidden} is not a multiple of --heads {heads}")
    if head_dim % 2:
        raise ValueError(f"the head dimension (hidden / heads = {head_dim}) must be even for "
                         "rotary embeddings")
    return {**BASE_CONFIG, "num_hidden_layers": layers, "hidden_size": hidden,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "intermediate_size": intermediate, "vocab_size": vocab, **extra}


def write_checkpoint(path: str | Path, config: Mapping[str, Any], seed: int = 0,
                     logit_scale: float = 1.0) -> Path:
    """Write ``config`` (see :func:`llama_config`) and random float32 weights drawn from
    ``seed`` into the folder ``path`` (created if missing); ``logit_scale`` multiplies the
    output projection. Returns the folder."""
    import torch
    from safetensors.torch import save_file

    from engines.decoder.config import ModelConfig
    from engines.decoder.model import LlamaForCausalLM

    folder = Path(path)
    doc = dict(config)
    cfg = ModelConfig.from_dict(doc, model_id=folder.name)
    with torch.device("meta"):  # names and shapes only; the values are drawn below
        shapes = {name: p.shape for name, p in LlamaForCausalLM(cfg).named_parameters()}
    gen = torch.Generator().manual_seed(seed)
    std = float(doc.get("initializer_range", BASE_CONFIG["initializer_range"]))
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():  # named_parameters lists a tied weight once
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            tensors[name] = torch.zeros(shape)
        else:
            tensors[name] = torch.empty(shape).normal_(0.0, std, generator=gen)
    if "lm_head.weight" in tensors:
        tensors["lm_head.weight"].mul_(logit_scale)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    return folder


def words(vocab: int) -> list[str]:
    """The tokenizer's vocabulary: token ``i`` is ``words(vocab)[i]``."""
    return [*SPECIAL_WORDS, *(f"w{i}" for i in range(len(SPECIAL_WORDS), vocab))]


def write_tokenizer(path: str | Path, vocab: int = 512, chat_template: str | None = CHAT_TEMPLATE,
                    max_length: int = 2048) -> Path:
    """Write a word-level tokenizer over :func:`words` into the folder ``path`` (created if
    missing) as ``AutoTokenizer.from_pretrained`` reads it (BOS ``<s>`` 1, EOS ``</s>`` 2,
    unknown words ``<unk>`` 0); ``chat_template`` None leaves chat out. Returns the folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words(vocab))},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(folder / "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    doc: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **specials,
                           "model_max_length": max_length,
                           "clean_up_tokenization_spaces": False}
    if chat_template is not None:
        doc["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(doc, indent=2) + "\n")
    return folder


def make_model(path: str | Path, config: Mapping[str, Any], seed: int = 0,
               logit_scale: float = WIDE_LOGITS) -> Path:
    """A checkpoint (:func:`write_checkpoint`) and its tokenizer (:func:`write_tokenizer`, as
    many words as the model's vocabulary) in one folder: what ``--model`` and the router's
    ``--tokenizer`` take. Returns the folder."""
    folder = write_checkpoint(path, config, seed=seed, logit_scale=logit_scale)
    return write_tokenizer(folder, int(config["vocab_size"]),
                           max_length=int(config.get("max_position_embeddings", 2048)))
