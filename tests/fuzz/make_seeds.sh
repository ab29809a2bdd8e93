#!/usr/bin/env bash
# Regenerates the seed corpora in tests/fuzz/corpus/ (small valid inputs of every kind, plus a few
# truncated or odd ones). Needs /usr/bin/python3 with numpy and a normal build in build/ (for
# `moelite calibrate` and `moelite trace record`). Crash reproducers found by fuzzing live beside
# the seeds as regress-*; this script leaves them alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=tests/fuzz/corpus
PY=/usr/bin/python3
CLI=build/bin/moelite
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p $C/fuzz_gguf_load $C/fuzz_tokenizer $C/fuzz_chat_template $C/fuzz_profile $C/fuzz_trace $C/fuzz_session

# ---- models: every architecture, small widths, several weight types and layouts
tiny="--quiet --n-embd 32 --n-head 2 --n-head-kv 1 --n-expert 4 --n-ff-exp 32 --n-ff-shexp 32 --vocab 64 --ctx 32"
for a in olmoe qwen2moe qwen3moe llama; do
  $PY tools/make_tiny_model.py --arch $a --type Q8_0 --n-layer 1 $tiny --out $C/fuzz_gguf_load/$a-Q8_0.gguf
done
$PY tools/make_tiny_model.py --arch llama --type F32 --n-layer 1 $tiny --tied --per-expert-tensors \
  --out $C/fuzz_gguf_load/llama-F32-split-tied.gguf
$PY tools/make_tiny_model.py --arch qwen2moe --type Q4_0 --n-layer 2 $tiny --pregate \
  --out $C/fuzz_gguf_load/qwen2moe-Q4_0-pregate.gguf
# The shipped model's header (metadata + tensor directory), cut before its data.
head -c 12288 models/moelite-tiny-qwen3moe-Q8_0.gguf > $C/fuzz_gguf_load/shipped-header.gguf

# ---- tokenizer: mode byte even = real vocabularies (bit 1: gpt-2, else SentencePiece)
i=0
while IFS= read -r line; do
  i=$((i + 1))
  ((i % 3 == 0)) || continue
  printf '\x00%s' "$line" > $C/fuzz_tokenizer/spm-$i
  printf '\x02%s' "$line" > $C/fuzz_tokenizer/gpt-$i
done < tests/data/vocab/ggml-vocab-gpt-2.gguf.inp
printf '\x02<|endoftext|> Hello\xc3\xa9 \xf0\x9f\x98\x80 \xff\xfe  \n\n12345' > $C/fuzz_tokenizer/gpt-special
# odd = a vocabulary from the input: flags, pre-tokenizer index, tokens (\n-separated), \0\0, text
printf '\x5b\x01<unk>\n<s>\n</s>\n\xe2\x96\x81\nh\ne\nl\no\nhe\nll\n\xe2\x96\x81he\n<0x41>\n<|im_end|>\x00\x00hello <|im_end|> A' \
  > $C/fuzz_tokenizer/built-spm
printf '\x5f\x01a\nb\nc\n\xc4\xa0\nab\nbc\nabc\n\xc4\xa0a\n<|endoftext|>\x00\x00abc ab\xc4\xa0a <|endoftext|>' \
  > $C/fuzz_tokenizer/built-bpe-llama3
printf '\xdf\x02h\ni\n\xc4\xa0\nhi\n\xc4\xa0hi\n<|eot_id|>\n<|end|>\n<|return|>\n<|call|>\x00\x00hi hi<|eot_id|>' \
  > $C/fuzz_tokenizer/built-bpe-qwen2

# ---- chat templates: option byte, template source, \0, role \0 content \0 ...
chat() { printf "$2" > $C/fuzz_chat_template/$1; }
chat chatml '\x01{%% for m in messages %%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{%% endfor %%}\x00system\x00be brief\x00user\x00hi\x00assistant\x00hello'
chat llama3 '\x01<|start_header_id|>{{ role }}<|end_header_id|>\x00user\x00hi\x00assistant\x00yo'
chat tulu '\x09<|user|>\n{{ content }}<|assistant|>\x00user\x00q\x00assistant\x00a\x00user\x00q2'
chat mistral '\x0b[INST] {{ content }} [/INST]\x00system\x00sys\x00user\x00q\x00assistant\x00a'
chat plain '\x00unknown template\x00user\x00\x00\x00'

# ---- calibration profile (+ weights sidecar, named p.bin as the target expects)
$PY tools/make_tiny_model.py --arch olmoe --type Q8_0 --n-layer 2 $tiny --out $tmp/m.gguf
head -c 4000 README.md > $tmp/corpus.txt
$CLI calibrate -m $tmp/m.gguf -f $tmp/corpus.txt -o $tmp/prof.json --ctx 32 --max-tokens 160 >/dev/null
sed 's/"weights_file": "[^"]*"/"weights_file": "p.bin"/' $tmp/prof.json > $C/fuzz_profile/with-weights
printf '\n#BIN\n' >> $C/fuzz_profile/with-weights
cat $tmp/prof.json.bin >> $C/fuzz_profile/with-weights
$PY - "$tmp/prof.json" > $C/fuzz_profile/no-weights <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))
p.pop("tensors", None); p.pop("weights_file", None)
print(json.dumps(p))
PYEOF

# ---- routing traces
$CLI trace record -m $tmp/m.gguf -p "The quick brown fox" -n 8 -o $C/fuzz_trace/recorded >/dev/null
printf '#CAP 3\n{"token":0,"layer":0,"experts":[1,2]}\n{"token":1,"layer":1,"experts":[0,3],"weights":[0.5,0.5]}\n{"token":2,"layer":0,"experts":[3,1]}\n' \
  > $C/fuzz_trace/no-header
printf '#CAP 25%%\n{"n_layers":2,"n_experts":8,"top_k":2}\n{"token":5,"layer":1,"experts":[7,6],"x":[true,null,{"a":"b"}]}\n' \
  > $C/fuzz_trace/header-skipped-values

# ---- saved sessions of the shipped model (fuzz_session): mode byte odd = the file as is (zstd),
# even = the payload alone (the target wraps it in a valid header); a payload cut short too.
$CLI run -m models/moelite-tiny-qwen3moe-Q8_0.gguf -p "def add(a, b):" -n 4 --temp 0 --session $tmp/s.session \
  >/dev/null 2>&1
{ printf '\x01'; cat $tmp/s.session; } > $C/fuzz_session/file-zstd
{ printf '\x00'; tail -c +49 $tmp/s.session | zstd -dc; } > $C/fuzz_session/payload
head -c 600 $C/fuzz_session/payload > $C/fuzz_session/payload-cut
du -sh $C
