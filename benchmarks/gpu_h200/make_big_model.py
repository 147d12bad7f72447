"""Make a random-weight Llama of a few billion parameters for the GPU-bound A/B (run_h200.sh GB), fast: the
weights are drawn on the GPU straight into a safetensors file (LlamaForCausalLM's own init of 3B parameters
on the host's CPUs takes minutes), the names and shapes taken from the model built on the meta device. The
tokenizer is make_model.py's (32000-token byte-level BPE trained on a synthetic corpus).

usage: python3 make_big_model.py TARGET_DIR [--hidden 3072 --intermediate 8192 --layers 28 --heads 24
       --kv-heads 8]   (the defaults: 3.0B parameters, 6 GB in bf16)
Needs torch (CUDA), transformers (5.x), tokenizers, safetensors. No network.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def tokenizer(out: str) -> int:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    corpus = [" ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
                       for _ in range(50)) for _ in range(20000)]
    trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    ht = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    ht.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    ht.save_pretrained(out)
    return len(ht)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=3072)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=8)
    args = ap.parse_args()
    t0 = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    vocab = tokenizer(args.out)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                      max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=False)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(cfg).state_dict().items()}
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a small trial off the GPU host
    gen = torch.Generator(device=device).manual_seed(0)
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            w = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02
            weights[name] = w.to(torch.bfloat16).cpu()
    save_file(weights, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    cfg.dtype = "bfloat16"
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(args.out)
    params = sum(int(torch.tensor(s).prod()) for s in shapes.values())
    print(json.dumps({"target": args.out, "params_b": round(params / 1e9, 3), "vocab": vocab,
                      "hidden": args.hidden, "intermediate": args.intermediate, "layers": args.layers,
                      "heads": args.heads, "kv_heads": args.kv_heads, "seconds": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    main()
