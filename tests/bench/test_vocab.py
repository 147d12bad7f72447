"""Prompts within the model's vocabulary (issue 9 point 1): config.json, nested configs, /tokenize, text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from pytest_sglang.bench import run_bench
from pytest_sglang.bench.prompts import make_prompts, prepare_prompts
from pytest_sglang.bench.vocab import (
    COMMON_RANGE,
    Vocab,
    config_vocab_sizes,
    learn_vocab,
    local_model_dir,
    vocab_from_config,
)
from pytest_sglang.errors import BenchmarkError, BenchmarkFailedError

from .simproc import run_sim


def write_model(folder: Path, config: dict[str, Any], tokenizer_config: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


# Real multimodal layouts: where each family keeps the text model's vocab_size.
NESTED = {
    "llava (text_config only)": ({"architectures": ["LlavaForConditionalGeneration"], "image_token_index": 32000,
                                  "text_config": {"vocab_size": 32064}, "vision_config": {"hidden_size": 1024}},
                                 32064, "text_config.vocab_size"),
    "internvl (llm_config)": ({"llm_config": {"vocab_size": 151674, "bos_token_id": 1},
                               "vision_config": {"vocab_size": 8192}}, 151674, "llm_config.vocab_size"),
    "qwen2.5-omni (thinker_config.text_config)": (
        {"thinker_config": {"text_config": {"vocab_size": 152064}, "audio_config": {"vocab_size": 4096}}},
        152064, "thinker_config.text_config.vocab_size"),
    "top and nested differ: the smaller": ({"vocab_size": 262208, "text_config": {"vocab_size": 262144}},
                                           262144, "text_config.vocab_size"),
    "deepseek-vl2 (language_config)": ({"language_config": {"vocab_size": 129280}}, 129280,
                                       "language_config.vocab_size"),
}


@pytest.mark.parametrize("case", list(NESTED))
def test_nested_configs_give_the_text_models_vocab(case: str, tmp_path: Path) -> None:
    config, size, key = NESTED[case]
    vocab = vocab_from_config(write_model(tmp_path / "m", config))
    assert vocab is not None and vocab.size == size, vocab
    assert key in vocab.source
    assert (vocab.lo, vocab.hi) == COMMON_RANGE  # a large model keeps the range of every earlier run


def test_vision_and_audio_vocab_sizes_are_not_the_text_models() -> None:
    sizes = config_vocab_sizes({"vision_config": {"vocab_size": 8}, "audio_config": {"vocab_size": 9},
                                "text_config": {"vocab_size": 500}})
    assert sizes == [("text_config.vocab_size", 500)]


def test_small_vocab_draws_below_it_and_skips_special_ids(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "tiny", {"vocab_size": 300, "bos_token_id": 40, "eos_token_id": [41, 42],
                                              "text_config": {"pad_token_id": 43}},
                         {"added_tokens_decoder": {"44": {"content": "<x>"}}})
    vocab = vocab_from_config(folder)
    assert vocab is not None and (vocab.lo, vocab.hi, vocab.size) == (30, 300, 300)
    assert vocab.special == {40, 41, 42, 43, 44}
    prompts, kind = make_prompts(50, 64, seed=3, want_ids=True, vocab=vocab)
    assert kind == "token_ids"
    ids = [t for p in prompts for t in p]
    assert all(len(p) == 64 for p in prompts)  # still exactly input_len tokens
    assert min(ids) >= 30 and max(ids) < 300 and not set(ids) & vocab.special


def test_a_vocab_of_only_special_ids_is_refused() -> None:
    with pytest.raises(BenchmarkError, match="only special tokens"):
        make_prompts(1, 4, seed=0, want_ids=True, vocab=Vocab(10, 12, "test", 12, frozenset({10, 11})))


def test_model_name_found_in_the_local_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    write_model(snap, {"vocab_size": 512})
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert local_model_dir("org/tiny") == snap
    assert local_model_dir("org/absent") is None and local_model_dir(None) is None


class FakeClient:
    """What learn_vocab asks of a Client: post(/tokenize), get(/v1/models), server_info()."""

    def __init__(self, tokenize: dict[str, Any] | None, status: int = 200, model_path: str | None = None) -> None:
        self.tokenize, self.status, self.model_path = tokenize, status, model_path
        self.posts: list[str] = []

    def _response(self, status: int, body: Any) -> requests.Response:
        r = requests.Response()
        r.status_code = status
        r._content = json.dumps(body).encode()
        return r

    def post(self, path: str, body: Any, **kw: Any) -> requests.Response:
        self.posts.append(path)
        if self.tokenize is None:
            return self._response(404, {"detail": "Not Found"})
        return self._response(self.status, self.tokenize)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self._response(200, {"data": [{"id": "m", "root": self.model_path}]})

    def server_info(self) -> dict[str, Any] | None:
        return None


def test_the_servers_tokenize_bounds_the_vocab_from_below() -> None:
    vocab = learn_vocab(FakeClient({"tokens": [5, 260, 17], "count": 3, "max_model_len": 512}), "not/local")
    assert vocab is not None and (vocab.lo, vocab.hi, vocab.size) == (26, 261, None)
    assert "/tokenize" in vocab.source


def test_the_servers_model_path_is_read_when_local(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "served", {"vocab_size": 400})
    client = FakeClient(None, model_path=str(folder))
    vocab = learn_vocab(client, None)
    assert vocab is not None and vocab.size == 400 and client.posts == []  # config.json first


def test_nothing_tells_the_vocab_so_prompts_are_text() -> None:
    client = FakeClient(None)
    assert learn_vocab(client, "org/unknown") is None
    assert client.posts == ["/tokenize", "/v1/tokenize"]
    made, kind, vocab = prepare_prompts(client, api="completions", model="org/unknown", served_model="m", count=3,
                                        warmup=1, input_len=8, seed=0)
    assert vocab is None and kind == "approx_text" and all(isinstance(p, str) for p in made) and len(made) == 4


def test_given_ids_outside_the_vocab_are_refused_before_sending(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", {"vocab_size": 300})
    with pytest.raises(BenchmarkError, match="token id 300, which the model does not have"):
        prepare_prompts(FakeClient(None), api="completions", model=str(folder), served_model=None, count=2,
                        warmup=0, input_len=2, seed=0, prompts=[[1, 2], [299, 300]])


def test_bench_against_a_small_vocab_server_sends_only_its_ids(tmp_path: Path) -> None:
    """The simulator answers 400 "out of vocabulary" as vLLM does: the old [1000, 30000) draw fails on it,
    the learned vocabulary (the server's /tokenize) passes with exact token counts."""
    with run_sim(tmp_path, {"vocab_size": 300, "decode_tok_s": 500, "ttft_ms": 5}) as sim:
        r = requests.post(f"{sim.base_url}/v1/completions", timeout=10, json={
            "prompt": [1000, 1001], "max_tokens": 2})
        assert r.status_code == 400 and "Token id 1000 is out of vocabulary" in r.text
        for api in ("completions", "generate"):
            res = run_bench(sim, api=api, num_requests=6, concurrency=3, input_len=24, output_len=8, warmup=1)
            assert (res.completed, res.failed, res.prompt_kind) == (6, 0, "token_ids"), res.summary()
            assert res.total_input_tokens == 6 * 24 and res.total_output_tokens == 6 * 8
            assert res.prompt_vocab is not None and "/tokenize" in res.prompt_vocab
        with pytest.raises(BenchmarkFailedError, match="out of vocabulary"):
            run_bench(sim, num_requests=2, input_len=4, output_len=2, warmup=0, prompts=[[5, 299], [5, 1000]])
