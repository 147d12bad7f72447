"""Which token ids the model has, learned before any id is sent: :func:`learn_vocab`.

A prompt of random token ids must never hold an id that the model lacks: real SGLang 0.5.23 indexes its
embedding with it and its scheduler dies (``IndexError: index out of range in self``), real vLLM answers
HTTP 400 (``Token id 28670 is out of vocabulary``). The sources, first that answers wins:

1. the model folder's ``config.json`` where the model is a local path (or in the local Hugging Face cache):
   ``vocab_size`` at the top and in every text sub-config (``text_config``, ``llm_config``,
   ``language_config``, ``thinker_config.text_config``...), the smallest of them, vision and audio
   sub-configs left out; special ids (``*_token_id``, ``*_token_index``, the tokenizer files' added tokens)
   are never drawn;
2. the server's own ``/tokenize`` (vLLM, and SGLang since 0.4): a fixed text is tokenized and the largest id
   returned bounds the vocabulary from below. A Hugging Face vocabulary is dense (ids 0..V-1), so every id up
   to that one exists;
3. nothing: :func:`learn_vocab` returns None and the runner sends text prompts instead.

The ids are drawn from ``[lo, hi)`` (:class:`Vocab`): ``hi`` is the vocabulary's bound, capped at 30000, and
``lo`` is 1000 (or a tenth of ``hi`` for a small vocabulary), so that a large model keeps the range that
every earlier run used (``[1000, 30000)``, ordinary text in every common vocabulary) and its baselines stay
comparable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMMON_RANGE = (1000, 30000)  # the range of every earlier run: ordinary text in Llama, Qwen, Mistral, GPT-2...
# Sub-configs that describe another modality's model: their vocab_size (a VQ codebook...) is not the text
# embedding's, and their special ids are not ours to avoid.
_OTHER_MODALITY = ("vision", "visual", "audio", "speech", "image", "video", "vq", "encoder_config")
# A text that touches many merges of any BPE vocabulary: letters, digits, punctuation and common words.
PROBE_TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs! "
    "0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 #include <stdio.h> def main(): return {'a': [1, 2]} "
    "Zephyr vexingly quizzed jumbo whiskey; xylophone, kumquat, rhythm, syzygy, cwm, fjord, zugzwang. "
    "information international government development environment university technology "
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ qu ch th sh ph wh gh ng ck ll ss tt ee oo"
)


@dataclass(frozen=True)
class Vocab:
    """Where prompt ids come from: ``[lo, hi)`` minus ``special``; ``size`` is the model's vocabulary where
    known (None when only a lower bound is), ``source`` says who told."""

    lo: int
    hi: int
    source: str
    size: int | None = None
    special: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def bounded(cls, bound: int, source: str, *, size: int | None = None,
                special: Iterable[int] = ()) -> Vocab:
        """The draw range for a vocabulary whose ids ``0..bound-1`` all exist."""
        hi = min(COMMON_RANGE[1], bound)
        lo = min(COMMON_RANGE[0], max(0, hi // 10))
        return cls(lo, hi, source, size, frozenset(s for s in special if lo <= s < hi))

    def allows(self, token_id: int) -> bool:
        """Whether ``token_id`` is known to exist (within the vocabulary where its size is known)."""
        bound = self.size if self.size is not None else self.hi
        return 0 <= token_id < bound

    def describe(self) -> str:
        size = f"vocab_size {self.size}" if self.size is not None else f"at least {self.hi} ids"
        return f"{size} from {self.source}; ids drawn from [{self.lo}, {self.hi})"


# ------------------------------------------------------------------------------------------------------------
# 1. config.json


def config_vocab_sizes(config: Mapping[str, Any], path: str = "") -> list[tuple[str, int]]:
    """Every ``vocab_size`` of a model config that belongs to the text model: (dotted key, value)."""
    found: list[tuple[str, int]] = []
    value = config.get("vocab_size")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        found.append((f"{path}vocab_size", value))
    for key, sub in config.items():
        if isinstance(sub, Mapping) and not any(word in key.lower() for word in _OTHER_MODALITY):
            found += config_vocab_sizes(sub, f"{path}{key}.")
    return found


def config_special_ids(config: Mapping[str, Any]) -> set[int]:
    """The ids a config names (``bos_token_id``, ``eos_token_id`` lists, ``image_token_index``...)."""
    ids: set[int] = set()
    for key, value in config.items():
        if key.endswith(("_token_id", "_token_ids", "_token_index")):
            values = value if isinstance(value, list) else [value]
            ids.update(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        elif isinstance(value, Mapping):
            ids |= config_special_ids(value)
    return ids


def tokenizer_special_ids(model_dir: Path) -> set[int]:
    """Added (special) tokens of the tokenizer files beside a config, where there are any."""
    ids: set[int] = set()
    try:
        data = json.loads((model_dir / "tokenizer_config.json").read_text())
        ids.update(int(k) for k in (data.get("added_tokens_decoder") or {}) if str(k).isdigit())
    except (OSError, ValueError, AttributeError):
        pass
    try:
        data = json.loads((model_dir / "tokenizer.json").read_text())
        ids.update(int(t["id"]) for t in data.get("added_tokens") or [] if isinstance(t.get("id"), int))
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        pass
    return ids


def local_model_dir(model: str | None) -> Path | None:
    """The folder holding ``config.json`` for ``model``: the path itself, or its snapshot in the local Hugging
    Face cache (``HF_HUB_CACHE``, ``HF_HOME/hub``, ``~/.cache/huggingface/hub``); None where neither has it."""
    if not model:
        return None
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return path
    if model.count("/") != 1 or path.is_absolute() or model.startswith("."):
        return None
    hub = os.environ.get("HF_HUB_CACHE") or str(Path(os.environ.get("HF_HOME") or "~/.cache/huggingface") / "hub")
    repo = Path(hub).expanduser() / ("models--" + model.replace("/", "--"))
    try:
        ref = (repo / "refs" / "main").read_text().strip()
    except OSError:
        snapshots = sorted((repo / "snapshots").glob("*/config.json")) if repo.is_dir() else []
        return snapshots[-1].parent if snapshots else None
    snap = repo / "snapshots" / ref
    return snap if (snap / "config.json").is_file() else None


def vocab_from_config(model_dir: Path) -> Vocab | None:
    """The vocabulary a model folder's ``config.json`` declares; None where it declares none."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, Mapping):
        return None
    sizes = config_vocab_sizes(config)
    if not sizes:
        return None
    key, size = min(sizes, key=lambda kv: kv[1])
    special = config_special_ids(config) | tokenizer_special_ids(model_dir)
    return Vocab.bounded(size, f"{model_dir / 'config.json'} ({key})", size=size, special=special)


# ------------------------------------------------------------------------------------------------------------
# 2. the server's /tokenize


def vocab_from_tokenize(client: Any, model: str | None) -> Vocab | None:
    """A lower bound of the vocabulary from the server's ``/tokenize`` of :data:`PROBE_TEXT` (SGLang's and
    vLLM's shape: ``{"tokens": [...], "count": n}``); None where the server has no such endpoint."""
    import requests

    body: dict[str, Any] = {"prompt": PROBE_TEXT, "add_special_tokens": False}
    if model:
        body["model"] = model
    for path in ("/tokenize", "/v1/tokenize"):
        try:
            response = client.post(path, body, timeout=30)
        except requests.RequestException:
            return None
        if response.status_code in (404, 405):
            continue
        if response.status_code != 200:
            return None
        try:
            tokens = response.json().get("tokens")
        except (ValueError, AttributeError):
            return None
        if tokens and isinstance(tokens[0], list):
            tokens = tokens[0]
        ids = [t for t in tokens or [] if isinstance(t, int) and not isinstance(t, bool) and t >= 0]
        if not ids:
            return None
        return Vocab.bounded(max(ids) + 1, f"the server's {path} (largest id of a probe text: {max(ids)})")
    return None


def learn_vocab(client: Any, model: str | None, *, served_model: str | None = None) -> Vocab | None:
    """The model's vocabulary: its local ``config.json``, else the server's ``/tokenize``, else None.

    ``model`` is the profile's model (a path or a name); where it names no local folder, the server's own
    account of its model path (SGLang's ``/server_info`` ``model_path``, the ``root`` of ``/v1/models``) is
    tried too, for a server the run attached to.
    """
    for candidate in dict.fromkeys([model, *_server_model_paths(client)]):
        folder = local_model_dir(candidate)
        if folder is not None:
            found = vocab_from_config(folder)
            if found is not None:
                return found
    return vocab_from_tokenize(client, served_model or model)


def _server_model_paths(client: Any) -> list[str]:
    paths: list[str] = []
    try:
        info = client.server_info()
    except Exception:  # noqa: BLE001 - a server that cannot tell just tells nothing
        info = None
    if info and isinstance(info.get("model_path"), str):
        paths.append(info["model_path"])
    try:
        answer = client.get("/v1/models", timeout=30).json()
        paths += [m["root"] for m in answer.get("data", []) if isinstance(m.get("root"), str)]
    except Exception:  # noqa: BLE001 - no list of models, or one without roots
        pass
    return paths
