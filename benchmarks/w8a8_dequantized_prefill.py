"""`cake ...` with w8a8's integer prefill turned off: the A/B baseline of the integer prefill's quality.

`--weights w8a8` runs its prefill in int8 (`models.quantize.W8A8Linear.prefill_product`); before that,
its prefill multiplied the int8 weights dequantized to the model's dtype. This runs any `cake` command
line (typically `cake bench quality ... --weights w8a8`) with `W8A8Linear.int8_prefill` off for every
layer, so the two prefills answer the same questions on the same host and their run files pair
question by question (`benchmarks/model_versus.py`, `benchmarks/weights_table.py`).

    python benchmarks/w8a8_dequantized_prefill.py bench quality --suite real ... \
        --dtype float32 --weights w8a8 -o before.json
"""

from __future__ import annotations

from cake_cli.cli.main import main
from cake_cli.models.quantize import W8A8Linear

if __name__ == "__main__":
    W8A8Linear.int8_prefill = False
    main()
