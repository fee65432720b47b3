"""Session 52's mutants of the Gluon dropout code: (name, file, old, new). apply(i, root) patches a tree copy."""
import sys
F = "src/warpforge/ops/attention_sm90.py"
MUTANTS = [
    ("fwd_row_off", F, "rows = row_lo + gl.arange(0, ROWS, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))",
     "rows = row_lo + 1 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))"),
    ("fwd_b0_ignored", F, "((seed >> 32) & 0xFFFFFFFF).to(gl.uint32), b + drop_b0, h, drop_thr, True, ROUNDS)",
     "((seed >> 32) & 0xFFFFFFFF).to(gl.uint32), b, h, drop_thr, True, ROUNDS)"),
    ("bwd_b0_ignored", F, "_dropout_words(k0, k1, b + drop_b0, h, m0, key_lo, BM, HN, ROUNDS)",
     "_dropout_words(k0, k1, b, h, m0, key_lo, BM, HN, ROUNDS)"),
    ("bwd_unpack_e", F, "return gl.reshape(((words >> (c5 * 8 + w5 * 2 + e5)) & 1) != 0, [64, QUERIES])",
     "return gl.reshape(((words >> (c5 * 8 + w5 * 2 + (1 - e5))) & 1) != 0, [64, QUERIES])"),
    ("bwd_dv_unmasked", F, "pa = gl.convert_layout(gl.where(keep, pt * drop_scale, 0.0).to(dtype), a_layout)",
     "pa = gl.convert_layout((pt * drop_scale).to(dtype), a_layout)"),
    ("bwd_dp_unscaled", F, "dpt = gl.where(keep, dpt * drop_scale, 0.0)", "dpt = gl.where(keep, dpt, 0.0)"),
    ("bwd_pack_bits", F, "bits = gl.where(keep, 1 << (ci * 8 + wi * 2 + ei), 0)",
     "bits = gl.where(keep, 1 << (ci * 8 + wi + ei * 4), 0)"),
    ("fwd_scale_missing", F, "out = acc * (drop_scale / gl.convert_layout(l_i, orow))[:, None]",
     "out = acc / gl.convert_layout(l_i, orow)[:, None]"),
]
if __name__ == "__main__":
    i, root = int(sys.argv[1]), sys.argv[2]
    name, f, old, new = MUTANTS[i]
    p = f"{root}/{f}"
    s = open(p).read()
    assert s.count(old) == 1, (name, s.count(old))
    open(p, "w").write(s.replace(old, new))
    print(name)
