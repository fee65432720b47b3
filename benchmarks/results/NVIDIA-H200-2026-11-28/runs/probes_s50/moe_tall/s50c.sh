#!/usr/bin/env bash
# session 50, call C (1 x H200): the swapped decode kernels' tests (TALL pairs of row tiles, poisoned), then the
# swap probe over three routings at Mixtral T = 256 with the TALL candidates beside the shipped configs
set -u
./scripts/setup.sh > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
source .venv/bin/activate
t0=$(date +%s)
WARPFORGE_POISON=1 timeout 150 python -m pytest -q -p no:cacheprovider -rfE tests/ops/test_moe.py -k "swapped_decode" > $OUT/test_tall.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/test_tall.log)"
grep -E "^(FAILED|ERROR)" $OUT/test_tall.log | head -5 | cut -c1-250
timeout 300 python benchmarks/probe_moe_swap.py --routings balanced,random,zipf \
  --up "64,128,64,64,4,4;64,128,64,64,8,3,1;64,128,64,64,8,4,1" \
  --down "64,128,128,128,4,3;64,128,128,64,8,3,1;64,128,128,64,8,4,1;64,128,64,64,8,4,1" > $OUT/probe_moe_tall.log 2>&1
echo "probe rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/== summary ==/,$p' $OUT/probe_moe_tall.log
