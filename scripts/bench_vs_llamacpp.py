#!/usr/bin/env python3
"""Strata against llama.cpp on the CPU, side by side (driven by scripts/bench_vs_llamacpp.sh).

Every round runs, for each model, Strata (once per `--cpu-gemm` mode asked for: `llama`, the
default kernels, and `tiles`, the exact-block prompt products), then llama.cpp with flash
attention off, then on, then off with `use_mmap=False` (weights read into RAM, as Strata does
by default), each in its own process with the same threads, prompt tokens and test
sizes: pp = one
evaluation of PP prompt tokens on an empty cache, tg = TG greedy single-token steps after an
8-token prompt, both after a warm-up. Rounds interleave the engines (A B C A B C ...) so the
VM's drift hits all of them alike. Printed: each round's figures and Strata's ratio to the
best llama.cpp setting, then per model the medians, the lowest ratios, peak RSS and the
share of the memory roofline both engines reach (bytes read per decode token, from Strata's
`bench --roofline`, over this machine's read bandwidth measured in the same run).
"""
import argparse
import json
import statistics
import subprocess
import sys

# The peer's side: the same measurement through llama-cpp-python's low-level eval.
LLAMA = r"""
import json, resource, sys, time
import numpy as np
from llama_cpp import Llama
model, threads, fa, npp, ntg = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4]), int(sys.argv[5])
toks = [int(t) for t in sys.argv[6].split(",")]
mmap = sys.argv[7] == "1"
llm = Llama(model_path=model, n_ctx=max(npp, ntg + 8) + 16, n_batch=npp, n_ubatch=npp,
            n_threads=threads, n_threads_batch=threads, flash_attn=fa, use_mmap=mmap, verbose=False)
def pp():
    llm.reset(); t = time.perf_counter(); llm.eval(toks); return npp / (time.perf_counter() - t)
def tg():
    llm.reset(); llm.eval(toks[:8]); t = time.perf_counter()
    for _ in range(ntg):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    return ntg / (time.perf_counter() - t)
pp(); tg()
print(json.dumps({"pp": pp(), "tg": tg(), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


# (flash attention, mmap) of each llama.cpp run per round and model.
PEER_SETTINGS = [("0", "1"), ("1", "1"), ("0", "0")]


def prompt_tokens(n_vocab, n, bos):
    """Strata's bench prompt: ids spread over the vocabulary, BOS first."""
    toks = [max((i * 2654435761 % 2**32) % n_vocab, 3) for i in range(n)]
    if bos is not None:
        toks[0] = bos
    return toks


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", required=True)
    ap.add_argument("--python", required=True, help="the venv's python with llama_cpp")
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--cpu-gemm", default="llama,tiles", help="Strata's --cpu-gemm modes to run, comma separated")
    a = ap.parse_args()
    modes = a.cpu_gemm.split(",")

    info = {}
    for m in a.models:
        r = run_json([a.strata, "bench", "-m", m, "--threads", str(a.threads), "--pp", "8", "--tg", str(a.tg),
                      "--reps", "1", "--json", "--roofline"])
        info[m] = {"roofline": r["roofline"], "n_vocab": r["n_vocab"], "bos": r["bos"]}
    rows = {(m, g): [] for m in a.models for g in modes}
    for rnd in range(1, a.rounds + 1):
        for m in a.models:
            ss = {g: run_json([a.strata, "bench", "-m", m, "--threads", str(a.threads), "--pp", str(a.pp),
                               "--tg", str(a.tg), "--reps", "1", "--json", "--cpu-gemm", g]) for g in modes}
            toks = ",".join(map(str, prompt_tokens(info[m]["n_vocab"], a.pp, info[m]["bos"])))
            # llama.cpp: flash attention off, on, and off with the weights read into RAM
            # (`--no-mmap`, as Strata does by default).
            ll = [run_json([a.python, "-c", LLAMA, m, str(a.threads), fa, str(a.pp), str(a.tg), toks, mm]) for fa, mm in PEER_SETTINGS]
            name = m.rsplit("/", 1)[-1]
            line = []
            for g, s in ss.items():
                row = {"pp": s["pp_median"], "tg": s["tg_median"], "rss": s["peak_rss_mb"],
                       "l_pp": [x["pp"] for x in ll], "l_tg": [x["tg"] for x in ll], "l_rss": max(x["rss_mb"] for x in ll)}
                row["pp_ratio"] = row["pp"] / max(row["l_pp"])
                row["tg_ratio"] = row["tg"] / max(row["l_tg"])
                rows[(m, g)].append(row)
                line.append(f"strata {g} pp{a.pp} {row['pp']:.1f} tg{a.tg} {row['tg']:.1f} (ratio pp {row['pp_ratio']:.2f}x tg {row['tg_ratio']:.2f}x)")
            print(f"round {rnd} {name}: " + " | ".join(line) + f" | llama.cpp FA off {ll[0]['pp']:.1f} / {ll[0]['tg']:.1f}, "
                  f"FA on {ll[1]['pp']:.1f} / {ll[1]['tg']:.1f}, no-mmap {ll[2]['pp']:.1f} / {ll[2]['tg']:.1f}", flush=True)
    print()
    print(f"{'model':<42} {'gemm':<6} {'strata pp':>9} {'llama pp':>9} {'ratio':>11} {'strata tg':>9} {'llama tg':>9} {'ratio':>11} {'RSS MB s/l':>12} {'roofline share s/l':>19}")
    ok = {g: True for g in modes}
    for (m, g), rs in rows.items():
        med = lambda k: statistics.median(r[k] for r in rs)
        l_pp = statistics.median(max(r["l_pp"]) for r in rs)
        l_tg = statistics.median(max(r["l_tg"]) for r in rs)
        pr = [r["pp_ratio"] for r in rs]
        tr = [r["tg_ratio"] for r in rs]
        rl = info[m]["roofline"]
        share = lambda tg: tg * rl["decode_bytes_per_token"] / (rl["read_gb_s"] * 1e9)
        ok[g] &= min(pr) >= 1.2 and min(tr) >= 1.2
        print(f"{m.rsplit('/', 1)[-1]:<42} {g:<6} {med('pp'):>9.1f} {l_pp:>9.1f} {statistics.median(pr):>5.2f}x>{min(pr):.2f} "
              f"{med('tg'):>9.1f} {l_tg:>9.1f} {statistics.median(tr):>5.2f}x>{min(tr):.2f} "
              f"{max(r['rss'] for r in rs):>5.0f}/{max(r['l_rss'] for r in rs):<6.0f} "
              f"{100 * share(med('tg')):>8.1f}%/{100 * share(l_tg):.1f}%")
    first = next(iter(info.values()))["roofline"]
    print(f"(ratio: median>lowest of the rounds, against llama.cpp's best setting (FA off, on, no-mmap); memory read {first['read_gb_s']:.1f} GB/s; "
          f"bytes per decode token: " + ", ".join(f"{m.rsplit('/', 1)[-1]} {info[m]['roofline']['decode_bytes_per_token'] / 1e6:.1f} MB" for m in a.models) + ")")
    for g in modes:
        print(f"target (>= 1.2x in every round, both phases, every model), --cpu-gemm {g}:", "met" if ok[g] else "NOT met")


if __name__ == "__main__":
    sys.exit(main())
