#!/usr/bin/env python3
"""Prompt reuse, measured: a chat's second turn sent to the same `strata --serve` process
against the same turn sent to a fresh one, side by side in one run (docs/server.md, "Prompt
reuse"). Prints each turn's prompt time (the done line's `prompt_ms`: request read → first
token) and `prompt_cached_tokens`.

usage: scripts/bench_prompt_reuse.py [--strata target/release/strata] [--model M]
       [--turn1 N] [--answer N] [--new N] [--rounds R] [engine args after --]
Turn 1 is N token ids of real text (the model's own tokenizer via `strata tokenize`), the
answer is the engine's greedy continuation, turn 2 appends --new more ids of text.
"""
import argparse, json, subprocess, sys

TEXT = ("Photosynthesis is the process by which green plants and certain other organisms "
        "transform light energy into chemical energy. ") * 200


class Serve:
    def __init__(self, cmd):
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        self.id = 0

    def request(self, tokens, max_tokens):
        self.id += 1
        req = {"type": "generate", "id": self.id, "tokens": tokens, "max_tokens": max_tokens,
               "sampling": {"temperature": 0.0}, "stop_tokens": []}
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        ids = []
        for line in self.p.stdout:
            v = json.loads(line)
            if v.get("id") != self.id:
                continue
            if v["type"] == "token":
                ids.append(v["token"])
            elif v["type"] == "done":
                if v.get("reason") == "error":
                    sys.exit(f"engine error: {v.get('error')}")
                return ids, v
        sys.exit("the engine closed its output")

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="target/release/strata")
    ap.add_argument("--model", default=None)
    ap.add_argument("--turn1", type=int, default=1000)
    ap.add_argument("--answer", type=int, default=16)
    ap.add_argument("--new", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("engine_args", nargs="*")
    a = ap.parse_args()
    model = ["-m", a.model] if a.model else []
    ids = json.loads(subprocess.run([a.strata, "tokenize", *model, "-p", TEXT], check=True,
                                    capture_output=True, text=True).stdout)
    turn1, extra = ids[: a.turn1], ids[a.turn1 : a.turn1 + a.new]
    cmd = [a.strata, "--serve", *model, *a.engine_args]
    for r in range(a.rounds):
        warm = Serve(cmd)
        answer, d1 = warm.request(turn1, a.answer)
        turn2 = turn1 + answer + extra
        out2, d2 = warm.request(turn2, a.answer)
        warm.close()
        cold = Serve(cmd)
        out_cold, dc = cold.request(turn2, a.answer)
        cold.close()
        same = "same answer" if out2 == out_cold else "DIFFERENT answer"
        print(f"round {r + 1}: turn 1 {len(turn1)} tokens {d1['prompt_ms']:.0f} ms | turn 2 "
              f"{len(turn2)} tokens: reused {d2['stats']['prompt_cached_tokens']}, {d2['prompt_ms']:.0f} ms; "
              f"cold {dc['prompt_ms']:.0f} ms ({100 * d2['prompt_ms'] / dc['prompt_ms']:.0f}% of cold), {same}",
              flush=True)


if __name__ == "__main__":
    main()
