"""Prompts of an exact token length: random token ids where the API takes them, else text.

:func:`make_prompts` draws seeded token ids from the model's own vocabulary (a :class:`~.vocab.Vocab`, learned
by :func:`~.vocab.learn_vocab`; without one, from a range that is ordinary text in every common vocabulary);
for the chat API (text only) it decodes them with the model's tokenizer (:func:`load_tokenizer`, through
``transformers`` when installed and available offline) and trims the re-encoding to the exact length, or,
with no tokenizer at hand, joins common words whose token count is only approximate.
:func:`prepare_prompts` is the runner's one call: it learns the vocabulary first and never sends an id the
model lacks (text prompts where nothing tells the vocabulary; given id prompts are checked against it). With
``sets`` (``cache="fresh"``, bench/cache.py) it makes the warmup and each round a prompt set of its own: set ``n``
is drawn from :func:`set_seed` of the run's seed and ``n``, so it is the same in every run and on every server.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from pytest_sglang.bench.vocab import Vocab, learn_vocab
from pytest_sglang.errors import BenchmarkError

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


def set_seed(seed: int, index: int) -> str:
    """The seed of prompt set ``index`` of a run seeded ``seed`` (a string: random.Random hashes it the same in
    every process, and no two pairs give the same one). A pytest-xdist worker draws its own sets (its name in
    the seed): workers that share a server would otherwise send it the same prompts."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"pytest-sglang/{seed}/{index}" + (f"/{worker}" if worker else "")


def make_prompts(count: int, input_len: int, *, seed: int | str, want_ids: bool, tokenizer: Any | None = None,
                 vocab: Vocab | None = None) -> tuple[list[str | list[int]], str]:
    """``count`` prompts of ``input_len`` tokens and how they were made.

    Token ids where the API takes them (exact length), drawn from ``vocab`` (default: ``[1000, 30000)``, or
    below the tokenizer's size); otherwise text decoded from random ids with the model's tokenizer,
    re-encoded and trimmed to the exact length; otherwise (no tokenizer) words whose token count is only
    approximate, in which case input token totals come from the server's usage.
    """
    rng = random.Random(seed)
    prompts: list[str | list[int]] = []
    tok_special = set(getattr(tokenizer, "all_special_ids", []) or []) if tokenizer is not None else set()
    if want_ids:
        lo, hi = _SAFE_TOKEN_IDS
        special = set(tok_special)
        if vocab is not None:
            lo, hi = vocab.lo, vocab.hi
            special |= vocab.special
        if tokenizer is not None:
            hi = min(hi, int(getattr(tokenizer, "vocab_size", hi)))
            lo = min(lo, max(0, hi // 10))
        if hi - lo <= len({t for t in special if lo <= t < hi}):
            raise BenchmarkError(f"no token id to draw prompts from: [{lo}, {hi}) holds only special tokens")
        for _ in range(count):
            ids: list[int] = []
            while len(ids) < input_len:
                tid = rng.randrange(lo, hi)
                if tid not in special:
                    ids.append(tid)
            prompts.append(ids)
        return prompts, "token_ids"
    if tokenizer is not None:
        size = int(getattr(tokenizer, "vocab_size", 30000))
        if vocab is not None:
            size = min(size, vocab.hi)
        for _ in range(count):
            ids = [rng.randrange(min(_SAFE_TOKEN_IDS[0], size // 10), min(size, _SAFE_TOKEN_IDS[1]))
                   for _ in range(input_len)]
            text = tokenizer.decode(ids)
            ids = tokenizer.encode(text, add_special_tokens=False)[:input_len]
            prompts.append(tokenizer.decode(ids))
        return prompts, "tokenizer_text"
    for _ in range(count):
        prompts.append(" ".join(rng.choice(_WORDS) for _ in range(input_len)))
    return prompts, "approx_text"


def prepare_prompts(
    client: Any,
    *,
    api: str,
    model: str | None,
    served_model: str | None,
    count: int,
    warmup: int,
    input_len: int,
    seed: int,
    tokenizer: Any | str | None = None,
    prompts: Sequence[str | Sequence[int]] | None = None,
    sets: Sequence[int] | None = None,
) -> tuple[list[str | list[int]], str, Vocab | None]:
    """The warmup prompts, then the ``count`` measured ones, how they were made, and the vocabulary used.
    ``sets`` (made prompts only): the warmup's set (where ``warmup`` > 0) and then each round's, ``count``
    prompts each: the warmup prompts, then every round's ``count`` in turn.

    Made here (``prompts`` None): token ids of the model's vocabulary (:func:`~.vocab.learn_vocab`) for the
    completions and native APIs; text where the vocabulary is unknown or the API is chat (exact through the
    model's tokenizer where one is at hand). Given: the first ``count``, the warmup picked among them; token
    ids outside a known vocabulary raise BenchmarkError before anything is sent.
    """
    vocab = None
    if api != "chat" and (prompts is None or any(not isinstance(p, str) for p in prompts)):
        vocab = learn_vocab(client, model, served_model=served_model)
    if prompts is not None:
        if len(prompts) < count:
            raise BenchmarkError(f"{len(prompts)} prompts given for {count} requests")
        given = [p if isinstance(p, str) else list(p) for p in prompts[:count]]
        if vocab is not None and vocab.size is not None:
            for i, p in enumerate(given):
                bad = [] if isinstance(p, str) else [t for t in p if not vocab.allows(t)]
                if bad:
                    raise BenchmarkError(f"prompt {i} holds token id {bad[0]}, which the model does not have "
                                         f"({vocab.describe()})")
        rng = random.Random(seed)
        picks = [given[rng.randrange(len(given))] for _ in range(warmup)]
        return picks + given, "given", vocab
    tok = tokenizer
    if tokenizer is None or isinstance(tokenizer, str):
        tok = load_tokenizer(tokenizer or model) if (api == "chat" or vocab is None) else None
    want_ids = api != "chat" and vocab is not None
    if sets is None:
        made, kind = make_prompts(count + warmup, input_len, seed=seed, want_ids=want_ids, tokenizer=tok, vocab=vocab)
        return made, kind, vocab
    made, kind = [], "token_ids"
    for i, index in enumerate(sets):
        n = warmup if i == 0 and warmup else count
        part, kind = make_prompts(n, input_len, seed=set_seed(seed, index), want_ids=want_ids, tokenizer=tok,
                                  vocab=vocab)
        made += part
    return made, kind, vocab
