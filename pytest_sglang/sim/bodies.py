"""Reading the simulator's request bodies the way SGLang does, and the usage block it answers with."""

from __future__ import annotations


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
