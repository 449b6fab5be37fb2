"""Real weights in every llama.cpp quantization the engine reads: SmolLM2-135M-Instruct
requantized by llama.cpp's own quantizer, and llama.cpp's logits on each file.

usage: python make_requant.py SOURCE.gguf OUT_DIR [TYPE...]
Run with the llama-cpp-python venv (scripts/llamacpp-venv.sh). For each TYPE (default: all of
TYPES) writes OUT_DIR/TYPE.gguf, OUT_DIR/TYPE.logits.npy (f32 [n_tokens][n_vocab], every
position of PROMPT in one batch), OUT_DIR/TYPE.single.npy (the same, one token a call) and records the prompt ids and the tensor types in OUT_DIR/index.json.
Idempotent: a type whose outputs exist is kept.

SmolLM2's rows are 576 wide, not a multiple of 256, so llama.cpp writes the K/IQ types only
where the row allows (ffn_down, 1536 wide) and its own fallback elsewhere (Q4_0/Q5_0/Q5_1/Q8_0/
IQ4_NL): the file is what a user downloading this quantization would get.
"""
import ctypes, json, os, sys
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
GGML_TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
                   10: "q2_K", 11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 16: "iq2_xxs",
                   17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl", 21: "iq3_s",
                   22: "iq2_s", 23: "iq4_xs", 29: "iq1_m", 30: "bf16"}


def tensor_types(path):
    """{ggml type name: tensor count} of a GGUF, from its header (the venv has no gguf-py)."""
    import struct
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]
        def rstr():
            return f.read(rd("Q")).decode()
        def skip_value(t):
            sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
            if t == 8:
                rstr()
            elif t == 9:
                et, n = rd("I"), rd("Q")
                for _ in range(n):
                    skip_value(et)
            else:
                f.read(sizes[t])
        assert f.read(4) == b"GGUF"
        rd("I")
        n_tensors, n_kv = rd("Q"), rd("Q")
        for _ in range(n_kv):
            rstr()
            skip_value(rd("I"))
        counts = {}
        for _ in range(n_tensors):
            rstr()
            n_dims = rd("I")
            for _ in range(n_dims):
                rd("Q")
            t = rd("I")
            rd("Q")
            name = GGML_TYPE_NAMES.get(t, f"type{t}")
            counts[name] = counts.get(name, 0) + 1
        return counts


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
        gguf, npy = os.path.join(out, f"{t}.gguf"), os.path.join(out, f"{t}.logits.npy")
        single = os.path.join(out, f"{t}.single.npy")
        if t in index["types"] and all(os.path.exists(p) for p in (gguf, npy, single)):
            continue
        quantize(src, gguf, t)
        # The prompt in one batch (the reference), and token by token: llama.cpp's own spread
        # between its batched and single-token kernels, the scale the tests judge Strata's by.
        for n_batch, path in [(512, npy), (1, single)]:
            llm = Llama(model_path=gguf, n_ctx=256, n_batch=n_batch, n_threads=2, logits_all=True, verbose=False, seed=0)
            ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
            for i in range(0, len(ids), n_batch):
                llm.eval(ids[i : i + n_batch])
            np.save(path, np.array(llm.scores[: len(ids)], dtype=np.float32))
            del llm
        index["prompt_ids"] = ids
        index["types"][t] = {"tensor_types": tensor_types(gguf), "n_tokens": len(ids)}
        json.dump(index, open(index_path, "w"), indent=1)
        print(f"{t}: {index['types'][t]['tensor_types']}", flush=True)


if __name__ == "__main__":
    main()
