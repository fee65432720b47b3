#!/usr/bin/env bash
# run.sh W PATCH...: in a tree copy /tmp/mutW, apply each patch, run its selection (select.txt, plus the
# session-50 tests) with -x, revert; "baseline" runs the new tests on the shipped code. Stops starting
# mutants past the epoch second $TMO (minus 70 s).
W=$1; shift
M=$PWD/.whl/mutants_attn2
NEW="test_sm90_forward_routes or test_sm90_backward_reverse_order or test_covered_call_with_broadcast_gradient or test_window_left_zero_half_precision or test_sm90_backward_deterministic_mode"
tree=/tmp/mut$W
rm -rf $tree && cp -r . $tree
for name in "$@"; do
  now=$(date +%s)
  if [ $((now + 70)) -gt ${TMO:-99999999999} ]; then echo "$name NOTRUN (time)" >> $OUT/res_$W.txt; continue; fi
  if [ "$name" = baseline ]; then sel="$NEW"
  else
    sel="($(grep "^$name" $M/select.txt | cut -f2)) or $NEW"
    (cd $tree && git apply $M/$name.patch) || { echo "$name NOAPPLY" >> $OUT/res_$W.txt; continue; }
  fi
  left=$(( ${TMO:-99999999999} - now - 10 )); [ $left -gt 150 ] && left=150
  (cd $tree && PYTHONPATH=$tree/src WARPFORGE_POISON=1 timeout $left python -m pytest -x -q -n 7 -p no:cacheprovider -k "$sel" tests/ops/test_attention.py > $OUT/mut_$name.log 2>&1)
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - now ))s: $(grep -E 'passed|failed|error' $OUT/mut_$name.log | tail -1 | cut -c1-150)" >> $OUT/res_$W.txt
  grep -E "^(FAILED|ERROR)" $OUT/mut_$name.log | head -3 | cut -c1-200 | sed "s/^/  $name /" >> $OUT/res_$W.txt
  if [ "$name" != baseline ]; then (cd $tree && git apply -R $M/$name.patch); fi
done
