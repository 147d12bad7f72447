"""sgl_kernel stand-in for SGLang's speculative decoding on a CPU (the EAGLE3 profile of test_measurement.py).

Copied from the project's shared reference (shared/reference/sglang-cpu-eagle3/sgl_kernel_with_spec_ops.py,
zip() calls made strict=False for the linter). Put its parent folder on the SGLang server's PYTHONPATH.

Import-only sgl_kernel stand-in (as in the CPU recipe)
PLUS pure-torch versions of the CPU ops SGLang 0.5.23's EAGLE/EAGLE3 path calls on
CPU (normally from the sgl-kernel CPU build, which is not on PyPI).

Semantics are transcribed from the Triton kernels of the same name in
sglang/kernels/ops/{kvcache/cache_move.py, speculative/*.py, ...} and
sglang/srt/mem_cache/allocation.py. Slow (python loops), fine for tiny models.
Every other attribute is still a stub that raises if called.
"""
import ctypes
import os
import sys

import torch

__version__ = "0.0.0+cpu-shim-spec"

_SEEN = set()


def _note(name):
    if name not in _SEEN:
        _SEEN.add(name)
        print(f"[sgl_kernel_spec_ext] first call: {name}", file=sys.stderr, flush=True)


def _make_stub(name):
    def _stub(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available: CPU sgl-kernel ops are not installed (shim)"
        )

    _stub.__name__ = name
    return _stub


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _make_stub(name)


# ---------------------------------------------------------------- KV cache copy
def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every KV buffer b (raw base pointer data_ptrs[b], slot size strides[b]
    bytes): row[tgt_loc[j]] = row[src_loc[j]] (gather first: in-place safe)."""
    _note("copy_all_layer_kv_cache_cpu")
    n = int(tgt_loc.numel())
    if n == 0:
        return
    tgt = tgt_loc.to(torch.int64).cpu()
    src = src_loc.to(torch.int64).cpu()
    rows = int(max(int(tgt.max()), int(src.max()))) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=False):
        stride = int(stride)
        buf = (ctypes.c_uint8 * (rows * stride)).from_address(int(ptr))
        view = torch.frombuffer(buf, dtype=torch.uint8).view(rows, stride)
        view[tgt] = view[src].clone()


# ---------------------------------------------------------------- cache locs
def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len=None):
    _note("assign_req_to_token_pool_cpu")
    off = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=False):
        ln = e - s
        if ln > 0:
            req_to_token[r, s:e] = out_cache_loc[off:off + ln].to(req_to_token.dtype)
        off += max(ln, 0)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len=None):
    _note("assign_extend_cache_locs_cpu")
    off = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=False):
        ln = e - s
        if ln > 0:
            out_cache_loc[off:off + ln] = req_to_token[r, s:e].to(out_cache_loc.dtype)
        off += max(ln, 0)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens,
                                           out_cache_loc, pool_len, topk, num_cols):
    _note("assign_draft_cache_locs_contiguous_cpu")
    n = topk * num_cols
    for i, (r, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=False)):
        out_cache_loc[i * n:(i + 1) * n] = req_to_token[r, s:s + n].to(out_cache_loc.dtype)


# ---------------------------------------------------------------- eagle.py
def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    _note("fill_bonus_tokens_cpu")
    flat = accept_tokens.reshape(-1)
    for i, a in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[accept_stride * i + a - 1]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    _note("fill_accept_out_cache_loc_cpu")
    idx = accept_index.reshape(-1)
    keep = idx[idx != -1].to(torch.int64)
    accept_out_cache_loc[: keep.numel()] = out_cache_loc[keep].to(accept_out_cache_loc.dtype)


# ---------------------------------------------------------------- spec_tree.py
def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask,
                                    positions, retrive_index, retrive_next_token,
                                    retrive_next_sibling, topk, depth, draft_token_num,
                                    tree_mask_mode):
    """Transcription of sgl_build_tree_kernel_efficient_triton (modes 0 and 1)."""
    _note("build_tree_kernel_efficient_cpu")
    mode = int(tree_mask_mode)
    if mode == 2:
        raise NotImplementedError("QLEN_ONLY_BITPACKING not implemented in shim")
    bs = verified_seq_len.shape[0]
    pl = parent_list.reshape(bs, -1).tolist()
    si = selected_index.reshape(bs, -1).tolist()
    seq = verified_seq_len.tolist()
    prefix = 0
    tm = tree_mask.view(-1)
    ri = retrive_index.view(-1)
    rn = retrive_next_token.view(-1)
    rs = retrive_next_sibling.view(-1)
    pos = positions.view(-1)
    D = draft_token_num
    for b in range(bs):
        seq_len = int(seq[b])
        seq_tree_idx = D * D * b + prefix * D
        pos[b * D] = seq_len
        base = b * D
        for i in range(D - 1, 0, -1):
            ri[base + i] = base + i
            parent_tb_idx = si[b][i - 1] // topk
            parent_position, found = 0, False
            if parent_tb_idx == 0:
                found = True
            else:
                parent_token_idx = pl[b][parent_tb_idx]
                for pp in range(D - 1):
                    if si[b][pp] == parent_token_idx:
                        parent_position, found = pp + 1, True
                        break
            if found:
                nt = int(rn[base + parent_position])
                rn[base + parent_position] = i
                if nt != -1:
                    rs[base + i] = nt
        ri[base] = base
        for x in range(D):
            if mode == 0:
                tti = seq_tree_idx + (seq_len + D) * x + seq_len + 1
            else:
                tti = D * D * b + D * x + 1
            tm[tti - 1] = True
            for i in range(D - 1):
                tm[tti + i] = False
            if x > 0:
                cur, position = x - 1, 0
                for _ in range(depth):
                    position += 1
                    tm[tti + cur] = True
                    ptb = si[b][cur] // topk
                    if ptb == 0:
                        break
                    ptok = pl[b][ptb]
                    for cp in range(D - 1):
                        if si[b][cp] == ptok:
                            cur = cp
                            break
                    else:
                        break
                pos[b * D + x] = position + seq_len
        prefix += seq_len


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict, *a, **k):
    """Transcription of verify_tree_greedy_kernel_triton."""
    _note("verify_tree_greedy_cpu")
    bs, D = candidates.shape
    S = accept_index.shape[1]
    cand = candidates.tolist()
    ri = retrive_index.reshape(bs, D).tolist()
    rn = retrive_next_token.reshape(bs, D).tolist()
    rs = retrive_next_sibling.reshape(bs, D).tolist()
    tp = target_predict.reshape(-1).tolist()
    pred = predicts.view(-1)
    for b in range(bs):
        last = ri[b][0]
        accept_index[b, 0] = last
        n_acc, cur = 0, 0
        for _j in range(1, S):
            cur = rn[b][cur]
            target_token = tp[last]
            matched = False
            while cur != -1:
                if cand[b][cur] == target_token:
                    pred[last] = target_token
                    n_acc += 1
                    accept_index[b, n_acc] = ri[b][cur]
                    last = ri[b][cur]
                    matched = True
                    break
                cur = rs[b][cur]
            if not matched:
                break
        accept_token_num[b] = n_acc
        pred[last] = tp[last]


# ---------------------------------------------------------------- intel_amx attention
# SGLang's DraftBackendFactory only allows EAGLE with backends in its map; on CPU
# that is "intel_amx", whose kernels come from torch.ops.sgl_kernel.*. These are
# plain-torch reference versions (float32 math, one request at a time).
def _attend(q, k, v, scaling, logit_cap, causal_offset=None):
    """q [Tq,H,D], k/v [Tk,Hkv,D] -> [Tq,H,Dv]; causal_offset: query i sees keys <= offset+i."""
    H, Hkv = q.shape[1], k.shape[1]
    if H != Hkv:
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    qf, kf, vf = q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1)
    s = torch.matmul(qf, kf.transpose(1, 2)) * scaling  # [H,Tq,Tk]
    if logit_cap and logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    if causal_offset is not None:
        Tq, Tk = q.shape[0], k.shape[0]
        qi = torch.arange(Tq).unsqueeze(1) + causal_offset
        kj = torch.arange(Tk).unsqueeze(0)
        s = s.masked_fill((kj > qi).unsqueeze(0), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, vf).transpose(0, 1)  # [Tq,H,Dv]


# SGL_SHIM_ATTN=sdpa (default): same per-request scaled_dot_product_attention calls
# as SGLang's torch_native backend (bf16), so results track a torch_native run.
# SGL_SHIM_ATTN=fp32: explicit float32 softmax(QK^T)V.
_MODE = os.environ.get("SGL_SHIM_ATTN", "sdpa")


def _sdpa(q_hld, k_hld, v_hld, scaling, causal):
    from torch.nn.functional import scaled_dot_product_attention
    k_hld, v_hld = k_hld.to(q_hld.dtype), v_hld.to(q_hld.dtype)
    return scaled_dot_product_attention(q_hld.unsqueeze(0), k_hld.unsqueeze(0), v_hld.unsqueeze(0),
                                        enable_gqa=q_hld.shape[0] != k_hld.shape[0],
                                        scale=scaling, is_causal=causal).squeeze(0)


def decode_attention_cpu(q, k_buffer, v_buffer, k_scale, v_scale, o, k_new, v_new, cache_loc,
                         attn_logits, req_to_token, req_pool_indices, seq_lens, scaling,
                         logit_cap, is_cross, window, encoder_lens=None, sinks=None):
    _note("torch.ops.sgl_kernel.decode_attention_cpu")
    if sinks is not None:
        raise NotImplementedError("sinks not supported in shim")
    Hkv, D = k_buffer.shape[-2], k_buffer.shape[-1]
    if k_new is not None and v_new is not None:
        loc = cache_loc.to(torch.int64)
        k_buffer[loc] = k_new.reshape(-1, Hkv, D).to(k_buffer.dtype)
        v_buffer[loc] = v_new.reshape(-1, Hkv, v_buffer.shape[-1]).to(v_buffer.dtype)
    for b, (r, L) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=False)):
        idx = req_to_token[r, :L].to(torch.int64)
        if window and window > 0:
            idx = idx[-window:]
        if _MODE == "sdpa":
            out = _sdpa(q[b:b + 1].movedim(0, 1), k_buffer[idx].movedim(0, 1),
                        v_buffer[idx].movedim(0, 1), scaling, False).movedim(1, 0)
            o[b] = out[0].to(o.dtype)
            continue
        out = _attend(q[b:b + 1], k_buffer[idx].float() * (k_scale or 1.0),
                      v_buffer[idx].float() * (v_scale or 1.0), scaling, logit_cap)
        o[b] = out[0].to(o.dtype)


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale,
                         v_scale, req_to_token, req_pool_indices, seq_lens, extend_seq_lens,
                         extend_start_loc, max_len_extend, scaling, logit_cap, is_cross,
                         window, encoder_lens=None, sinks=None, tree_mask=None, is_causal=True):
    _note("torch.ops.sgl_kernel.extend_attention_cpu")
    if sinks is not None or tree_mask is not None or is_cross:
        raise NotImplementedError("sinks / tree_mask / cross-attn not supported in shim")
    Hkv, D = k_buffer.shape[-2], k_buffer.shape[-1]
    for r, L, E, S in zip(req_pool_indices.tolist(), seq_lens.tolist(),
                          extend_seq_lens.tolist(), extend_start_loc.tolist(), strict=False):
        P = L - E
        if window and window > 0:
            raise NotImplementedError("sliding window not supported in shim")
        if _MODE == "sdpa" and k_extend is not None:
            pidx = req_to_token[r, :P].to(torch.int64)
            k = torch.cat([k_buffer[pidx], k_extend.reshape(-1, Hkv, D)[S:S + E].to(k_buffer.dtype)])
            v = torch.cat([v_buffer[pidx],
                           v_extend.reshape(-1, Hkv, v_buffer.shape[-1])[S:S + E].to(v_buffer.dtype)])
            qr = q_extend.new_zeros((q_extend.shape[1], L, q_extend.shape[2]))
            qr[:, P:, :] = q_extend[S:S + E].movedim(0, 1)
            out = _sdpa(qr, k.movedim(0, 1), v.movedim(0, 1), scaling, bool(is_causal)).movedim(1, 0)
            o_extend[S:S + E] = out[P:].to(o_extend.dtype)
            continue
        pidx = req_to_token[r, :P].to(torch.int64)
        kp, vp = k_buffer[pidx].float() * (k_scale or 1.0), v_buffer[pidx].float() * (v_scale or 1.0)
        if k_extend is not None:
            ke = k_extend.reshape(-1, Hkv, D)[S:S + E].float()
            ve = v_extend.reshape(-1, Hkv, v_buffer.shape[-1])[S:S + E].float()
        else:
            eidx = req_to_token[r, P:L].to(torch.int64)
            ke, ve = k_buffer[eidx].float(), v_buffer[eidx].float()
        k, v = torch.cat([kp, ke]), torch.cat([vp, ve])
        out = _attend(q_extend[S:S + E], k, v, scaling, logit_cap,
                      causal_offset=P if is_causal else None)
        if window and window > 0:
            raise NotImplementedError("sliding window not supported in shim")
        o_extend[S:S + E] = out.to(o_extend.dtype)


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps,
                                    pool_len):
    """Row b*topk+k = prefix of req b, then that candidate's num_steps draft slots
    (the contiguous topk*num_steps block assigned after seq_len)."""
    _note("build_draft_decode_metadata_cpu")
    bs = seq_lens.shape[0]
    out = torch.zeros((bs * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for b, (r, L) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=False)):
        for k in range(topk):
            row = out[b * topk + k]
            row[:L] = req_to_token[r, :L]
            s = L + k * num_steps
            row[L:L + num_steps] = req_to_token[r, s:s + num_steps]
    return out


torch.ops.sgl_kernel.decode_attention_cpu = decode_attention_cpu
torch.ops.sgl_kernel.extend_attention_cpu = extend_attention_cpu
