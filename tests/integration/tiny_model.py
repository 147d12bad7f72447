"""Make a tiny random-weight Llama model and a byte-level BPE tokenizer that real SGLang and vLLM can serve.

No model can be downloaded on these machines, so the integration tests make one (about 5 s). It needs
torch, transformers, tokenizers and safetensors: run it with a server venv's python, not the test runner's:

    VENV/bin/python tests/integration/tiny_model.py OUT_DIR [--variant ok|head_dim16|corrupt|unknown_arch]

Variants, each a real fault of the real server:
  ok            hidden 128, 2 heads, 1 KV head (head_dim 64), intermediate 256, 2 layers: serves on both.
  head_dim16    hidden 64, 4 heads (head_dim 16): vLLM's CPU attention starts, then dies at the first request.
  corrupt       the ok model with a garbage safetensors header:
                "SafetensorError: Error while deserializing header".
  unknown_arch  the ok model whose config names NoSuchArchForCausalLM: SGLang cannot find a model class.
  small_vocab   the ok model with a vocabulary of SMALL_VOCAB (384) tokens: an id drawn from [1000, 30000)
                crashes real SGLang's scheduler (IndexError in the embedding) and real vLLM answers 400
                ("Token id ... is out of vocabulary"). Only printable tokens can win the greedy argmax, so
                its outputs decode to text, token by token.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VARIANTS = ("ok", "head_dim16", "corrupt", "unknown_arch", "small_vocab")
UNKNOWN_ARCH = "NoSuchArchForCausalLM"

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

VOCAB_SIZE = 32000  # like Llama's: benchmark clients draw random prompt ids from ranges such as [1000, 30000)
SMALL_VOCAB = 384  # the small_vocab variant: 3 specials, 256 bytes, 125 merges


def _bpe_vocab(size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary of ``size`` tokens: 3 specials, the 256 byte symbols, then merges of
    letters and digits (with and without a leading space, "Ġ") into 2- and 3-character tokens."""
    from tokenizers import pre_tokenizers

    vocab: dict[str, int] = {}
    for tok in ("<s>", "</s>", "<pad>", *sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab.setdefault(tok, len(vocab))
    alnum = "etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCMFWYPVBGKJQXZ0123456789"
    merges: list[tuple[str, str]] = []

    def add(a: str, b: str) -> bool:
        if a + b in vocab:
            return len(vocab) < size
        vocab[a + b] = len(vocab)
        merges.append((a, b))
        return len(vocab) < size

    firsts = ["Ġ", *alnum]
    pairs = [a + b for a in firsts for b in alnum]
    for a in firsts:
        for b in alnum:
            if not add(a, b):
                return vocab, merges
    for pair in pairs:
        for c in alnum:
            if not add(pair, c):
                return vocab, merges
    return vocab, merges


def make_tokenizer(out: Path, vocab_size: int = VOCAB_SIZE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab, merges = _bpe_vocab(vocab_size)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def make_model(out: Path, variant: str = "ok", seed: int = 0) -> Path:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(out, SMALL_VOCAB if variant == "small_vocab" else VOCAB_SIZE)
    if variant == "head_dim16":
        dims = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1}
    else:
        dims = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        intermediate_size=256,
        num_hidden_layers=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **dims,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        # A zero logit never wins a greedy argmax against 32000 random rows (their maximum is > 0): EOS and
        # the other specials never come out, so completions run to max_tokens and counts are exact.
        for special in tokenizer.all_special_ids:
            model.lm_head.weight[special].zero_()
        if variant == "small_vocab":
            # Bytes that are no character alone (UTF-8 continuations, controls) never win either: each output
            # token decodes to text of its own, so every streamed chunk carries some.
            for tid in range(len(tokenizer)):
                piece = tokenizer.decode([tid])
                if "\ufffd" in piece or not piece.strip() or not piece.isprintable():
                    model.lm_head.weight[tid].zero_()
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)  # no sampling defaults: the server's own apply

    if variant == "corrupt":
        st = out / "model.safetensors"
        data = bytearray(st.read_bytes())
        # Keep the 8-byte length, spoil the JSON header that follows it.
        data[8:40] = b"\x00garbage, not a safetensors hdr"[:32].ljust(32, b"!")
        st.write_bytes(bytes(data))
    elif variant == "unknown_arch":
        cfg_path = out / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["architectures"] = [UNKNOWN_ARCH]
        cfg_path.write_text(json.dumps(cfg, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--variant", choices=VARIANTS, default="ok")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    make_model(args.out, args.variant, args.seed)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
