#!/usr/bin/env bash
# session 50, call B (1 x H200): the whole test_attention.py (poisoned, with the session's new tests), then the
# two attention mutants whose first run only tripped the broadcast-gradient test's bug (N, J), against the fixed test
set -u
LIMIT=${1:-520}
./scripts/setup.sh > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
source .venv/bin/activate
t0=$(date +%s)
export TMO=$((t0 + LIMIT))
WARPFORGE_POISON=1 timeout 330 python -m pytest -n 15 -q -p no:cacheprovider -rfE --durations=5 tests/ops/test_attention.py > $OUT/test_attention_s50.log 2>&1
echo "attention rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/test_attention_s50.log)"
grep -E "^(FAILED|ERROR)" $OUT/test_attention_s50.log | head -10 | cut -c1-250
bash .whl/mutants_attn2/run.sh 0 N_route_do_tma_unchecked J_fb_no_store_wait_dq_stage
cat $OUT/res_0.txt
