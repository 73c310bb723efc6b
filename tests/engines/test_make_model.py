"""``kvstore-engine make-model`` writes a random Llama and its tokenizer that the built-in
engine, ``transformers`` (model and ``AutoTokenizer``, chat template included) load, the same
bytes for the same seed; arguments that cannot work are one line and exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from engines.cli import main as engine_main
from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.tiny_model import words
from kvstore.testing.proc import ROOT, console_script

ENGINE = console_script("kvstore-engine", "engines.cli")
SIZES = ("--layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--vocab", "64")


def make_model(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENGINE, "make-model", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("made") / "tiny-llama"
    done = make_model(str(path), *SIZES, "--seed", "7")
    assert done.returncode == 0, done.stderr
    assert str(path) in done.stdout
    return path


def test_the_engine_loads_and_generates(made: Path) -> None:
    engine = Engine(made, EngineConfig(block_size=4, num_blocks=16))
    cfg = engine.model.cfg
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
            cfg.intermediate_size, cfg.vocab_size) == (1, 32, 4, 2, 64, 64)
    out = engine.generate([[1, 10, 11, 12]], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(out) == 4 and all(0 <= t < 64 for t in out)


def test_transformers_loads_the_checkpoint_and_the_tokenizer(made: Path) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    loaded: Any = LlamaForCausalLM.from_pretrained(made, output_loading_info=True)
    info = loaded[1]
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensor
    tok = AutoTokenizer.from_pretrained(made)
    vocab = words(64)
    assert tok.encode("w10 w63 nope") == [10, 63, 0]
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    text = tok.apply_chat_template([{"role": "user", "content": "w10 w11"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<s>user: w10 w11 assistant:"
    assert tok.decode([vocab.index("w20"), 2, 21], skip_special_tokens=True) == "w20 w21"


def test_the_same_seed_writes_the_same_bytes(made: Path, tmp_path: Path) -> None:
    # the command's own entry point, in this process (a second torch start costs seconds)
    assert engine_main(["make-model", str(tmp_path / "again"), *SIZES, "--seed", "7"]) == 0
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (made / name).read_bytes(), name
    assert engine_main(["make-model", str(tmp_path / "other"), *SIZES, "--seed", "8"]) == 0
    weights = "model.safetensors"
    assert (tmp_path / "other" / weights).read_bytes() != (made / weights).read_bytes()


def test_force_writes_over_a_model_folder(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    assert engine_main(["make-model", str(target), *SIZES]) == 2
    assert engine_main(["make-model", str(target), *SIZES, "--force"]) == 0
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] == 1
    assert (target / "notes.txt").read_text() == "mine"  # only the model's files are written


@pytest.mark.parametrize("args,words_in_line", [
    (("{made}",), ("not empty", "--force")),
    (("{made}/config.json",), ("is a file",)),
    (("{tmp}/x", "--hidden", "30", "--heads", "4"), ("--hidden 30", "--heads 4")),
    (("{tmp}/x", "--heads", "4", "--kv-heads", "3"), ("--kv-heads 3",)),
    (("{tmp}/x", "--layers", "0"), ("--layers",)),
    (("{tmp}/x", "--vocab", "5"), ("--vocab",)),
    (("{tmp}/x", "--hidden", "36", "--heads", "4"), ("even",)),
    (("{tmp}/x", "--layers", "two"), ("--layers",)),
])
def test_bad_arguments_are_one_line_and_exit_2(made: Path, tmp_path: Path, args: tuple[str, ...],
                                              words_in_line: tuple[str, ...]) -> None:
    done = make_model(*(a.format(made=made, tmp=tmp_path) for a in args))
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words_in_line:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "x").exists()  # nothing written by a refused command
