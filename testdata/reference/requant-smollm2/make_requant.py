"""Real weights in every llama.cpp quantization the engine reads: SmolLM2-135M-Instruct
requantized by llama.cpp's own quantizer, and llama.cpp's logits on each file.

usage: python make_requant.py SOURCE.gguf OUT_DIR [TYPE...]
Run with the llama-cpp-python venv (scripts/llamacpp-venv.sh). For each TYPE (default: all of
TYPES) writes OUT_DIR/TYPE.gguf, OUT_DIR/TYPE.logits.npy (f32 [n_tokens][n_vocab], every
position of PROMPT in one batch), OUT_DIR/TYPE.single.npy (the same, one token a call) and records in OUT_DIR/index.json the prompt ids, the tensor types
and the sha256 of every quantized tensor as gguf-py dequantizes it.
Idempotent: a type whose outputs exist is kept.

SmolLM2's rows are 576 wide, not a multiple of 256, so llama.cpp writes the K/IQ types only
where the row allows (ffn_down, 1536 wide) and its own fallback elsewhere (Q4_0/Q5_0/Q5_1/Q8_0/
IQ4_NL): the file is what a user downloading this quantization would get.
"""
import ctypes, hashlib, json, os, sys

import gguf
from gguf import GGMLQuantizationType as T
import numpy as np
import llama_cpp
from llama_cpp import Llama

# The types issue 36 names (llama.cpp's ftype names), each a real published quantization, and
# Q2_K with llama.cpp's `pure` flag: its Q2_K mix puts ffn_down in Q3_K, so only the pure file
# holds Q2_K tensors. (IQ2_*/IQ1_* need an importance matrix, which this API cannot pass.)
TYPES = ["Q2_K", "Q2_K-pure", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "IQ3_S", "IQ3_M", "IQ4_XS"]
PROMPT = (
    "Photosynthesis is the process by which green plants and certain other organisms transform "
    "light energy into chemical energy. During photosynthesis in green plants, light energy is "
    "captured and used to convert water, carbon dioxide, and minerals into oxygen and "
    "energy-rich organic compounds. It would be impossible to overestimate the importance of "
    "photosynthesis in the maintenance of life on Earth. If photosynthesis ceased, there would "
    "soon be little food or other organic matter on Earth. Most organisms would disappear, and "
    "in time Earth's atmosphere would become nearly devoid of gaseous oxygen."
)


def tensors(path):
    """{ggml type name: tensor count}, and {tensor name: sha256 of its float32 dequantization by
    gguf-py's numpy `gguf.quants`} for every quantized tensor (Strata must match byte for byte)."""
    counts, digests = {}, {}
    for t in gguf.GGUFReader(path).tensors:
        name = t.tensor_type.name.lower().replace("_k", "_K")
        counts[name] = counts.get(name, 0) + 1
        if t.tensor_type not in (T.F32, T.F16, T.BF16):
            deq = gguf.quants.dequantize(t.data, t.tensor_type).astype("<f4", copy=False)
            digests[t.name] = hashlib.sha256(deq.tobytes()).hexdigest()
    return counts, digests


def quantize(src, dst, name):
    """`name` is an ftype (`Q3_K_M`), or one with `-pure` (every tensor the ftype's base type)."""
    ftype_name, pure = name.removesuffix("-pure"), name.endswith("-pure")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
    params.pure = pure
    params.nthread = 2
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize {name}: error {rc}")


def main():
    src, out = sys.argv[1], sys.argv[2]
    types = sys.argv[3:] or TYPES
    os.makedirs(out, exist_ok=True)
    index_path = os.path.join(out, "index.json")
    index = json.load(open(index_path)) if os.path.exists(index_path) else {"types": {}}
    index["source"] = os.path.basename(src)
    index["prompt"] = PROMPT
    index["llama_cpp_python"] = llama_cpp.__version__
    for t in types:
        gguf_path, npy = os.path.join(out, f"{t}.gguf"), os.path.join(out, f"{t}.logits.npy")
        single = os.path.join(out, f"{t}.single.npy")
        if t in index["types"] and all(os.path.exists(p) for p in (gguf_path, npy, single)):
            continue
        quantize(src, gguf_path, t)
        # The prompt in one batch (the reference), and token by token: llama.cpp's own spread
        # between its batched and single-token kernels, the scale the tests judge Strata's by.
        for n_batch, path in [(512, npy), (1, single)]:
            llm = Llama(model_path=gguf_path, n_ctx=256, n_batch=n_batch, n_threads=2, logits_all=True, verbose=False, seed=0)
            ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
            for i in range(0, len(ids), n_batch):
                llm.eval(ids[i : i + n_batch])
            np.save(path, np.array(llm.scores[: len(ids)], dtype=np.float32))
            del llm
        index["prompt_ids"] = ids
        counts, digests = tensors(gguf_path)
        index["types"][t] = {"tensor_types": counts, "n_tokens": len(ids), "dequant_sha256": digests}
        json.dump(index, open(index_path, "w"), indent=1)
        print(f"{t}: {index['types'][t]['tensor_types']}", flush=True)


if __name__ == "__main__":
    main()
