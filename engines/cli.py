"""``kvstore-engine``: ``generate`` (one prompt, prints the output ids as JSON), ``serve`` (an
HTTP worker, see :mod:`engines.worker`) and ``make-model`` (a random Llama with a tokenizer, see
:mod:`engines.tiny_model`).

A start that cannot work (no checkpoint at ``--model``, no kvstore at ``--kvstore``, a taken
``--port``, a bad flag) is one line naming the flag and exit code 2 (:mod:`kvstore.cli_kit`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.decoder.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_SEQS,
    DEFAULT_NUM_BLOCKS,
    EngineConfig,
)
from kvstore import cli_kit
from kvstore.cli_kit import CommandError
from kvstore.cli_tokens import token_ids_arg

if TYPE_CHECKING:
    from engines.decoder.runner import Engine

PROG = "kvstore-engine"


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="DIR",
                   help="Hugging Face Llama-family checkpoint folder (config.json + "
                        "*.safetensors)")
    p.add_argument("--kvstore", default=None, metavar="URL", type=cli_kit.url_arg,
                   help="kvstore server URL (http:// may be left out: 127.0.0.1:8470): "
                        "reuse and store prompt blocks (default: none, no store)")
    p.add_argument("--kvstore-token-file", default=None, metavar="PATH",
                   help="file holding the token of a kvstore that requires one (its "
                        "--token-file) (default: none)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="weights and KV dtype (default: the checkpoint's; float32 for half "
                        "precision on cpu)")
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
                   help="tokens per KV block (must match across workers)")
    p.add_argument("--num-blocks", type=int, default=DEFAULT_NUM_BLOCKS,
                   help="blocks in the paged KV cache")
    p.add_argument("--max-batch-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS,
                   help="tokens per step; longer prompts prefill in chunks")
    p.add_argument("--max-seqs", type=int, default=DEFAULT_MAX_SEQS,
                   help="sequences in one running batch")
    p.add_argument("--hash-algo", default="sha256",
                   help="block hash algorithm, as vLLM's (must match across workers)")
    p.add_argument("--hash-seed", default=None,
                   help="block hash seed, vLLM's PYTHONHASHSEED (default: none)")
    p.add_argument("--kernels", default="numpy", choices=("numpy", "numba"),
                   help="CPU block copy backend")


def _check_model(path: str) -> None:
    folder = Path(path)
    if not (folder / "config.json").is_file():
        where = "no such folder" if not folder.is_dir() else "no config.json in it"
        raise CommandError(f"--model {path}: {where}; give a Hugging Face checkpoint folder "
                           "(config.json + *.safetensors)")
    if not any(folder.glob("*.safetensors")):
        raise CommandError(f"--model {path}: no *.safetensors weights in it; give a Hugging "
                           "Face checkpoint folder saved with safetensors")


def _build(args: argparse.Namespace) -> Engine:  # imports torch lazily, for a quick --help
    import torch

    from engines.access import load_token
    from engines.decoder import kernels
    from engines.decoder.runner import Engine
    from engines.store_io import open_store
    from kvstore.client import AuthenticationError, KVStoreUnavailableError

    _check_model(args.model)
    store_token = load_token(args.kvstore_token_file, "127.0.0.1", "--kvstore-token-file")
    kernels.set_backend(args.kernels)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CommandError("--device cuda but torch sees no CUDA device; use --device cpu")
    try:
        ecfg = EngineConfig(block_size=args.block_size, num_blocks=args.num_blocks,
                            max_batch_tokens=args.max_batch_tokens, max_seqs=args.max_seqs,
                            device=device, dtype=args.dtype, hash_algo=args.hash_algo,
                            hash_seed=args.hash_seed)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    try:
        return Engine(args.model, ecfg, open_store(args.kvstore, store_token))
    except KVStoreUnavailableError as exc:
        raise CommandError(f"--kvstore {args.kvstore}: {exc.__cause__ or exc}; start kvstore "
                           "serve there or fix the URL") from None
    except AuthenticationError:
        why = ("refused the token in --kvstore-token-file" if store_token else
               "requires a token; give --kvstore-token-file PATH (a file holding it)")
        raise CommandError(f"--kvstore {args.kvstore} {why}") from None
    except ValueError as exc:  # a checkpoint the decoder does not implement
        raise CommandError(f"--model {args.model}: {exc}") from None


def cmd_generate(args: argparse.Namespace) -> int:
    from engines.decoder.sampler import SamplingParams

    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)
    except ValueError as exc:  # named as the flag is: max_tokens for --max-tokens
        raise CommandError(str(exc)) from None
    engine = _build(args)
    try:
        out = engine.generate([args.prompt_ids], params)[0]
    except ValueError as exc:  # the prompt does not fit this model or cache
        raise CommandError(f"--prompt-ids: {exc}") from None
    print(json.dumps(out))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from engines import listening
    from engines.access import load_token
    from engines.worker import create_app

    if args.role == "prefill" and not args.kvstore:
        raise CommandError("--role prefill needs --kvstore: its blocks go to the store")
    token = load_token(args.token_file, args.host)
    socks = cli_kit.bind_tcp(args.host, args.port, "--port")  # before the model loads
    engine = _build(args)
    app = create_app(engine, role=args.role, token=token)
    details = (f"model {args.model}, role {args.role}, device {engine.ecfg.device}, "
               f"kvstore {args.kvstore or 'none'}")
    listening.serve(app, socks, args.log_level, f"{PROG} worker", details)
    return 0


def cmd_make_model(args: argparse.Namespace) -> int:
    import importlib.util

    from engines import tiny_model

    missing = [m for m in ("safetensors", "tokenizers") if importlib.util.find_spec(m) is None]
    if missing:  # checked first: a folder is never left with weights and no tokenizer
        raise CommandError(f"make-model needs {' and '.join(missing)}: pip install "
                           "'kvstore[engine]'")
    folder = Path(args.path)
    if folder.exists() and not folder.is_dir():
        raise CommandError(f"{args.path} is a file; give a folder to write the model into")
    if folder.is_dir() and any(folder.iterdir()) and not args.force:
        raise CommandError(f"{args.path} is a folder that is not empty; give a new folder, or "
                           "--force to write over the model files in it")
    try:
        config = tiny_model.llama_config(
            layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
            intermediate=args.intermediate, vocab=args.vocab,
            max_position_embeddings=args.max_position)
        tiny_model.make_model(folder, config, seed=args.seed)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot write {args.path}: {exc.strerror or exc}") from None
    print(f"{args.path}: random Llama, {args.layers} layers, hidden {args.hidden}, "
          f"{args.heads} heads ({config['num_key_value_heads']} KV), vocabulary {args.vocab} "
          f"(words w{len(tiny_model.SPECIAL_WORDS)}..w{args.vocab - 1}), seed {args.seed}; "
          f"use it as --model and --tokenizer")
    return 0


def _make_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="folder to write (created if missing)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    # 128 over 4 heads: head dim 32, the smallest vLLM's CPU attention runs
    p.add_argument("--hidden", type=int, default=128, help="hidden size")
    p.add_argument("--heads", type=int, default=4, help="attention (query) heads")
    p.add_argument("--kv-heads", type=int, default=2,
                   help="key/value heads (grouped-query attention; --heads for plain MHA)")
    p.add_argument("--intermediate", type=int, default=None,
                   help="MLP size (default: 2 x --hidden)")
    p.add_argument("--vocab", type=int, default=512,
                   help="vocabulary: the special words, then w7, w8, ...")
    p.add_argument("--max-position", type=int, default=2048, help="longest sequence")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    p.add_argument("--force", action="store_true",
                   help="write into a folder that is not empty (its model files are replaced)")


def build_parser() -> argparse.ArgumentParser:
    parser = cli_kit.Parser(prog=PROG, description="The built-in decoder engine: generate for "
                            "one prompt, serve an HTTP worker, or make a random model to try "
                            "them with.")
    cli_kit.add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    g = sub.add_parser("generate", help="generate for one token-id prompt; prints the output "
                                        "ids as a JSON list")
    _engine_args(g)
    g.add_argument("--prompt-ids", required=True, type=token_ids_arg, metavar="IDS",
                   help="the prompt's token ids: '[1, 2, 3]', '1,2,3' or '1 2 3'")
    g.add_argument("--max-tokens", type=int, default=16, help="tokens to generate at most")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: none)")
    g.add_argument("--ignore-eos", action="store_true", help="go on past end-of-sequence")
    g.set_defaults(handler=cmd_generate)
    s = sub.add_parser("serve", help="run an HTTP worker (see engines/README.md)")
    _engine_args(s)
    s.add_argument("--host", default="127.0.0.1",
                   help="bind address; beyond loopback --token-file is required")
    s.add_argument("--port", type=int, default=8480, help="HTTP port")
    s.add_argument("--role", choices=("both", "prefill", "decode"), default="both",
                   help="prefill: computes prompts' KV into kvstore; decode: generates from "
                        "kvstore's blocks; both: either. POST /admin/role switches it at run "
                        "time (the SLO planner does)")
    s.add_argument("--token-file", default=None, metavar="PATH",
                   help="file holding the bearer token every route but /health then needs "
                        "(routers and the planner send it); without one the worker serves "
                        "loopback only and POST /admin/role is closed (default: none)")
    s.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="uvicorn's log level")
    s.set_defaults(handler=cmd_serve)
    m = sub.add_parser("make-model", help="write a random Llama checkpoint and a word-level "
                                          "tokenizer into a folder (no download)")
    _make_model_args(m)
    m.set_defaults(handler=cmd_make_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    args: Any = build_parser().parse_args(argv)
    return cli_kit.run(PROG, lambda: int(args.handler(args)))


if __name__ == "__main__":
    sys.exit(main())
