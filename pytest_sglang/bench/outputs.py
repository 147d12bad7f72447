"""Greedy outputs of a fixed prompt set, and their comparison across profiles (issue 9 point 5).

Speculative decoding and kernel fusions must not change what a greedy model says. :func:`greedy_outputs`
asks a server for each prompt's output at temperature 0 with a fixed ``max_tokens``, with the token ids where
the API gives them: SGLang's native ``/generate`` (``output_ids``), vLLM's ``/v1/completions`` with
``return_token_ids``, and the text alone from any other OpenAI-compatible server. :func:`compare_outputs`
finds the first prompt and token position where two profiles' outputs differ and shows both texts around it;
``allow_differing`` is the documented tolerance for servers known to differ in the last digits (that many
prompts may differ). Knows nothing about pytest.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_sglang.errors import ServerRequestError

# A fixed, varied prompt set for ``sglang_outputs()`` without prompts: facts, code, lists, arithmetic.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "The capital city of France is",
    "def fibonacci(n):",
    "Here is a list of the planets of the solar system: Mercury,",
    "Question: What is 17 times 23? Answer:",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "import numpy as np\n\nx = np.",
    "The chemical symbol for gold is",
)
CONTEXT_CHARS = 40  # characters of each text shown on either side of the first difference


@dataclass(frozen=True)
class Output:
    """One prompt's greedy output: its text, and its token ids where the server gave them."""

    prompt: str | tuple[int, ...]
    max_tokens: int
    text: str
    token_ids: tuple[int, ...] | None = None

    @property
    def key(self) -> str:
        return json.dumps([self.prompt if isinstance(self.prompt, str) else list(self.prompt), self.max_tokens])


@dataclass
class OutputSet:
    """The greedy outputs one profile gave, in the order first asked; later calls add prompts."""

    profile: str
    outputs: dict[str, Output] = field(default_factory=dict)

    def add(self, outputs: Sequence[Output]) -> None:
        for out in outputs:
            self.outputs[out.key] = out

    def __len__(self) -> int:
        return len(self.outputs)


@dataclass(frozen=True)
class Difference:
    index: int  # the prompt's position in profile a's set
    prompt: str | tuple[int, ...]
    token: int | None  # first differing token position (None: compared as text)
    char: int  # first differing character of the texts
    a: Output | None
    b: Output | None


@dataclass(frozen=True)
class OutputComparison:
    profile_a: str
    profile_b: str
    compared: int
    differences: tuple[Difference, ...]
    allow_differing: int

    @property
    def failed(self) -> bool:
        return len(self.differences) > self.allow_differing or self.compared == 0

    @property
    def message(self) -> str:
        a, b = self.profile_a, self.profile_b
        if self.compared == 0:
            return f"greedy outputs of profiles {a!r} and {b!r}: no prompt was recorded under both"
        head = (f"greedy outputs differ between profiles {a!r} and {b!r}: {len(self.differences)} of "
                f"{self.compared} prompts differ (allowed: {self.allow_differing})")
        if not self.differences:
            return f"greedy outputs of profiles {a!r} and {b!r} are equal on all {self.compared} prompts"
        return head + "\n" + "\n".join(describe(d, a, b) for d in self.differences[:3]) + (
            f"\n... and {len(self.differences) - 3} more" if len(self.differences) > 3 else "")


def _prompt_text(prompt: str | tuple[int, ...]) -> str:
    text = json.dumps(prompt if isinstance(prompt, str) else list(prompt))
    return text if len(text) <= 80 else text[:77] + "..."


def _around(text: str, char: int) -> str:
    lo = max(0, char - CONTEXT_CHARS)
    before, after = text[lo:char], text[char:char + CONTEXT_CHARS]
    return ("..." if lo else "") + json.dumps(before)[1:-1] + "[>>]" + json.dumps(after)[1:-1] + (
        "..." if char + CONTEXT_CHARS < len(text) else "")


def describe(d: Difference, a: str, b: str) -> str:
    """The first difference of one prompt: where, the two tokens, both texts around it."""
    where = f"prompt {d.index} {_prompt_text(d.prompt)}"
    if d.a is None or d.b is None:
        return f"{where}: no output under profile {a if d.a is None else b!r} (recorded under the other only)"
    if d.token is not None and d.a.token_ids is not None and d.b.token_ids is not None:
        ta = d.a.token_ids[d.token] if d.token < len(d.a.token_ids) else "(end)"
        tb = d.b.token_ids[d.token] if d.token < len(d.b.token_ids) else "(end)"
        pos = (f"first differing token at position {d.token} (of {len(d.a.token_ids)} and {len(d.b.token_ids)}): "
               f"{a} {ta} vs {b} {tb}")
    else:
        pos = f"first differing character at {d.char} (compared as text: the server gave no token ids)"
    width = max(len(a), len(b)) + 1
    return (f"{where}: {pos}\n"
            f"    {a + ':':<{width}} {_around(d.a.text, d.char)}\n"
            f"    {b + ':':<{width}} {_around(d.b.text, d.char)}")


def _first_diff(x: Sequence[Any], y: Sequence[Any]) -> int | None:
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def compare_outputs(a: OutputSet, b: OutputSet, *, allow_differing: int = 0) -> OutputComparison:
    """Compare the prompts recorded under both profiles (a prompt recorded under one only differs): token
    ids where both sides have them, else the text."""
    if isinstance(allow_differing, bool) or not isinstance(allow_differing, int) or allow_differing < 0:
        raise ValueError(f"allow_differing must be a number of prompts (>= 0), got {allow_differing!r}")
    keys = list(dict.fromkeys([*a.outputs, *b.outputs]))
    diffs: list[Difference] = []
    for index, key in enumerate(keys):
        oa, ob = a.outputs.get(key), b.outputs.get(key)
        if oa is None or ob is None:
            prompt = (oa or ob).prompt  # type: ignore[union-attr]
            diffs.append(Difference(index, prompt, None, 0, oa, ob))
            continue
        char = _first_diff(oa.text, ob.text)
        token = None
        if oa.token_ids is not None and ob.token_ids is not None:
            token = _first_diff(oa.token_ids, ob.token_ids)
            if token is None:
                continue  # the same tokens: equal, whatever the detokenizer made of them
        elif char is None:
            continue
        diffs.append(Difference(index, oa.prompt, token, char if char is not None else 0, oa, ob))
    compared = len(keys)
    return OutputComparison(a.profile, b.profile, compared, tuple(diffs), allow_differing)


def greedy_outputs(client: Any, kind: str, prompts: Sequence[str | Sequence[int]], *, max_tokens: int = 32,
                   model: str | None = None) -> list[Output]:
    """Each prompt's greedy output (temperature 0, ``max_tokens`` new tokens) from the server behind
    ``client`` (a :class:`~pytest_sglang.bench.client.Client`), one request at a time."""
    outs = []
    for prompt in prompts:
        key: str | tuple[int, ...] = prompt if isinstance(prompt, str) else tuple(int(t) for t in prompt)
        if kind == "sglang":
            answer = client.generate(prompt if isinstance(prompt, str) else list(prompt), max_new_tokens=max_tokens)
            if isinstance(answer, list):
                answer = answer[0]
            ids = answer.get("output_ids")
            outs.append(Output(key, max_tokens, str(answer.get("text") or ""),
                               tuple(int(t) for t in ids) if isinstance(ids, list) else None))
            continue
        extra = {"return_token_ids": True} if kind == "vllm" else {}
        answer = client.completions(prompt if isinstance(prompt, str) else list(prompt), max_tokens=max_tokens,
                                    **({"model": model} if model else {}), **extra)
        try:
            choice = answer["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise ServerRequestError(f"/v1/completions answered without choices: {json.dumps(answer)[:500]}",
                                     status=200) from None
        ids = choice.get("token_ids")
        outs.append(Output(key, max_tokens, str(choice.get("text") or ""),
                           tuple(int(t) for t in ids) if isinstance(ids, list) else None))
    return outs
