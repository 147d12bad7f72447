"""Greedy outputs of a fixed prompt set, and their comparison across profiles (issue 9 point 5).

Speculative decoding and kernel fusions must not change what a greedy model says. :func:`greedy_outputs`
asks a server for each prompt's output at temperature 0 with a fixed ``max_tokens``, with the token ids where
the API gives them: SGLang's native ``/generate`` (``output_ids``), vLLM's ``/v1/completions`` with
``return_token_ids``, and the text alone from any other OpenAI-compatible server. From SGLang and vLLM it also
takes each position's top logprobs, so that a divergence can be told apart: two kernels that round
differently flip a greedy choice only where the model's two best tokens are nearly tied (vLLM's own tests
accept such a flip; its check_logprobs_close asks that each token be in the other's top logprobs).

:func:`compare_outputs` finds the first prompt and token position where two profiles' outputs differ, shows
both texts around it and, with logprobs, each side's margin: how many nats its own token led the other's.
``tie_margin`` accepts a divergence where both margins are within it (a near tie); ``allow_differing`` lets
that many prompts differ whatever their margins. Knows nothing about pytest.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_sglang.bench.answers import read_choice, read_generate
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
TOP_LOGPROBS = 5  # candidates asked per output position (vLLM's default --max-logprobs is 20)
# Where the message calls a divergence a near tie: two tokens whose probabilities are within about 10 % (bf16
# logits step by 1/64 to 1/16 nat at common magnitudes). Only the wording; tie_margin alone decides.
NEAR_TIE_NATS = 0.1

TopLogprobs = tuple[tuple[tuple[int, float], ...] | None, ...]  # per output position: (token id, logprob), best first


@dataclass(frozen=True)
class Output:
    """One prompt's greedy output: its text, and its token ids where the server gave them."""

    prompt: str | tuple[int, ...]
    max_tokens: int
    text: str
    token_ids: tuple[int, ...] | None = None
    # Not part of equality: a rerun may round its logprobs differently while saying the same thing.
    top_logprobs: TopLogprobs | None = field(default=None, compare=False, repr=False)

    def candidates(self, position: int) -> dict[int, float] | None:
        """The server's top candidates at ``position`` (token id -> logprob); None where it gave none."""
        if self.top_logprobs is None or position >= len(self.top_logprobs):
            return None
        listed = self.top_logprobs[position]
        return dict(listed) if listed is not None else None

    def margin(self, position: int, rival: int) -> float | None:
        """How many nats this output's own token at ``position`` led ``rival`` there; None where the server
        gave no logprobs there or either token is not among its top candidates."""
        candidates = self.candidates(position)
        own = _token_at(self.token_ids, position) if self.token_ids is not None else None
        if candidates is None or own not in candidates or rival not in candidates:
            return None
        return candidates[own] - candidates[rival]

    @property
    def key(self) -> str:
        return json.dumps([self.prompt if isinstance(self.prompt, str) else list(self.prompt), self.max_tokens])

    def to_dict(self) -> dict[str, Any]:
        """As JSON, for the other pytest-xdist workers' comparisons."""
        return {"prompt": self.prompt if isinstance(self.prompt, str) else list(self.prompt),
                "max_tokens": self.max_tokens, "text": self.text,
                "token_ids": list(self.token_ids) if self.token_ids is not None else None,
                "top_logprobs": None if self.top_logprobs is None else [
                    None if c is None else [list(x) for x in c] for c in self.top_logprobs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Output:
        prompt = data["prompt"]
        top = data.get("top_logprobs")
        return cls(prompt if isinstance(prompt, str) else tuple(prompt), int(data["max_tokens"]), str(data["text"]),
                   tuple(data["token_ids"]) if data.get("token_ids") is not None else None,
                   None if top is None else tuple(None if c is None else tuple((int(t), float(lp)) for t, lp in c)
                                                  for c in top))


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

    @property
    def margins(self) -> tuple[float | None, float | None]:
        """Each side's lead, in nats, of its own token over the other side's at the first differing token."""
        if self.token is None or self.a is None or self.b is None or self.a.token_ids is None \
                or self.b.token_ids is None:
            return None, None
        ta, tb = _token_at(self.a.token_ids, self.token), _token_at(self.b.token_ids, self.token)
        if ta is None or tb is None:
            return None, None
        return self.a.margin(self.token, tb), self.b.margin(self.token, ta)

    def within(self, tie_margin: float) -> bool:
        """A near tie: both sides' margins known and no wider than ``tie_margin`` either way (a side whose own
        token trailed its rival by more was not choosing greedily between the two)."""
        ma, mb = self.margins
        return ma is not None and mb is not None and max(abs(ma), abs(mb)) <= tie_margin


@dataclass(frozen=True)
class OutputComparison:
    profile_a: str
    profile_b: str
    compared: int
    differences: tuple[Difference, ...]  # the divergences that count against allow_differing
    allow_differing: int
    ties: tuple[Difference, ...] = ()  # divergences at a near tie, accepted by tie_margin
    tie_margin: float = 0.0

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
        tied = ""
        if self.ties:
            tied = (f"{len(self.ties)} of {self.compared} prompts diverged at a near tie (both margins within "
                    f"tie_margin={self.tie_margin:g} nats)")
        if not self.differences:
            if self.ties:
                return (f"greedy outputs of profiles {a!r} and {b!r}: {tied}, the rest equal\n"
                        + "\n".join(describe(d, a, b, accepted=True) for d in self.ties[:3]))
            return f"greedy outputs of profiles {a!r} and {b!r} are equal on all {self.compared} prompts"
        return head + (f"; {tied}" if tied else "") + "\n" + "\n".join(
            describe(d, a, b) for d in self.differences[:3]) + (
            f"\n... and {len(self.differences) - 3} more" if len(self.differences) > 3 else "")


def _prompt_text(prompt: str | tuple[int, ...]) -> str:
    text = json.dumps(prompt if isinstance(prompt, str) else list(prompt))
    return text if len(text) <= 80 else text[:77] + "..."


def _around(text: str, char: int) -> str:
    lo = max(0, char - CONTEXT_CHARS)
    before, after = text[lo:char], text[char:char + CONTEXT_CHARS]
    return ("..." if lo else "") + json.dumps(before)[1:-1] + "[>>]" + json.dumps(after)[1:-1] + (
        "..." if char + CONTEXT_CHARS < len(text) else "")


def _token_at(ids: Sequence[int], position: int) -> int | None:
    return ids[position] if position < len(ids) else None


def _margin_text(d: Difference, a: str, b: str, *, accepted: bool) -> str:
    """Each side's margin at the divergence and what it makes of it, or why there is none; "" where neither
    server gave logprobs or the outputs were compared as text."""
    if d.token is None or d.a is None or d.b is None or (d.a.top_logprobs is None and d.b.top_logprobs is None):
        return ""
    ma, mb = d.margins
    if ma is None or mb is None:
        return "\n    no margins: " + _why_no_margin(d, a, b)
    leads = (f"\n    margins (from the servers' top logprobs): {a}'s token led {b}'s by {_nats(ma)} under {a}, "
             f"{b}'s led {a}'s by {_nats(mb)} under {b}")
    widest = max(abs(ma), abs(mb))
    if accepted:
        return leads + "; accepted as a near tie"
    if widest > NEAR_TIE_NATS or min(ma, mb) < 0:
        return leads + f"; not a near tie (a lead over {NEAR_TIE_NATS:g} nats is a preference, not rounding)"
    return leads + f"; a near tie: compare_outputs(..., tie_margin={_round_up(widest)}) would accept this divergence"


def _why_no_margin(d: Difference, a: str, b: str) -> str:
    assert d.a is not None and d.b is not None
    pos, ids_a, ids_b = d.token, d.a.token_ids, d.b.token_ids
    if pos is None or ids_a is None or ids_b is None or pos >= min(len(ids_a), len(ids_b)):
        return "one output ended there"
    sides = ((a, d.a, ids_b[pos]), (b, d.b, ids_a[pos]))
    for name, out, _rival in sides:
        if out.candidates(pos) is None:
            return f"{name} gave no logprobs at position {pos}"
    for name, out, rival in sides:
        if out.margin(pos, rival) is None:
            return (f"{name}'s top {len(out.candidates(pos) or ())} logprobs do not hold the other profile's token "
                    "(not a near tie)")
    return "the servers' logprobs did not say"


def _nats(margin: float) -> str:
    return "0 nats (an exact tie)" if margin == 0 else f"{margin:.3g} nats"


def _round_up(x: float) -> str:
    """A readable tie_margin that accepts a lead of ``x``: one significant digit, rounded up; a positive one
    for an exact tie (tie_margin=0 accepts nothing)."""
    if x <= 0:
        return "0.001"
    step = 10 ** math.floor(math.log10(x))
    text = f"{math.ceil(x / step) * step:.1g}"
    return text if float(text) >= x else f"{float(text) + step:.1g}"


def describe(d: Difference, a: str, b: str, *, accepted: bool = False) -> str:
    """The first difference of one prompt: where, the two tokens, both texts around it, the margins
    (``accepted``: tie_margin took it as a near tie)."""
    where = f"prompt {d.index} {_prompt_text(d.prompt)}"
    if d.a is None or d.b is None:
        return f"{where}: no output under profile {a if d.a is None else b!r} (recorded under the other only)"
    if d.token is not None and d.a.token_ids is not None and d.b.token_ids is not None:
        ta, tb = _token_at(d.a.token_ids, d.token), _token_at(d.b.token_ids, d.token)
        pos = (f"first differing token at position {d.token} (of {len(d.a.token_ids)} and {len(d.b.token_ids)}): "
               f"{a} {'(end)' if ta is None else ta} vs {b} {'(end)' if tb is None else tb}")
    else:
        pos = f"first differing character at {d.char} (compared as text: the server gave no token ids)"
    width = max(len(a), len(b)) + 1
    return (f"{where}: {pos}\n"
            f"    {a + ':':<{width}} {_around(d.a.text, d.char)}\n"
            f"    {b + ':':<{width}} {_around(d.b.text, d.char)}" + _margin_text(d, a, b, accepted=accepted))


def _first_diff(x: Sequence[Any], y: Sequence[Any]) -> int | None:
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def compare_outputs(a: OutputSet, b: OutputSet, *, allow_differing: int = 0,
                    tie_margin: float = 0.0) -> OutputComparison:
    """Compare the prompts recorded under both profiles (a prompt recorded under one only differs): token
    ids where both sides have them, else the text. A divergence whose two margins are both within
    ``tie_margin`` nats is a near tie: reported, not counted."""
    if isinstance(allow_differing, bool) or not isinstance(allow_differing, int) or allow_differing < 0:
        raise ValueError(f"allow_differing must be a number of prompts (>= 0), got {allow_differing!r}")
    if isinstance(tie_margin, bool) or not isinstance(tie_margin, (int, float)) or not 0 <= tie_margin < math.inf:
        raise ValueError(f"tie_margin must be a logprob difference in nats (>= 0, e.g. 0.05), got {tie_margin!r}")
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
    ties: list[Difference] = []
    counted: list[Difference] = []
    for d in diffs:
        (ties if tie_margin > 0 and d.within(tie_margin) else counted).append(d)
    return OutputComparison(a.profile, b.profile, len(keys), tuple(counted), allow_differing, tuple(ties),
                            float(tie_margin))


def greedy_outputs(client: Any, kind: str, prompts: Sequence[str | Sequence[int]], *, max_tokens: int = 32,
                   model: str | None = None) -> list[Output]:
    """Each prompt's greedy output (temperature 0, ``max_tokens`` new tokens) from the server behind
    ``client`` (a :class:`~pytest_sglang.bench.client.Client`), one request at a time, with each position's top
    logprobs from SGLang and vLLM (a server that refuses them with a 4xx is asked again without)."""
    outs = []
    for prompt in prompts:
        key: str | tuple[int, ...] = prompt if isinstance(prompt, str) else tuple(int(t) for t in prompt)
        sent = prompt if isinstance(prompt, str) else list(prompt)
        if kind == "sglang":
            outs.append(_sglang_output(client, key, sent, max_tokens))
        else:
            outs.append(_openai_output(client, kind, key, sent, max_tokens, model))
    return outs


def _with_logprobs(request: Callable[[dict[str, Any]], Any], fields: dict[str, Any]) -> tuple[Any, bool]:
    """``request(fields)``, or ``request({})`` where the server refuses the logprob fields (an older server or a
    mode without logprobs answers 4xx): (the answer, whether logprobs were asked)."""
    try:
        return request(fields), True
    except ServerRequestError as exc:
        if exc.status is None or not 400 <= exc.status < 500:
            raise
        return request({}), False


def _sglang_output(client: Any, key: str | tuple[int, ...], prompt: str | list[int], max_tokens: int) -> Output:
    answer, asked = _with_logprobs(
        lambda fields: client.generate(prompt, max_new_tokens=max_tokens, fields=fields),
        {"return_logprob": True, "top_logprobs_num": TOP_LOGPROBS})
    read = read_generate(answer)
    top = read.meta.get("output_top_logprobs") if asked else None
    return Output(key, max_tokens, read.text, read.output_ids, _top_logprobs(top, _sglang_candidate))


def _openai_output(client: Any, kind: str, key: str | tuple[int, ...], prompt: str | list[int], max_tokens: int,
                   model: str | None) -> Output:
    base: dict[str, Any] = {"model": model} if model else {}
    if kind != "vllm":  # a strict OpenAI server: only what the API defines
        answer, asked = client.completions(prompt, max_tokens=max_tokens, **base), False
    else:
        base["return_token_ids"] = True
        answer, asked = _with_logprobs(
            lambda more: client.completions(prompt, max_tokens=max_tokens, **base, **more),
            {"logprobs": TOP_LOGPROBS, "return_tokens_as_token_ids": True})
    choice = read_choice(answer, "POST /v1/completions")
    logprobs = choice.fields.get("logprobs")
    top = logprobs.get("top_logprobs") if asked and isinstance(logprobs, dict) else None
    return Output(key, max_tokens, choice.text, choice.token_ids,
                  _top_logprobs([list(p.items()) if isinstance(p, dict) else None for p in top]
                                if isinstance(top, list) else None, _vllm_candidate))


def _sglang_candidate(entry: Any) -> tuple[int, float]:
    """SGLang's ``[logprob, token id, text or null]``."""
    return int(entry[1]), float(entry[0])


def _vllm_candidate(entry: Any) -> tuple[int, float]:
    """vLLM's ``("token_id:N", logprob)`` under return_tokens_as_token_ids."""
    name, logprob = entry
    if not (isinstance(name, str) and name.startswith("token_id:")):
        raise ValueError(f"not a token id: {name!r}")
    return int(name.removeprefix("token_id:")), float(logprob)


def _top_logprobs(positions: Any, candidate: Callable[[Any], tuple[int, float]]) -> TopLogprobs | None:
    """Each position's candidates as (token id, logprob), best first; a position the reader cannot read is
    None, and so is the whole where the answer has no list (logprobs only explain a divergence, so they never
    fail a run)."""
    if not isinstance(positions, list) or not positions:
        return None
    return tuple(_position(cands, candidate) for cands in positions)


def _position(cands: Any, candidate: Callable[[Any], tuple[int, float]]) -> tuple[tuple[int, float], ...] | None:
    if not isinstance(cands, list):
        return None
    try:
        read = [candidate(c) for c in cands]
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        return None
    return tuple(sorted(read, key=lambda c: -c[1]))
