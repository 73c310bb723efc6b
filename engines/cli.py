"""``kvstore-engine``: ``generate`` (one prompt, prints the output ids as JSON) and ``serve``
(an HTTP worker, see :mod:`engines.worker`)."""

from __future__ import annotations

import argparse
import json
import sys

from engines.decoder.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_SEQS,
    DEFAULT_NUM_BLOCKS,
    EngineConfig,
)


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="Hugging Face checkpoint folder")
    p.add_argument("--kvstore", default=None, help="kvstore server URL or host:port")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16")
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    p.add_argument("--num-blocks", type=int, default=DEFAULT_NUM_BLOCKS)
    p.add_argument("--max-batch-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS)
    p.add_argument("--max-seqs", type=int, default=DEFAULT_MAX_SEQS)
    p.add_argument("--hash-algo", default="sha256")
    p.add_argument("--hash-seed", default=None)
    p.add_argument("--kernels", default="numpy", help="CPU block copy backend: numpy or numba")


def _build(args: argparse.Namespace):  # -> Engine (imports torch lazily for --help)
    import torch

    from engines.decoder import kernels
    from engines.decoder.runner import Engine
    from engines.store_io import open_store

    kernels.set_backend(args.kernels)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device; use --device cpu")
    ecfg = EngineConfig(block_size=args.block_size, num_blocks=args.num_blocks,
                        max_batch_tokens=args.max_batch_tokens, max_seqs=args.max_seqs,
                        device=device, dtype=args.dtype, hash_algo=args.hash_algo,
                        hash_seed=args.hash_seed)
    return Engine(args.model, ecfg, open_store(args.kvstore))


def cmd_generate(args: argparse.Namespace) -> int:
    from engines.decoder.sampler import SamplingParams

    prompt = json.loads(args.prompt_ids)
    if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
        print("--prompt-ids must be a JSON list of integers", file=sys.stderr)
        return 2
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)
    engine = _build(args)
    print(json.dumps(engine.generate([prompt], params)[0]))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from engines.worker import create_app

    if args.role == "prefill" and not args.kvstore:
        print("--role prefill needs --kvstore: its blocks go to the store", file=sys.stderr)
        return 2
    app = create_app(_build(args), role=args.role)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore-engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate for one token-id prompt")
    _engine_args(g)
    g.add_argument("--prompt-ids", required=True, help="JSON list of token ids")
    g.add_argument("--max-tokens", type=int, default=16)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--ignore-eos", action="store_true")
    g.set_defaults(handler=cmd_generate)
    s = sub.add_parser("serve", help="run an HTTP worker")
    _engine_args(s)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8480)
    s.add_argument("--role", choices=("both", "prefill", "decode"), default="both")
    s.add_argument("--log-level", default="warning")
    s.set_defaults(handler=cmd_serve)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except ValueError as exc:
        print(f"kvstore-engine: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
