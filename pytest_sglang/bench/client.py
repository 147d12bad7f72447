"""Synchronous client over ``requests`` for the calls a test makes one at a time.

:class:`Client` covers ``/generate``, ``/v1/completions``, ``/v1/chat/completions`` (plain or streamed),
``/server_info``, ``/v1/models`` and ``/version``, for SGLang, vLLM and OpenAI-compatible servers. An answer
with an error status, or a body that is not what the API promises, raises
:class:`~pytest_sglang.errors.ServerRequestError` (``status`` is the HTTP status); a connection that fails
raises ``requests``' own ConnectionError, which the plugin reads as a sign that the server died. The API key
travels only in the ``Authorization`` header and is never part of a message or a repr.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import requests

from pytest_sglang.bench.payloads import API_PATHS, BODY_EXCERPT, Api, build_payload
from pytest_sglang.errors import ServerRequestError, auth_headers


class Client:
    """Synchronous client for one server: ``Client(server.base_url, api_key=server.api_key)``."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0,
                 model: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update(auth_headers(api_key))
        self._model = model

    def __repr__(self) -> str:  # never shows the key
        return f"Client({self.base_url!r})"

    def url(self, path: str) -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.session.get(self.url(path), timeout=kwargs.pop("timeout", self.timeout), **kwargs)

    def post(self, path: str, json_body: Any, **kwargs: Any) -> requests.Response:
        return self.session.post(self.url(path), json=json_body,
                                 timeout=kwargs.pop("timeout", self.timeout), **kwargs)

    def _json(self, response: requests.Response) -> Any:
        """The answer's JSON; ServerRequestError for an error status or a body that is not JSON."""
        where = f"{response.request.method} {response.url}"
        if response.status_code != 200:
            raise ServerRequestError(
                f"{where} answered {response.status_code}: {response.text[:BODY_EXCERPT]}",
                status=response.status_code)
        try:
            return response.json()
        except ValueError:
            raise ServerRequestError(
                f"{where} answered {response.status_code} with a body that is not JSON: "
                f"{response.text[:BODY_EXCERPT]!r}", status=response.status_code) from None

    def models(self) -> list[str]:
        """The ids of ``/v1/models``."""
        answer = self._json(self.get("/v1/models"))
        try:
            return [str(m["id"]) for m in answer.get("data", [])]
        except (AttributeError, KeyError, TypeError):
            raise ServerRequestError(f"GET {self.url('/v1/models')} answered a list of models without ids: "
                                     f"{json.dumps(answer)[:BODY_EXCERPT]}", status=200) from None

    def model(self) -> str | None:
        """The served model name: the one given, else the first of ``/v1/models``."""
        if self._model is None:
            try:
                names = self.models()
            except (requests.RequestException, ServerRequestError):
                names = []
            self._model = names[0] if names else None
        return self._model

    def server_info(self) -> dict[str, Any] | None:
        """SGLang's ``/server_info`` (``/get_server_info`` before 0.5.9); None where neither answers."""
        for path in ("/server_info", "/get_server_info"):
            try:
                response = self.get(path, timeout=30)
            except requests.RequestException:
                return None
            if response.status_code == 200:
                try:
                    info = response.json()
                except ValueError:
                    return None
                return info if isinstance(info, dict) else None
        return None

    def version(self) -> str | None:
        """The server's version: ``version`` of SGLang's server info, else vLLM's ``/version``."""
        info = self.server_info()
        if info and info.get("version"):
            return str(info["version"])
        try:
            response = self.get("/version", timeout=30)
            if response.status_code == 200:
                return str(response.json().get("version")) or None
        except (requests.RequestException, ValueError, AttributeError):
            pass
        return None

    def accept_length(self) -> float | None:
        """Average speculative accept length (``internal_states[0].avg_spec_accept_length``), else None."""
        info = self.server_info()
        if not info:
            return None
        states = info.get("internal_states") or []
        if states and isinstance(states[0], dict):
            value = states[0].get("avg_spec_accept_length")
            return float(value) if value is not None else None
        return None

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int = 16,
                 fields: Mapping[str, Any] | None = None, **sampling: Any) -> Any:
        """Native ``/generate`` without streaming; returns the JSON answer. ``sampling`` goes into
        ``sampling_params``, ``fields`` beside it (e.g. ``return_logprob``)."""
        _, body = build_payload("generate", prompt=prompt, output_len=max_new_tokens, stream=False,
                                ignore_eos=sampling.pop("ignore_eos", False),
                                temperature=sampling.pop("temperature", 0.0), extra=fields)
        body["sampling_params"].update(sampling)
        return self._json(self.post("/generate", body))

    def completions(self, prompt: str | Sequence[int], *, max_tokens: int = 16, **extra: Any) -> Any:
        _, body = build_payload("completions", prompt=prompt, output_len=max_tokens, stream=False,
                                model=extra.pop("model", None) or self.model(),
                                ignore_eos=extra.pop("ignore_eos", False), extra=extra)
        return self._json(self.post("/v1/completions", body))

    def chat(self, content: str, *, max_tokens: int = 16, **extra: Any) -> Any:
        _, body = build_payload("chat", prompt=content, output_len=max_tokens, stream=False,
                                model=extra.pop("model", None) or self.model(),
                                ignore_eos=extra.pop("ignore_eos", False), extra=extra)
        return self._json(self.post("/v1/chat/completions", body))

    def stream(self, api: Api, prompt: str | Sequence[int], *, max_tokens: int = 16,
               **extra: Any) -> Iterator[dict[str, Any]]:
        """Yield each streamed event's JSON (the ``[DONE]`` marker ends the iteration); an error status or an
        event that is not JSON raises ServerRequestError."""
        model = (extra.pop("model", None) or self.model()) if api != "generate" else None
        _, body = build_payload(api, prompt=prompt, output_len=max_tokens, stream=True, model=model,
                                ignore_eos=extra.pop("ignore_eos", False), extra=extra)
        with self.session.post(self.url(API_PATHS[api]), json=body, stream=True,
                               timeout=self.timeout) as response:
            if response.status_code != 200:
                self._json(response)
            for line in response.iter_lines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                try:
                    event = json.loads(payload)
                except ValueError:
                    raise ServerRequestError(f"POST {response.url} streamed an event that is not JSON: "
                                             f"{payload[:200]!r}", status=response.status_code) from None
                yield event

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
