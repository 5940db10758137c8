# run from the repository root; the document: the first 12,000 characters of CPython LICENSE.txt with the San Francisco needle after character 6,000 (tests/helpers/texts.py, tests/helpers/real.py NEEDLE)
export PYTHONPATH=$PWD OMP_NUM_THREADS=2
PY="nice -n 15 /work/main/.venv/bin/python -m cake_cli"
for bits in 16 4; do
  $PY compress ${OUT:-/tmp/m25q}/doc.txt -o ${OUT:-/tmp/m25q}/q$bits.cake -b 256 --kv-bits $bits --json > ${OUT:-/tmp/m25q}/cq$bits.json 2>${OUT:-/tmp/m25q}/cq$bits.err
done
for f in d16 d4 q16 q4; do
  $PY qa ${OUT:-/tmp/m25q}/$f.cake "What is the best thing to do in San Francisco?" -n 32 --json > ${OUT:-/tmp/m25q}/qa-$f.json 2>${OUT:-/tmp/m25q}/qa-$f.err
  python3 -c "
import json
d=json.load(open('${OUT:-/tmp/m25q}/qa-$f.json')); c=d['cache']
print('$f', 'scoring', c['scoring'], 'answer:', repr(d['answer'][:80]), 'kv_bytes_kept', d['kv_bytes_kept'], 'final', d['kv_bytes_final'], 'full', d['kv_bytes_full'], 'loaded', c['kv_bytes'], 'file', c['file_bytes'], 'read_s', round(c['read_seconds'],2), 'decode_tok_s', round(d['decode_tokens_per_second'],2), 'steps', d['decode_steps'], 'first_token_s', round(c['first_token_seconds'],2))
"
done
