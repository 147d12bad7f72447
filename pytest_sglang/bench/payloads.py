"""What goes on the wire: the generation APIs' paths, one request's JSON body, the auth header.

``build_payload(api, prompt=..., output_len=...)`` returns ``(path, body)`` for SGLang's native
``/generate``, ``/v1/completions`` or ``/v1/chat/completions``; bad arguments raise
:class:`~pytest_sglang.errors.BenchmarkError`. Shared by the streaming client (stream.py), the synchronous
client (client.py) and the runner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pytest_sglang.errors import BenchmarkError

Api = Literal["completions", "chat", "generate"]
API_PATHS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "generate": "/generate",
}
BODY_EXCERPT = 2000  # characters of an error body kept for messages


def build_payload(
    api: Api,
    *,
    prompt: str | Sequence[int],
    output_len: int,
    model: str | None = None,
    ignore_eos: bool | None = True,
    stream: bool = True,
    temperature: float = 0.0,
    extra: Mapping[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of one generation request.

    ``prompt`` is text or token ids. Token ids go to SGLang's ``input_ids`` (native) or the OpenAI ``prompt``
    as a list of ids (both SGLang and vLLM accept it); chat takes text only. ``extra`` is merged into the body
    (one level deep for objects such as ``stream_options``).
    """
    if api not in API_PATHS:
        raise BenchmarkError(f"unknown api {api!r}: expected one of {', '.join(API_PATHS)}")
    body: dict[str, Any]
    if api == "generate":
        sampling: dict[str, Any] = {"max_new_tokens": output_len, "temperature": temperature}
        if ignore_eos is not None:  # None: leave the field out
            sampling["ignore_eos"] = ignore_eos
        body = {"sampling_params": sampling, "stream": stream}
        if isinstance(prompt, str):
            body["text"] = prompt
        else:
            body["input_ids"] = list(prompt)
    else:
        body = {"max_tokens": output_len, "temperature": temperature, "stream": stream}
        if ignore_eos is not None:  # None: leave it out; strict OpenAI servers (transformers serve) answer 422
            body["ignore_eos"] = ignore_eos
        if model:
            body["model"] = model
        if stream:
            body["stream_options"] = {"include_usage": True}
        if api == "chat":
            if not isinstance(prompt, str):
                raise BenchmarkError("the chat API takes a text prompt, not token ids")
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt if isinstance(prompt, str) else list(prompt)
    if extra:
        for key, value in extra.items():
            if isinstance(value, Mapping) and isinstance(body.get(key), dict):
                body[key] = {**body[key], **value}
            else:
                body[key] = value
    return API_PATHS[api], body
