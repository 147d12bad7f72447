"""Make a Llama-shaped model with random weights, and a copy of it whose config.json is corrupt.

    python benchmarks/gpu_h200/make_tf_model.py OUT_DIR [--small] [--device cuda]

OUT_DIR/llama-random: hidden 2048, 16 layers, 32 heads, 8 KV heads, bfloat16, random weights, and a byte-level
BPE tokenizer trained on a few sentences (its vocabulary is the model's). No EOS token is configured, so a
server generates exactly max_tokens and a benchmark needs no `ignore_eos` field. The output layer's rows for
tokens that stream as no text (specials, lone UTF-8 continuation bytes) are zero, so greedy decoding skips them.
OUT_DIR/llama-broken-config: the same tokenizer and weights, config.json cut off mid-file.
``--small`` makes a 2-layer, hidden-256 model for a CPU rehearsal of the same flow.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

SENTENCES = [
    "The server is fired up and ready to roll.",
    "Load weight begin, then the KV cache is allocated and CUDA graphs are captured.",
    "A benchmark sends many requests at once and counts the tokens that come back.",
    "Output token throughput is the number of generated tokens divided by the duration.",
    "Time to first token is measured from the request to the first streamed token.",
    "The quick brown fox jumps over the lazy dog while the model writes random text.",
    "Integration tests launch the server once per session and fail fast on a crash.",
    "Hopper GPUs have high bandwidth memory and fast matrix units for bfloat16 work.",
]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(out: Path) -> tuple[int, list[int]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<unk>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # ids a server would stream as nothing: special tokens (skipped when decoding) and lone bytes of multi-byte
    # UTF-8 characters (a text streamer holds "\ufffd" back until the character completes, which it never does)
    silent = [i for i in range(len(fast)) if i in fast.all_special_ids or "\ufffd" in fast.decode([i])]
    return len(fast), silent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    t0 = time.perf_counter()
    root = Path(a.out_dir)
    good, broken = root / "llama-random", root / "llama-broken-config"
    for d in (good, broken):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    vocab, silent = make_tokenizer(good)
    shape = (dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2) if a.small else
             dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8))
    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=4096, rope_theta=10000.0,
                         bos_token_id=None, eos_token_id=None, pad_token_id=1, tie_word_embeddings=False,
                         torch_dtype="bfloat16", **shape)
    torch.manual_seed(0)
    device = a.device if torch.cuda.is_available() or a.device == "cpu" else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    # Random weights pick any token; with greedy decoding a prompt can lock onto one that streams as nothing
    # (seen in a CPU rehearsal: 64 tokens, usage counted, not one text chunk). Their logits are zero, so they are
    # never the argmax of the hundreds of random ones.
    with torch.no_grad():
        model.lm_head.weight[silent] = 0
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=None, pad_token_id=1,
                                               do_sample=False)
    model.save_pretrained(good, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())

    for f in good.iterdir():
        if f.name != "config.json":
            os.symlink(f, broken / f.name)
    text = (good / "config.json").read_text()
    (broken / "config.json").write_text(text[: len(text) // 2])  # cut off mid-file: invalid JSON

    info = {"model_dir": str(good), "broken_dir": str(broken), "params": n_params, "vocab_size": vocab,
            "silent_tokens_zeroed": len(silent),
            "shape": shape, "dtype": "bfloat16", "made_on": device, "seconds": round(time.perf_counter() - t0, 1),
            "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
