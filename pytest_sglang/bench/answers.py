"""The shapes of what ``/generate`` and the OpenAI APIs answer, read in one place.

SGLang's ``/generate`` answers ``{"text", "output_ids", "meta_info"}`` (a list of them for a batch); the OpenAI
completions and chat APIs answer ``{"choices": [{...}], "usage": {...}}``, each streamed event a piece of it. A
200 answer of another shape is the server's fault, not a bug of ours: it becomes a
:class:`~pytest_sglang.errors.ServerRequestError` that names the body (trimmed), never a raw IndexError,
AttributeError, ValueError or TypeError. Logprobs are not read here: they only explain a divergence, and
bench/outputs.py reads them leniently.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_sglang.errors import ServerRequestError

EXCERPT_CHARS = 300  # of a body shown in the error: enough to see its shape


@dataclass(frozen=True)
class GenerateAnswer:
    """One answer of SGLang's native ``/generate``."""

    text: str
    output_ids: tuple[int, ...] | None
    meta: Mapping[str, Any]


@dataclass(frozen=True)
class Choice:
    """The first choice of an OpenAI completions or chat answer (or of one streamed event)."""

    text: str  # a completion's text, a chat message's content, or a streamed delta's content
    token_ids: tuple[int, ...] | None  # vLLM's return_token_ids
    fields: Mapping[str, Any]  # the whole choice, for what only some servers add (logprobs)


def bad_shape(where: str, what: str, body: Any) -> ServerRequestError:
    """The error for a 200 answer that is not what the API promises."""
    shown = json.dumps(body, default=repr)
    if len(shown) > EXCERPT_CHARS:
        shown = shown[:EXCERPT_CHARS - 1] + "\u2026"
    return ServerRequestError(f"{where} answered 200 with {what}: {shown}", status=200)


def read_generate(body: Any, where: str = "POST /generate", *, ids: bool = True) -> GenerateAnswer:
    """The (first) answer of ``/generate``. ``ids=False``: leave ``output_ids`` unread (a streamed event repeats
    every id so far, so the load generator would read each one again per event)."""
    answer = body[0] if isinstance(body, list) and body else body
    if not isinstance(answer, dict):
        raise bad_shape(where, "a body that is not a /generate answer (an object with text and meta_info)", body)
    text = answer.get("text")
    if text is not None and not isinstance(text, str):
        raise bad_shape(where, "a text that is not a string", body)
    meta = answer.get("meta_info")
    output_ids = _token_ids(answer.get("output_ids"), where, "output_ids", body) if ids else None
    return GenerateAnswer(text or "", output_ids, meta if isinstance(meta, dict) else {})


def read_choice(body: Any, where: str, *, chat: bool = False) -> Choice:
    """The first choice of a completions or chat answer."""
    choice = first_choice(body, where, chat=chat)
    if choice is None:
        raise bad_shape(where, "no choices", body)
    return choice


def first_choice(body: Any, where: str, *, chat: bool = False) -> Choice | None:
    """The first choice of an answer or streamed event; None where it has none (an event carrying only
    usage)."""
    if not isinstance(body, dict):
        raise bad_shape(where, "a body that is not an object with choices", body)
    choices = body.get("choices")
    if choices is None or choices == []:
        return None
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise bad_shape(where, "choices that are not a list of objects", body)
    choice = choices[0]
    if chat:
        holder = choice.get("delta") if "delta" in choice else choice.get("message")
        if holder is not None and not isinstance(holder, dict):
            raise bad_shape(where, "a chat choice whose delta or message is not an object", body)
        text = "".join(_string(holder or {}, key, where, body) for key in ("content", "reasoning_content"))
    else:
        text = _string(choice, "text", where, body)
    return Choice(text, _token_ids(choice.get("token_ids"), where, "token_ids", body), choice)


def read_count(holder: Any, key: str, where: str, body: Any) -> int | None:
    """A token count the server reports (``usage.completion_tokens``, ``meta_info.prompt_tokens``)."""
    value = holder.get(key) if isinstance(holder, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise bad_shape(where, f"a {key} that is not a whole number", body)
    return int(value)


def _string(holder: Mapping[str, Any], key: str, where: str, body: Any) -> str:
    value = holder.get(key)
    if value is not None and not isinstance(value, str):
        raise bad_shape(where, f"a {key} that is not a string", body)
    return value or ""


def _token_ids(ids: Any, where: str, key: str, body: Any) -> tuple[int, ...] | None:
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise bad_shape(where, f"{key} that are not a list of token ids", body)
    return tuple(ids)
