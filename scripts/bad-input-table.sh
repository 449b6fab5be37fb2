#!/usr/bin/env bash
# The bad-input table of docs/reliability.md (issue 14 item 7): makes each kind of bad input
# from the synthetic test model (testdata/reference/tiny-qwen3moe, scripts/make-testdata.sh) in
# a scratch directory, runs the command a user would run on it, and prints one markdown row per
# case: what is bad, the exact command (run in that directory), the exit status and the exact
# message (stderr, or the reply line for --serve and HTTP).
#
#   scripts/bad-input-table.sh [STRATA_BINARY]     default target/release/strata (--features gpu)
#
# Bad GGUFs are written by a small GGUF rewriter (below): it parses the fixture, changes one
# field (a header count, a key's value or type, a tensor's offset, shape or bytes) and writes it
# back with the tensor data unchanged.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
strata=$(realpath "${1:-$root/target/release/strata}")
fixture="$root/testdata/reference/tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf"
[ -f "$fixture" ] || { echo "missing $fixture (scripts/make-testdata.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'kill $server_pid 2>/dev/null; rm -rf "$work"' EXIT
server_pid=
cd "$work"
cp "$fixture" tiny.gguf

cat >patch.py <<'EOF'
# patch.py SRC DST EDIT...  EDIT: count=N | keylen=N | key=NAME:TYPE:VALUE | dropkey=NAME |
#   offset=TENSOR:N | dims=TENSOR:D0,D1 | nanrow=TENSOR:ROW (q8_0: every block scale NaN) |
#   f32nan=TENSOR:I (an f32 tensor's value I made NaN)
import struct, sys
src, dst, edits = sys.argv[1], sys.argv[2], sys.argv[3:]
b = open(src, 'rb').read()
pos = 0
def rd(fmt):
    global pos
    v = struct.unpack_from('<' + fmt, b, pos); pos += struct.calcsize('<' + fmt); return v[0]
def rstr():
    global pos
    n = rd('Q'); s = b[pos:pos + n]; pos += n; return s
SIZES = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
def rval(t):
    global pos
    start = pos
    if t == 8: rstr()
    elif t == 9:
        et = rd('I'); n = rd('Q')
        for _ in range(n): rval(et)
    else: rd(SIZES[t])
    return b[start:pos]
magic, ver = b[:4], struct.unpack_from('<I', b, 4)[0]
pos = 8
nt, nkv = rd('Q'), rd('Q')
kvs = []
for _ in range(nkv):
    k = rstr(); t = rd('I'); kvs.append([k, t, rval(t)])
tis = []
for _ in range(nt):
    name = rstr(); nd = rd('I'); dims = [rd('Q') for _ in range(nd)]; ty = rd('I'); off = rd('Q')
    tis.append([name, dims, ty, off])
align = 32
for k, t, v in kvs:
    if k == b'general.alignment': align = struct.unpack('<I', v)[0]
data_start = (pos + align - 1) // align * align
data = bytearray(b[data_start:])
head_count = None; keylen = None
for e in edits:
    what, arg = e.split('=', 1)
    if what == 'count': head_count = int(arg)
    elif what == 'keylen': keylen = int(arg)
    elif what == 'key':
        name, ty, val = arg.split(':', 2); t = int(ty)
        enc = (struct.pack('<Q', len(val.encode())) + val.encode()) if t == 8 else struct.pack('<' + SIZES[t], float(val) if t in (6, 12) else int(val))
        hit = [kv for kv in kvs if kv[0] == name.encode()]
        if hit: hit[0][1], hit[0][2] = t, enc
        else: kvs.append([name.encode(), t, enc])
    elif what == 'dropkey': kvs = [kv for kv in kvs if kv[0] != arg.encode()]
    elif what in ('offset', 'dims', 'nanrow', 'f32nan'):
        name, val = arg.rsplit(':', 1)
        ti = [t for t in tis if t[0] == name.encode()][0]
        if what == 'offset': ti[3] = int(val)
        elif what == 'dims': ti[1] = [int(x) for x in val.split(',')]
        elif what == 'f32nan':
            at = ti[3] + 4 * int(val)
            data[at:at + 4] = struct.pack('<f', float('nan'))
        else:
            row = int(val); blocks = ti[1][0] // 32
            for j in range(blocks):
                at = ti[3] + (row * blocks + j) * 34
                data[at:at + 2] = struct.pack('<H', 0x7e00)
out = bytearray(magic + struct.pack('<I', ver))
out += struct.pack('<QQ', head_count if head_count is not None else len(tis), len(kvs))
for i, (k, t, v) in enumerate(kvs):
    out += struct.pack('<Q', keylen if (keylen is not None and i == 0) else len(k)) + k + struct.pack('<I', t) + v
for name, dims, ty, off in tis:
    out += struct.pack('<Q', len(name)) + name + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims) + struct.pack('<I', ty) + struct.pack('<Q', off)
out += b'\0' * ((-len(out)) % align)
open(dst, 'wb').write(out + data)
EOF
patch() { python3 patch.py tiny.gguf "$@"; }

# One row: what is bad | command | exit | message | grade. The command runs in this directory
# with `strata` on PATH; the message is its stderr (or what is given on stdin to `reply`). The
# grade (third argument, default G) is the table's judgement of the answer: G good (precise,
# names the input), W weak (correct but vague), B bad (a crash, a hang or a wrong answer);
# the counts close the table.
declare -A graded=([G]=0 [W]=0 [B]=0)
row() {
  local what=$1 cmd=$2 out status
  out=$(PATH="$(dirname "$strata"):$PATH" bash -c "$cmd" 2>&1 >/dev/null)
  status=$?
  emit "$what" "$cmd" "$status" "$out" "${3:-G}"
}
# Like row, with stdout and stderr together (strata gguf --check lists problems on stdout).
both() {
  local what=$1 cmd=$2 out status
  out=$(PATH="$(dirname "$strata"):$PATH" bash -c "$cmd" 2>&1)
  status=$?
  emit "$what" "$cmd" "$status" "$out" "${3:-G}"
}
# Like row, for commands whose answer is on stdout (protocol lines, HTTP bodies).
reply() {
  local what=$1 cmd=$2 out status
  out=$(PATH="$(dirname "$strata"):$PATH" bash -c "$cmd" 2>/dev/null)
  status=$?
  emit "$what" "$cmd" "$status" "$out" "${3:-G}"
}
emit() {
  local msg
  msg=$(printf '%s' "$4" | sed 's/|/\\|/g' | awk 'NF' | paste -sd'\n' | sed ':a;N;$!ba;s/\n/<br>/g')
  graded[$5]=$((graded[$5] + 1))
  printf '| %s | `` %s `` | %s | `` %s `` | %s |\n' "$1" "$(printf '%s' "$2" | sed 's/|/\\|/g')" "$3" "$msg" "$5"
}

echo '| bad input | command | exit | message | grade |'
echo '|---|---|---|---|---|'

# --- model files -------------------------------------------------------------------------
head -c 5000 tiny.gguf >truncated.gguf
row "truncated GGUF (first 5000 bytes)" 'strata generate --device cpu -m truncated.gguf -p hi -n 1'
head -c 20 tiny.gguf >header-only.gguf
row "truncated GGUF (header only)" 'strata generate --device cpu -m header-only.gguf -p hi -n 1'
echo 'just some text' >notes.txt
row "not a GGUF file" 'strata generate --device cpu -m notes.txt -p hi -n 1'
patch count.gguf count=1099511627776
row "oversized tensor count (2^40)" 'strata generate --device cpu -m count.gguf -p hi -n 1'
patch keylen.gguf keylen=1099511627776
both "oversized key length (2^40)" 'strata gguf --check keylen.gguf'
patch type.gguf key=qwen3moe.block_count:8:two
row "wrong value type (block_count is a string)" 'strata generate --device cpu -m type.gguf -p hi -n 1'
patch nohead.gguf dropkey=qwen3moe.attention.head_count
row "missing required key" 'strata generate --device cpu -m nohead.gguf -p hi -n 1'
patch offset.gguf offset=output_norm.weight:1099511627776
row "tensor offset out of bounds" 'strata generate --device cpu -m offset.gguf -p hi -n 1'
patch offset2.gguf offset=output_norm.weight:4
both "tensor offset overlapping another tensor" 'strata gguf --check offset2.gguf'
patch shape.gguf dims=blk.0.attn_norm.weight:255
row "tensor of the wrong shape" 'strata generate --device cpu -m shape.gguf -p hi -n 1'
patch vocab.gguf dims=token_embd.weight:256,1000 dims=output.weight:256,1000
row "vocab mismatch (1024 tokens, 1000 embedding rows)" 'strata generate --device cpu -m vocab.gguf --tokens 1,2 -n 4 --temp 0'
row "vocab mismatch, a prompt token beyond the model's rows" 'strata generate --device cpu -m vocab.gguf --tokens 1,1010 -n 4 --temp 0'
patch eps.gguf key=qwen3moe.attention.layer_norm_rms_epsilon:6:nan
row "NaN metadata (layer_norm_rms_epsilon)" 'strata generate --device cpu -m eps.gguf -p hi -n 1'
patch rope.gguf key=qwen3moe.rope.freq_base:6:-1
row "rope.freq_base = -1" 'strata generate --device cpu -m rope.gguf -p hi -n 1'
patch rope0.gguf key=qwen3moe.rope.freq_base:6:0
row "rope.freq_base = 0" 'strata generate --device cpu -m rope0.gguf -p hi -n 1'
patch nan-row.gguf nanrow=token_embd.weight:5
row "NaN weights (f16 scales of token_embd row 5)" 'strata generate --device cpu -m nan-row.gguf --tokens 3,5,7 -n 4 --temp 0'
row "NaN weights, every position's logits" 'strata logits --device cpu -m nan-row.gguf --tokens 3,5,7 --out l.npy'
row "NaN weights, the layer scan" 'STRATA_CHECK_FINITE=1 strata generate --device cpu -m nan-row.gguf --tokens 3,5,7 -n 4 --temp 0'
patch bos.gguf key=tokenizer.ggml.bos_token_id:4:999999
row "unknown special token (bos_token_id 999999)" 'strata generate --device cpu -m bos.gguf -p hi -n 1'
patch eos.gguf key=tokenizer.ggml.eos_token_id:5:-1
row "special token id of the wrong type (eos_token_id i32 -1)" 'strata generate --device cpu -m eos.gguf -p hi -n 1'
patch tmpl.gguf 'key=tokenizer.chat_template:8:{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}'
row "runaway chat template" 'strata generate --device cpu -m tmpl.gguf --chat -p hi -n 1'
split="$root/testdata/reference/tiny-qwen4exp/tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf"
if [ -f "$split" ]; then
  cp "$split" m-00001-of-00002.gguf
  row "split model with a missing shard" 'strata generate --device cpu -m m-00001-of-00002.gguf -p hi -n 1'
fi
# Sizes and ranges from a file (issue 39).
patch blocks.gguf key=qwen3moe.block_count:4:4294967295
row "block_count 2^32-1" 'strata generate --device cpu -m blocks.gguf -p hi -n 1'
row "block_count 2^32-1 on --serve" 'strata --serve --device cpu -m blocks.gguf </dev/null'
both "block_count 2^32-1, gguf --check" 'strata gguf --check blocks.gguf'
patch norm-nan.gguf f32nan=output_norm.weight:0
row "NaN in output_norm.weight[0]" 'strata generate --device cpu -m norm-nan.gguf -p hi -n 1'
both "NaN in output_norm.weight[0], gguf --check" 'strata gguf --check norm-nan.gguf'
patch embd.gguf key=qwen3moe.embedding_length:4:512
row "wrong embedding_length (512 for 256-wide tensors)" 'strata generate --device cpu -m embd.gguf -p hi -n 1'
patch align.gguf key=general.alignment:4:48
both "general.alignment not a power of two" 'strata gguf --check align.gguf'
mkdir -p models
row "-m on a directory" 'strata generate --device cpu -m models -p hi -n 1'
mkfifo pipe.gguf
row "-m on a FIFO" 'strata generate --device cpu -m pipe.gguf -p hi -n 1'
ln -s /nonexistent/model.gguf dangling.gguf
row "-m on a dangling symbolic link" 'strata generate --device cpu -m dangling.gguf -p hi -n 1'
row "-m on nothing" 'strata generate --device cpu -m missing.gguf -p hi -n 1'

# --- prompts -----------------------------------------------------------------------------
long=$(seq -s, 1 40)
row "prompt larger than the context" "strata generate --device cpu -m tiny.gguf --max-context 16 --tokens $long -n 4"
row "prompt token outside the vocabulary" 'strata generate --device cpu -m tiny.gguf --tokens 1,5000 -n 4'
row "empty prompt" "strata generate --device cpu -m tiny.gguf --tokens '' -n 4"
row "empty text prompt" "strata generate --device cpu -m tiny.gguf -p '' -n 4"

# --- flags (issue 39) --------------------------------------------------------------------
row "--max-context 100000000" 'strata generate --device cpu -m tiny.gguf --max-context 100000000 -p hi -n 1'
row "--max-context 2^64-1" 'strata generate --device cpu -m tiny.gguf --max-context 18446744073709551615 -p hi -n 1'
row "--max-context 100000000 on --serve" 'strata --serve --device cpu -m tiny.gguf --max-context 100000000 </dev/null'
row "--threads 100000" 'strata generate --device cpu -m tiny.gguf --threads 100000 -p hi -n 1'
row "negative flag value (-n -1)" 'strata generate --device cpu -m tiny.gguf -n -1 -p hi'

# --- the --serve protocol ----------------------------------------------------------------
serve() { printf "%s\n" "$1" >"$2"; }
printf '\xff\n' >utf8.in
reply "invalid UTF-8 on --serve's stdin" 'strata --serve --device cpu -m tiny.gguf <utf8.in | tail -n +2'
printf '{"type":"generate","id":4,"tokens":[1],"max_tokens":1}\xfe\n' >utf8-id.in
printf '\xef\xbb\xbf{"type":"generate","id":21,"tokens":[1],"max_tokens":1}\n' >bom.in
reply "a UTF-8 byte order mark before a request (issue 39)" 'strata --serve --device cpu -m tiny.gguf <bom.in | tail -n +2'
printf '{"type":"generate","id":22,"tokens":[1],"max_tokens":1e999}\n' >range.in
reply "a number out of range in a request (issue 39)" 'strata --serve --device cpu -m tiny.gguf <range.in | tail -n +2'
reply "invalid UTF-8 in a request with a readable id" 'strata --serve --device cpu -m tiny.gguf <utf8-id.in | tail -n +2'
serve '{"type":"generate","id":1,"tokens":[1],"max_tokens":1}{"type":"generate","id":2,"tokens":[1],"max_tokens":1}' two.in
reply "two requests on one line" 'strata --serve --device cpu -m tiny.gguf <two.in | tail -n +2'
serve '{"type":"generate","id":1,"tokens":[1],"max_tokens":-5}' neg.in
reply "protocol field of the wrong type (max_tokens -5)" 'strata --serve --device cpu -m tiny.gguf <neg.in | tail -n +2'
serve '{"type":"generate","id":1,"tokens":[1,"a"],"max_tokens":1}' tok.in
reply "protocol array element of the wrong type" 'strata --serve --device cpu -m tiny.gguf <tok.in | tail -n +2'
serve '{"type":"generate","id":1,"tokens":[1],"max_tokens":1,"sampling":{"top_p":0}}' topp.in
reply "protocol value out of range (top_p 0)" 'strata --serve --device cpu -m tiny.gguf <topp.in | tail -n +2'
serve '{"type":"generate","id":1,"tokens":[1,5000],"max_tokens":1}' vocab.in
reply "protocol token outside the vocabulary" 'strata --serve --device cpu -m tiny.gguf <vocab.in | tail -n +2'
serve '{"type":"generate","id":1,"tokens":[1]}' missing.in
reply "protocol field missing" 'strata --serve --device cpu -m tiny.gguf <missing.in | tail -n +2'
serve '{"type":"fly","id":1}' type.in
reply "unknown protocol message type" 'strata --serve --device cpu -m tiny.gguf <type.in | tail -n +2'
serve 'hello' notjson.in
reply "protocol line that is not JSON" 'strata --serve --device cpu -m tiny.gguf <notjson.in | tail -n +2'
serve "{\"type\":\"generate\",\"id\":1,\"tokens\":[$long],\"max_tokens\":1}" ctx.in
reply "protocol prompt larger than the context" 'strata --serve --device cpu -m tiny.gguf --max-context 16 <ctx.in | tail -n +2'
serve '{"type":"generate","id":1,"tokens":[3,5,7],"max_tokens":2}' nan.in
reply "NaN weights on --serve" 'strata --serve --device cpu -m nan-row.gguf <nan.in | tail -n +2'

# --- HTTP bodies -------------------------------------------------------------------------
port=$((20000 + RANDOM % 20000))
PATH="$(dirname "$strata"):$PATH" strata server -m tiny.gguf --device cpu --port $port >server.log 2>&1 &
server_pid=$!
for _ in $(seq 100); do curl -s "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
post() { echo "curl -s -w ' [HTTP %{http_code}]' localhost:$port$1 -H 'content-type: application/json' --data-binary @$2"; }
printf '{"messages":[{"role":"user","content":"caf\xe9"}]}' >body-utf8.json
reply "invalid UTF-8 in an HTTP body" "$(post /v1/chat/completions body-utf8.json)"
printf '{"messages":[{"role":"user","content":"hi"}],"max_tokens":-1}' >body-neg.json
reply "HTTP field of the wrong type" "$(post /v1/chat/completions body-neg.json)"
printf '{"messages":[{"role":"wizard","content":"hi"}]}' >body-role.json
reply "HTTP unknown role" "$(post /v1/chat/completions body-role.json)"
printf '{"prompt":[1,5000],"max_tokens":1}' >body-tok.json
reply "HTTP token prompt outside the vocabulary" "$(post /v1/completions body-tok.json)"
printf '{"messages":[' >body-cut.json
reply "HTTP body that is not JSON" "$(post /v1/messages body-cut.json)"
printf '{"prompt":[1,-5],"max_tokens":1}' >body-negtok.json
reply "HTTP token prompt with a negative id (issue 39)" "$(post /v1/completions body-negtok.json)"
printf '{"messages":[{"role":"user","content":"hi"}],"tool_choice":"required"}' >body-req.json
reply "tool_choice required without tools (issue 39)" "$(post /v1/chat/completions body-req.json)"
printf '{"max_tokens":8,"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"tool_use","id":"t1","name":"f","input":{}}]}]}' >body-tooluse.json
reply "Anthropic tool_use block in a user turn (issue 39)" "$(post /v1/messages body-tooluse.json)"
printf '{"max_tokens":8,"messages":[{"role":"assistant","content":"hello"}]}' >body-asst.json
reply "Anthropic request of only an assistant message (issue 39)" "$(post /v1/messages body-asst.json)"
kill $server_pid 2>/dev/null; wait $server_pid 2>/dev/null; server_pid=
row "server --startup-timeout 0 (issue 39)" "strata server -m tiny.gguf --device cpu --port $port --startup-timeout 0"

# --- the software GPU (strata emu) -------------------------------------------------------
elf=$(ls "$root"/target/release/build/strata-*/out/strata-kernels-gfx1100.elf 2>/dev/null | head -1)
if [ -n "$elf" ]; then
  cp "$elf" k.elf
  head -c 340 /dev/zero >w.bin
  args='--arg in=w.bin --arg out=y.bin:640 --arg u32=5 --arg u32=0'
  row "huge emu grid" "strata emu run k.elf dequant_q8_0_f32 --grid 4294967295,1,1 --block 256 $args"
  row "emu grid over a dispatch's 2^32-1 work-items" "strata emu run k.elf dequant_q8_0_f32 --grid 4294967295,1,1 --block 2 --max-waves 18446744073709551615 $args"
  row "emu launch past its total work bound" "strata emu run k.elf dequant_q8_0_f32 --grid 1000000 --block 32 --launch-budget 100000 $args"
  row "huge emu buffer (64 GiB)" "strata emu run k.elf dequant_q8_0_f32 --arg in=w.bin --arg out=y.bin:68719476736 --arg u32=5 --arg u32=0"
  row "emu buffer of 2^64-1 bytes" "strata emu run k.elf dequant_q8_0_f32 --arg in=w.bin --arg zero=18446744073709551615 --arg u32=5 --arg u32=0"
  head -c 3000 k.elf >cut.elf
  row "truncated code object" 'strata emu disasm cut.elf'
  row "not a code object" 'strata emu list notes.txt'
fi

echo
echo "${graded[G]} good, ${graded[W]} weak, ${graded[B]} bad"
