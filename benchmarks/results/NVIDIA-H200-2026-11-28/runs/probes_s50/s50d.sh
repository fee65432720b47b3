#!/usr/bin/env bash
# session 50, call D (2 x H200): the CUDA C++ backend's mutation audit (.whl/mutants_cuda, 24 mutants), six
# workers (three a GPU), each with its own tree copy and extension cache; no baseline (the same tests passed
# on the shipped code in session 49's whole-suite run, NOTES item 145)
set -u
LIMIT=${1:-560}
./scripts/setup.sh > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
source .venv/bin/activate
t0=$(date +%s)
export TMO=$((t0 + LIMIT)) PER=150
C=.whl/mutants_cuda
(CUDA_VISIBLE_DEVICES=0 bash $C/run.sh 0 A_ln_fwd_eps_outside_rsqrt G_norm_bwd_parts_not_zeroed M_sm_cluster_send_rank T_add_vec_tail_last_dropped) &
(CUDA_VISIBLE_DEVICES=1 bash $C/run.sh 1 B_ln_fwd_m2_merge_count H_ln_bwd_no_mean_g_term N_sm_cluster_max_not_subtracted U_reduce_tail_vector_dropped) &
(CUDA_VISIBLE_DEVICES=0 bash $C/run.sh 2 C_ln_fwd_no_pivot I_norm_bwd_dsum_row_stride O_sm_cluster_thread_max_row V_mma_ktiles_floor) &
(CUDA_VISIBLE_DEVICES=1 bash $C/run.sh 3 D_ln_fwd_bias_slice J_rms_bwd_offset_packed_odd P_sm_cluster_lse_no_max W_grouped_tile_full_group) &
(CUDA_VISIBLE_DEVICES=0 bash $C/run.sh 4 E_norm_unpack_pinned_bf16_swap K_rows_group_stride Q_sm_warp_tail_fill_zero X_mma_tma_acc_not_reset_per_tile) &
(CUDA_VISIBLE_DEVICES=1 bash $C/run.sh 5 F_norm_bwd_dy_row_stride L_rows_partial_group_floor R_sm_local_stats_no_inf_guard S_ops_ln_fwd_stride_swap) &
wait
echo "all done $(( $(date +%s) - t0 )) s"
cat $OUT/res_*.txt
(cd $OUT && tar czf cuda_mutants_logs.tgz mut_*.log build_*.log res_*.txt && rm -f mut_*.log build_*.log)
ls -la $OUT | head
