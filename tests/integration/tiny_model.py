"""Make a tiny random-weight Llama model and a byte-level BPE tokenizer that real SGLang and vLLM can serve.

No model can be downloaded on these machines, so the integration tests make one (about 5 s). It needs
torch, transformers, tokenizers and safetensors: run it with a server venv's python, not the test runner's:

    VENV/bin/python tests/integration/tiny_model.py OUT_DIR [--variant ok|head_dim16|corrupt|unknown_arch]

Variants, each a real fault of the real server:
  ok            hidden 128, 2 heads, 1 KV head (head_dim 64), intermediate 256, 2 layers: serves on both.
  head_dim16    hidden 64, 4 heads (head_dim 16): vLLM's CPU attention starts, then dies at the first request.
  corrupt       the ok model with a garbage safetensors header: "SafetensorError: Error while deserializing header".
  unknown_arch  the ok model whose config names NoSuchArchForCausalLM: SGLang cannot find a model class.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VARIANTS = ("ok", "head_dim16", "corrupt", "unknown_arch")
UNKNOWN_ARCH = "NoSuchArchForCausalLM"

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_CORPUS = [
    "The capital city of France is Paris, and the capital of Italy is Rome.",
    "A quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Inference servers answer completions, chat completions and streamed tokens.",
    "Once upon a time there was a tiny model that could only say random things.",
    "pytest launches the server once per session and checks that it answers.",
    "Hello, world! How are you today? I am fine, thank you very much.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000; symbols: + - * / = < > ( ) [ ] { }",
    "def main():\n    print('hello')\n    return 0\n",
]


def make_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
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
    tokenizer = make_tokenizer(out)
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
        # A zero logit for EOS never wins a greedy argmax against random rows (their maximum is > 0), so
        # completions run to max_tokens and token counts are exact even without ignore_eos.
        model.lm_head.weight[tokenizer.eos_token_id].zero_()
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--variant", choices=VARIANTS, default="ok")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    make_model(args.out, args.variant, args.seed)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
