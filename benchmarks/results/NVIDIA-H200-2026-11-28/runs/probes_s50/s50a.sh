#!/usr/bin/env bash
# session 50, call A (2 x H200): GPU 0 runs the tests last edited without a GPU run (poisoned), then the
# attention mutants (worker 0); GPU 1 the swapped MoE decode probe with 8-warp gate/up configs, then
# mutant worker 1
set -u
LIMIT=${1:-540}
./scripts/setup.sh > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
source .venv/bin/activate
nvidia-smi --query-gpu=index,name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
export TMO=$((t0 + LIMIT))
gpu0() {
  CUDA_VISIBLE_DEVICES=0 WARPFORGE_POISON=1 timeout 240 python -m pytest -n 15 -q -p no:cacheprovider -rfE \
    tests/ops/test_decode_attention.py tests/ops/test_softmax.py \
    "tests/ops/test_moe.py::test_align_one_program_exact" "tests/ops/test_moe.py::test_align_paths" \
    > $OUT/test_verify.log 2>&1
  CUDA_VISIBLE_DEVICES=0 WARPFORGE_POISON=1 timeout 150 python -m pytest -n 15 -q -p no:cacheprovider -rfE \
    tests/ops/test_attention.py -k "varlen" >> $OUT/test_verify.log 2>&1
  echo "verify rc=$? $(( $(date +%s) - t0 )) s: $(grep -E "passed|failed" $OUT/test_verify.log | tr "\n" " ")" > $OUT/rc_verify.txt
  CUDA_VISIBLE_DEVICES=0 bash .whl/mutants_attn2/run.sh 0 baseline A_pers_pid_m_from_program_id B_pers_bh_from_program_id \
    C_route_persistent_takes_causal D_route_persistent_items_kv_heads E_short_causal_tiles_half_block \
    F_route_short_causal_disabled G_dq_delayed_gemm_current_k H_dq_wg1_causal_flag_false
}
gpu1() {
  CUDA_VISIBLE_DEVICES=1 timeout 200 python benchmarks/probe_moe_swap.py --routings random,zipf \
    --up "64,128,64,64,4,4;64,128,64,64,8,4;64,128,64,64,8,3;64,128,64,128,8,3" \
    --down "64,128,128,128,4,3;64,128,128,128,8,3" > $OUT/probe_moe_swap_8w.log 2>&1
  echo "probe rc=$? $(( $(date +%s) - t0 )) s" > $OUT/rc_probe.txt
  CUDA_VISIBLE_DEVICES=1 bash .whl/mutants_attn2/run.sh 1 M_covers_left_window_zero N_route_do_tma_unchecked \
    L_fb_reverse_off_by_one I_fb_load_heads_inner J_fb_no_store_wait_dq_stage K_fb_query_tiles_from_len_k \
    O_route_fwd_len_k_is_L P_fb_dq_reduce_drops_i_lo
}
gpu0 & gpu1 &
wait
cat $OUT/rc_*.txt
grep -h -E "^(FAILED|ERROR)" $OUT/test_verify.log | head -20 | cut -c1-300
sed -n '/== summary ==/,$p' $OUT/probe_moe_swap_8w.log
cat $OUT/res_*.txt 2>/dev/null
