"""Prompts of an exact token length: random token ids where the API takes them, else text.

:func:`make_prompts` draws seeded token ids from a range that is ordinary text in every common vocabulary;
for the chat API (text only) it decodes them with the model's tokenizer (:func:`load_tokenizer`, through
``transformers`` when installed and available offline) and trims the re-encoding to the exact length, or,
with no tokenizer at hand, joins common words whose token count is only approximate.
"""

from __future__ import annotations

import random
from typing import Any

# A token-id range that is ordinary text in every common vocabulary (Llama, Qwen, Mistral, GPT-2/OPT...):
# special tokens sit at the very start or far above it.
_SAFE_TOKEN_IDS = (1000, 30000)
_WORDS = ("the of and to in is was for on that with as by at from his her an were are which this be "
          "or has had not but its one their they have new first two more after who other been all "
          "also time into only year when some most can would between over than about these made "
          "city people many such during state world used school under three while known part").split()


def load_tokenizer(name_or_path: str | None) -> Any | None:
    """The model's tokenizer through ``transformers`` when installed and available offline, else None."""
    if not name_or_path:
        return None
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found,unused-ignore]

        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure means "no tokenizer at hand"
        return None


def make_prompts(count: int, input_len: int, *, seed: int, want_ids: bool, tokenizer: Any | None = None
                 ) -> tuple[list[str | list[int]], str]:
    """``count`` prompts of ``input_len`` tokens and how they were made.

    Token ids where the API takes them (exact length); otherwise text decoded from random ids with the
    model's tokenizer, re-encoded and trimmed to the exact length; otherwise (no tokenizer) words whose
    token count is only approximate, in which case input token totals come from the server's usage.
    """
    rng = random.Random(seed)
    prompts: list[str | list[int]] = []
    if want_ids:
        lo, hi = _SAFE_TOKEN_IDS
        if tokenizer is not None:
            special = set(getattr(tokenizer, "all_special_ids", []) or [])
            hi = min(hi, int(getattr(tokenizer, "vocab_size", hi)))
            lo = min(lo, max(0, hi // 10))
        else:
            special = set()
        for _ in range(count):
            ids: list[int] = []
            while len(ids) < input_len:
                tid = rng.randrange(lo, hi)
                if tid not in special:
                    ids.append(tid)
            prompts.append(ids)
        return prompts, "token_ids"
    if tokenizer is not None:
        vocab = int(getattr(tokenizer, "vocab_size", 30000))
        for _ in range(count):
            ids = [rng.randrange(min(_SAFE_TOKEN_IDS[0], vocab // 10), min(vocab, _SAFE_TOKEN_IDS[1]))
                   for _ in range(input_len)]
            text = tokenizer.decode(ids)
            ids = tokenizer.encode(text, add_special_tokens=False)[:input_len]
            prompts.append(tokenizer.decode(ids))
        return prompts, "tokenizer_text"
    for _ in range(count):
        prompts.append(" ".join(rng.choice(_WORDS) for _ in range(input_len)))
    return prompts, "approx_text"
