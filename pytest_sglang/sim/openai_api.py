"""The OpenAI endpoints of the simulator: /v1/completions and /v1/chat/completions, whole or streamed, as
SGLang answers them."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pytest_sglang.sim.bodies import (
    BadRequest,
    int_field,
    is_batch,
    logprob_count,
    message_text,
    openai_logprobs,
    usage,
)
from pytest_sglang.sim.engine import count_prompt_tokens, detokenize
from pytest_sglang.sim.http_base import TEXT_MARK, BaseHandler, sse_event, text_event

DEFAULT_MAX_TOKENS = 16


class OpenAIHandler(BaseHandler):
    def completions(self, body: dict[str, Any]) -> None:
        self.openai(body, chat=False)

    def chat_completions(self, body: dict[str, Any]) -> None:
        self.openai(body, chat=True)

    def openai(self, body: dict[str, Any], *, chat: bool) -> None:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages must be a non-empty list")
            prompts: list[object] = [[message_text(m) for m in messages]]
        else:
            prompt = body.get("prompt")
            if prompt is None:
                raise BadRequest("prompt is required")
            prompts = list(prompt) if is_batch(prompt) else [prompt]
        n = int_field(body.get("max_tokens", body.get("max_completion_tokens")) or DEFAULT_MAX_TOKENS,
                      "max_tokens")
        logprob_count(body, "completions")
        model = self.sim.args.served_model_name
        created = int(time.time())
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"
        n_prompt = sum(count_prompt_tokens(p) for p in prompts)
        if body.get("stream"):
            if len(prompts) != 1:
                raise BadRequest("the simulator streams single prompts only")
            self.openai_stream(prompts[0], n, chat=chat, cid=cid, created=created, model=model,
                               include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
                               spec_details=bool(body.get("return_spec_tokens_details")))
        else:
            choices = []
            total_out = 0
            for i, p in enumerate(prompts):
                out, _e2e, _steps, _cached = self.generate_one(p, n)
                total_out += len(out)
                text = detokenize(out)
                if chat:
                    choices.append({"index": i, "message": {"role": "assistant", "content": text,
                                                            "reasoning_content": None, "tool_calls": None},
                                    "logprobs": None, "finish_reason": "length", "matched_stop": None})
                else:
                    choices.append({"index": i, "text": text, "logprobs": openai_logprobs(body, self.candidates(p, n)),
                                    "finish_reason": "length", "matched_stop": None})
            self.send_json(200, {"id": cid, "object": obj, "created": created, "model": model,
                                 "choices": choices, "usage": usage(n_prompt, total_out)})
        self.sim.request_done(self.is_warmup)

    def openai_stream(self, prompt: object, n: int, *, chat: bool, cid: str, created: int, model: str,
                      include_usage: bool, spec_details: bool = False) -> None:
        start = time.monotonic()
        tokens = self.outputs(prompt, n)
        n_prompt = count_prompt_tokens(prompt)
        cached = self.sim.prefill(prompt)
        self.send_head(200, "text/event-stream", None)
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": cid, "object": obj, "created": created, "model": model}
        middle = text_event({**head, "choices": [self.openai_choice(TEXT_MARK, chat=chat, first=False, last=False)],
                             "usage": None})
        sent = 0
        steps = 0
        times: list[float] = []
        gen = self.sim.engine.stream(tokens)
        try:
            for ids, last in gen:
                sent += len(ids)
                steps += 1
                times.append(time.monotonic())
                self.sim.tokens_out += len(ids)
                text = detokenize(ids)
                if not last:
                    self.wfile.write(middle(text) if steps > 1 else sse_event(json.dumps(
                        {**head, "choices": [self.openai_choice(text, chat=chat, first=True, last=False)],
                         "usage": None}).encode()))
                    continue
                self.finished(prompt, sent, steps, start, times, cached)
                closing = [{**head, "choices": [self.openai_choice(text, chat=chat, first=steps == 1, last=True)],
                            "usage": None}]
                if spec_details and self.sim.args.speculative:  # SGLang's sglext chunk, at response level
                    closing.append({**head, "choices": [], "sglext": {"spec_tokens_details": {
                        "spec_verify_ct": steps, "spec_accept_length": sent / steps if steps else 0.0}}})
                if include_usage:
                    closing.append({**head, "choices": [], "usage": usage(n_prompt, sent)})
                self.end_sse(*closing)
            self.traced(start, times, sent, prompt)
        finally:
            gen.close()

    @staticmethod
    def openai_choice(text: str, *, chat: bool, first: bool, last: bool) -> dict[str, Any]:
        """One streamed choice: a chat delta (its first with the role) or a completion's text."""
        finish = "length" if last else None
        choice: dict[str, Any]
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if last:
            choice["matched_stop"] = None
        return choice
