"""User-side helpers for benchmarking `transformers serve` with pytest-sglang's stock fixtures.

`openai_strict`: transformers serve validates request bodies against the OpenAI schema and answers 422
("Unexpected fields in the request: {'ignore_eos'}") for SGLang/vLLM extras. pytest_sglang.bench's build_payload
always puts `ignore_eos` in an OpenAI body (True or False), and run_bench has no option to leave it out, so this
fixture wraps the payload builder the runner imports and drops that one field. The served model has no EOS token
(make_model.py), so every request still generates exactly `output_len` tokens. A workaround on the test side,
not a change to the plugin: see RESULTS-tf-serve.md for the patch proposed to bench.py's owner.

`text_prompts`: transformers serve's /v1/completions takes a string prompt only (token-id lists get 400
"prompt must be a string."), while run_bench sends token ids on the completions API; so the tests give it text
made with the model's own tokenizer, `input_len` tokens each.
"""

from __future__ import annotations

import random

import pytest


@pytest.fixture
def openai_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_sglang.bench.runner as bench

    original = bench.build_payload

    def without_extras(*args, **kwargs):
        path, body = original(*args, **kwargs)
        if path.startswith("/v1/"):
            body.pop("ignore_eos", None)
        return path, body

    monkeypatch.setattr(bench, "build_payload", without_extras)


@pytest.fixture(scope="session")
def tokenizer(sglang_server):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(sglang_server.model, local_files_only=True)


@pytest.fixture
def text_prompts(tokenizer):
    """``text_prompts(count, input_len)``: texts of input_len tokens (the server's usage gives the exact count)."""

    def make(count: int, input_len: int, seed: int = 0) -> list[str]:
        rng = random.Random(seed)
        specials = set(tokenizer.all_special_ids)
        # tokens that decode to whole characters, so joined texts are valid UTF-8 and re-encode stably
        ids_pool = [i for i in range(len(tokenizer))
                    if i not in specials and "\ufffd" not in tokenizer.decode([i])]
        out = []
        for _ in range(count):
            ids: list[int] = []
            while len(ids) < input_len:  # re-encoding merges bytes; top up until the length holds
                ids += [rng.choice(ids_pool) for _ in range(input_len - len(ids))]
                ids = tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)[:input_len]
            out.append(tokenizer.decode(ids))
        return out

    return make
