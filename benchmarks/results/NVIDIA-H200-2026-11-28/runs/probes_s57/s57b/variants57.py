"""Session 57's consumer-loop variants of ops/decode_attention_sm90.py, as (old, new) edits."""
Q_OLD_8 = """            qb = gl.convert_layout(gl.permute((qf * qs[:, None]).to(mdt), (1, 0)), b_l)
"""
Q_NEW_8 = """            qx = (qf * qs[:, None]).to(mdt)
"""
Q_OLD_16 = """            qb = gl.convert_layout(gl.permute(q, (1, 0)), b_l)            # Q^T (D, GP)
"""
Q_NEW_16 = """            qx = q
"""
Q_SPLIT_AT = """        n_slots = gl.cdiv(gl.maximum(c1 - c0, 0), C)
        m_i = gl.full([GP], -float("inf"), gl.float32, scol)
"""
Q_SPLIT = """        qa, qc = gl.split(gl.permute(gl.reshape(qx, [GP, 2, D // 2]), (0, 2, 1)))
        qb0 = gl.convert_layout(gl.permute(qa, (1, 0)), b_l)
        qb1 = gl.convert_layout(gl.permute(qc, (1, 0)), b_l)
""" + Q_SPLIT_AT
S_OLD = """            kk = k_smem.index(slot * C + W)._reinterpret(dtype, [16, D], flat).load(a_l).to(mdt)
            s = mma_v2(kk, qb, gl.zeros([16, GP], gl.float32, mma))         # (16 tokens, GP heads)
"""
S_NEW = """            kt = k_smem.index(slot * C + W)._reinterpret(dtype, [16, D], flat)
            s = mma_v2(kt.slice(0, D // 2, dim=1).load(a_l).to(mdt), qb0, gl.zeros([16, GP], gl.float32, mma)) + \\
                mma_v2(kt.slice(D // 2, D // 2, dim=1).load(a_l).to(mdt), qb1, gl.zeros([16, GP], gl.float32, mma))
"""
SPLIT = [(Q_OLD_8, Q_NEW_8), (Q_OLD_16, Q_NEW_16), (Q_SPLIT_AT, Q_SPLIT), (S_OLD, S_NEW)]

L_OLD0 = """        l_i = gl.zeros([GP], gl.float32, scol)
"""
L_NEW0 = """        lt = gl.zeros([16, GP], gl.float32, mma)
"""
L_OLD1 = """                l_i = l_i * alpha + gl.sum(p, 0)
"""
L_NEW1 = """                lt = lt * alpha[None, :] + p
"""
L_AT = """        if FP8:
            acc = acc * vs                                              # P (v_scale V) = v_scale (P V)
"""
L_NEW2 = """        l_i = gl.sum(lt, 0)
""" + L_AT
LSUM = [(L_OLD0, L_NEW0), (L_OLD1, L_NEW1), (L_AT, L_NEW2)]
VARIANTS = {"split": SPLIT, "lsum": LSUM, "split+lsum": SPLIT + LSUM}
