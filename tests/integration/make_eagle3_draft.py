"""Make a tiny random-weight EAGLE-3 draft for SGLang 0.5.23 (LlamaForCausalLMEagle3) of a tiny target.

The project's shared reference (shared/reference/sglang-cpu-eagle3/make_eagle3_draft.py), as the project's own
code. Run it with a server venv's python (it needs torch and safetensors):

    VENV/bin/python tests/integration/make_eagle3_draft.py TARGET_DIR OUT_DIR [--const-token T]

Layout follows public EAGLE-3 checkpoints: config.json (architectures ["LlamaForCausalLMEagle3"], one layer,
the target's hidden size and heads, vocab_size = the target's, draft_vocab_size, target_hidden_size,
eagle_config.eagle_aux_hidden_state_layer_ids) and midlayer.*, fc, norm, lm_head, d2t, t2d weights; no
embed_tokens: SGLang shares the target's. Aux layer ids: SGLang captures the input of target layer id+1, so
for an L-layer target they are distinct ids in -1..L-2 ("-1,0" for the 2-layer tiny target).

--const-token T zeroes the final norm, so the draft's logits are all 0 and draft id 0 (mapped to target id T)
is always proposed: a draft that is accepted wherever the target repeats T. --const-token-of PROMPT picks T
as the token the target (run here with transformers) repeats most in its greedy output of PROMPT, so that a
request of PROMPT is known to accept drafts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file


def most_repeated_token(target: str, prompt: str, new_tokens: int = 16) -> int:
    """The token the target repeats most often in its greedy output of ``prompt``."""
    from collections import Counter

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)[0][ids.shape[1]:].tolist()
    return Counter(out).most_common(1)[0][0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("out")
    ap.add_argument("--layer-ids", default="-1,0")
    ap.add_argument("--draft-vocab", type=int, default=256)
    ap.add_argument("--const-token", type=int, default=None)
    ap.add_argument("--const-token-of", default=None, metavar="PROMPT")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--std", type=float, default=0.02)
    a = ap.parse_args()

    with open(os.path.join(a.target, "config.json")) as f:
        t = json.load(f)
    hidden, inter = t["hidden_size"], t["intermediate_size"]
    nh = t["num_attention_heads"]
    nkv = t.get("num_key_value_heads", nh)
    hd = t.get("head_dim") or hidden // nh
    vocab = t["vocab_size"]
    dv = min(a.draft_vocab, vocab)
    layer_ids = [int(x) for x in a.layer_ids.split(",")]
    n_layers = t["num_hidden_layers"]
    assert len(set(layer_ids)) == len(layer_ids), "aux layer ids must be distinct"
    assert all(-1 <= i <= n_layers - 2 for i in layer_ids), f"ids must be in -1..{n_layers - 2}"
    n_aux = len(layer_ids)
    if a.const_token_of is not None:
        a.const_token = most_repeated_token(a.target, a.const_token_of)

    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": hd,
        "hidden_act": t.get("hidden_act", "silu"),
        "rms_norm_eps": t.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": t.get("max_position_embeddings", 1024),
        "rope_parameters": t.get("rope_parameters", {"rope_theta": 10000.0, "rope_type": "default"}),
        "rope_theta": (t.get("rope_parameters") or {}).get("rope_theta", t.get("rope_theta", 10000.0)),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        "draft_vocab_size": dv,
        "target_hidden_size": hidden,
        "bos_token_id": t.get("bos_token_id", 1),
        "eos_token_id": t.get("eos_token_id", 2),
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True},
    }

    g = torch.Generator().manual_seed(a.seed)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * a.std).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    w = {
        "midlayer.self_attn.q_proj.weight": rnd(nh * hd, 2 * hidden),  # input = [embeds ; hidden]
        "midlayer.self_attn.k_proj.weight": rnd(nkv * hd, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rnd(nkv * hd, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rnd(hidden, nh * hd),
        "midlayer.mlp.gate_proj.weight": rnd(inter, hidden),
        "midlayer.mlp.up_proj.weight": rnd(inter, hidden),
        "midlayer.mlp.down_proj.weight": rnd(hidden, inter),
        "midlayer.input_layernorm.weight": ones(hidden),
        "midlayer.post_attention_layernorm.weight": ones(hidden),
        "midlayer.hidden_norm.weight": ones(hidden),
        "fc.weight": rnd(hidden, hidden * n_aux),
        "norm.weight": ones(hidden),
        "lm_head.weight": rnd(dv, hidden),
    }
    # hot vocab: dv distinct target ids, sorted; d2t[i] = target_id(i) - i
    perm = torch.randperm(vocab, generator=g)[:dv]
    if a.const_token is not None:
        perm = torch.cat([torch.tensor([a.const_token]), perm[perm != a.const_token]])[:dv]
        w["norm.weight"] = torch.zeros(hidden, dtype=torch.bfloat16)
        hot = perm  # keep the constant token at draft id 0 (the argmax of all-zero logits)
    else:
        hot = perm.sort().values
    w["d2t"] = (hot - torch.arange(dv)).to(torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    w["t2d"] = t2d

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(a.out, "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):  # not read; self-contained
        p = os.path.join(a.target, name)
        if os.path.exists(p):
            shutil.copy(p, a.out)
    print(json.dumps({"out": a.out, "const_token": a.const_token}))


if __name__ == "__main__":
    main()
