#!/usr/bin/env bash
# Prefill and decode of the embedded models on one ~6.3K-token document (CAKE B=256, 1 thread, --weights auto).
cd "$(dirname "$0")/../.."
doc=$(mktemp); head -c 30000 "$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")/argparse.py" > "$doc"
for m in qwen2.5-coder-0.5b qwen2.5-coder-1.5b smollm2; do
  .venv/bin/cake qa "$doc" "What does ArgumentParser.parse_args return?" -m $m -b 256 --threads 1 -n 32 --json -q \
    | python3 -c "import json,sys; d=json.load(sys.stdin); print('$m', d['prompt_tokens'], 'prefill_s', round(d['prefill_seconds'],1), 'decode_tok_s', round(d['decode_tokens_per_second'],2), d.get('weights'), d['generated_tokens'])"
done
