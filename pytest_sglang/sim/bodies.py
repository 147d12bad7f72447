"""Reading the simulator's request bodies the way SGLang does, and the usage and logprob blocks it answers
with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_sglang.sim.engine import detokenize

# k -> each output position's k best (token id, logprob), the output's own token first (engine.top_candidates)
Candidates = Callable[[int], list[list[tuple[int, float]]]]


class BadRequest(Exception):
    pass


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def int_field(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise BadRequest(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def is_batch(prompt: object) -> bool:
    """A list of strings or of id lists is a batch; a flat list of ints is one prompt of token ids."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(p, (str, list)) for p in prompt)


def message_text(message: object) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def logprob_count(body: dict[str, Any], api: str) -> int:
    """How many top logprobs per position the body asks for (0: none), read before any work is done."""
    if api == "generate":
        return int_field(body.get("top_logprobs_num") or 0, "top_logprobs_num") if body.get("return_logprob") else 0
    value = body.get("logprobs")
    return 0 if value in (None, False) else max(1, int_field(value, "logprobs"))


def native_logprobs(body: dict[str, Any], candidates: Candidates) -> dict[str, Any]:
    """SGLang's ``return_logprob`` fields of meta_info: each output token's [logprob, id, text] and its top
    ``top_logprobs_num`` candidates (text null: the simulator, like SGLang by default, does not decode them)."""
    if not body.get("return_logprob"):
        return {}
    k = logprob_count(body, "generate")
    cands = candidates(max(k, 1))
    return {"output_token_logprobs": [[c[0][1], c[0][0], None] for c in cands],
            "output_top_logprobs": [[[lp, t, None] for t, lp in c[:k]] for c in cands] if k else []}


def openai_logprobs(body: dict[str, Any], candidates: Candidates) -> dict[str, Any] | None:
    """The completions ``logprobs`` object for ``logprobs: k``; with vLLM's ``return_tokens_as_token_ids`` the
    tokens are named ``token_id:N``, else by their text."""
    k = logprob_count(body, "completions")
    if not k:
        return None
    as_ids = bool(body.get("return_tokens_as_token_ids"))

    def name(token: int) -> str:
        return f"token_id:{token}" if as_ids else detokenize([token])

    cands = candidates(k)
    texts = [detokenize([c[0][0]]) for c in cands]
    return {"tokens": [name(c[0][0]) for c in cands], "token_logprobs": [c[0][1] for c in cands],
            "top_logprobs": [{name(t): lp for t, lp in c} for c in cands],
            "text_offset": [sum(len(x) for x in texts[:i]) for i in range(len(texts))]}
