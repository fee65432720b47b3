#!/usr/bin/env bash
# session 50, call E (1 x H200): the new CUDA norm tests on the shipped code, then mutants F and J (the two
# survivors of call D) against them
set -u
./scripts/setup.sh > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
source .venv/bin/activate
t0=$(date +%s)
export TMO=$((t0 + 300)) PER=120
(WARPFORGE_CACHE=/tmp/base_cache WARPFORGE_POISON=1 timeout 240 python -m pytest -q -p no:cacheprovider -rfE \
  tests/cuda/test_cuda_norm.py -k "strided_rows or narrowed_gradient or residual_grad" > $OUT/test_new_cuda.log 2>&1;
  echo "baseline rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/test_new_cuda.log)" > $OUT/res_base.txt) &
(bash .whl/mutants_cuda/run.sh 0 F_norm_bwd_dy_row_stride) &
(bash .whl/mutants_cuda/run.sh 1 J_rms_bwd_offset_packed_odd) &
wait
cat $OUT/res_*.txt
grep -E "^(FAILED|ERROR)" $OUT/test_new_cuda.log | head -5
(cd $OUT && tar czf cuda_mutants_FJ_logs.tgz mut_*.log build_*.log && rm -f mut_*.log build_*.log)
