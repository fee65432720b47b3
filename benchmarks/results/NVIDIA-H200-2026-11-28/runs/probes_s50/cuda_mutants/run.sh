#!/usr/bin/env bash
# run.sh W NAME... : mutation run of the CUDA C++ backend (src/warpforge/cuda/csrc), worker W.
# Run from the repository root, in the environment that runs the GPU tests (python = the venv's).
#   W      worker id: tree copy /tmp/cmut$W, CUDA extension cache /tmp/cmut_cache$W (WARPFORGE_CACHE)
#   NAME   a patch basename in .whl/mutants_cuda (select.txt gives its pytest selection), or
#          "baseline": the union of every selection on the unmutated tree (run it first: it also
#          builds the worker's extension and fast path, so later mutants only rebuild what they touch)
# Per NAME: git apply the patch in the tree copy; BUILD the extension in its own process (timeout
# $BUILD_TMO, log $OUT/build_NAME.log; a compiler error is reported as BUILD_FAIL, never as a catch);
# run `python -m pytest -x -q -p no:cacheprovider <selection>` (timeout $PER, default 150 s; log
# $OUT/mut_NAME.log); append "NAME rc=.. secs [VERDICT ...]: <pytest summary>" and up to 3 FAILED/ERROR
# lines to $OUT/res_W.txt; git apply -R.  VERDICT: CAUGHT (rc 1), SURVIVED (rc 0), TIMEOUT (rc 124:
# a hang?), ERROR (other rc). Flags: STALE? (the touched translation unit was not rebuilt),
# TRITON_FALLBACK (a route warned that the backend could not load: its tests then ran Triton),
# BUILD_ERROR_IN_TEST. With TMO (epoch seconds) set, no mutant starts after TMO - 100 s ("NAME NOTRUN (time)").
# Env: OUT (default /tmp/cmut_out), PER, BASE_PER (baseline, default 480), BUILD_TMO (default 600),
# XDIST (e.g. "-n 4", default none).
set -u
W=$1; shift
REPO=$PWD
M=$REPO/.whl/mutants_cuda
OUT=${OUT:-/tmp/cmut_out}
PER=${PER:-150}
BASE_PER=${BASE_PER:-480}
BUILD_TMO=${BUILD_TMO:-600}
XDIST=${XDIST:-}
tree=/tmp/cmut$W
mkdir -p "$OUT"
[ -f "$M/select.txt" ] || { echo "run from the repository root (no $M/select.txt)"; exit 2; }
rm -rf "$tree" && cp -r . "$tree"
export WARPFORGE_CACHE=/tmp/cmut_cache$W WARPFORGE_POISON=1 WARPFORGE_SKIP_SANITIZER=1 PYTHONPATH=$tree/src
export TORCHINDUCTOR_CACHE_DIR=/tmp/cmut_ind$W
set -f   # the selections hold node ids with [..]: no pathname expansion of them
res=$OUT/res_$W.txt

# the extension (and the eager fast path) built from the tree copy, in a process of its own
build() {   # $1: log name
  # a build killed by a timeout leaves torch's lock file behind, and the next build would wait on it
  rm -f "$WARPFORGE_CACHE"/cuda/*/lock "$WARPFORGE_CACHE"/fastpath/*/lock
  (cd "$tree" && timeout -k 10 "$BUILD_TMO" python -c "
import warpforge, warpforge.cuda as c
assert warpforge.__file__.startswith('$tree/'), 'warpforge imported from ' + warpforge.__file__
c.load(verbose=True)
from warpforge.runtime import fastpath
print('fastpath loaded:', fastpath.load())
print('BUILD_OK')
") > "$OUT/build_$1.log" 2>&1
}
rebuilt() {   # the object files ninja rebuilt (from the verbose build log)
  grep -oE ' -o [^ ]+\.o( |$)' "$OUT/build_$1.log" | awk '{print $2}' | xargs -r -n1 basename | sort -u | tr '\n' ' '
}
union() {   # every selection's arguments, each once, in order
  cut -f2 "$M/select.txt" | tr ' ' '\n' | awk 'NF && !seen[$0]++' | tr '\n' ' '
}

for name in "$@"; do
  now=$(date +%s)
  if [ -n "${TMO:-}" ] && [ $((now + 100)) -gt "$TMO" ]; then echo "$name NOTRUN (time)" >> "$res"; continue; fi
  if [ "$name" = baseline ]; then
    sel=$(union); per=$BASE_PER; xflag=""
  else
    sel=$(grep -P "^$name\t" "$M/select.txt" | cut -f2)
    [ -n "$sel" ] || { echo "$name NOSELECTION" >> "$res"; continue; }
    [ -f "$M/$name.patch" ] || { echo "$name NOPATCH" >> "$res"; continue; }
    (cd "$tree" && git apply "$M/$name.patch") || { echo "$name NOAPPLY" >> "$res"; continue; }
    per=$PER; xflag="-x"
  fi
  build "$name"
  brc=$?
  objs=$(rebuilt "$name")
  if [ $brc -ne 0 ] || ! grep -q BUILD_OK "$OUT/build_$name.log"; then
    echo "$name BUILD_FAIL rc=$brc $(( $(date +%s) - now ))s rebuilt=[$objs]" >> "$res"
    grep -m3 -E "error|Error|ninja: build stopped|Assertion" "$OUT/build_$name.log" | cut -c1-200 | sed "s/^/  $name /" >> "$res"
    [ "$name" != baseline ] && (cd "$tree" && git apply -R "$M/$name.patch")
    continue
  fi
  flags=""
  if [ "$name" != baseline ]; then
    # each translation unit the patch touches must have been rebuilt (a header: at least one)
    for f in $(grep -E '^\+\+\+ b/' "$M/$name.patch" | sed 's#^+++ b/##'); do
      base=$(basename "$f"); stem=${base%.*}
      case "$base" in
        *.cu|*.cpp) echo " $objs" | grep -qE " $stem\.(cuda\.)?o " || flags="$flags STALE?($base)";;
        *) [ -n "$objs" ] || flags="$flags STALE?($base)";;
      esac
    done
  fi
  if [ -n "${TMO:-}" ]; then left=$(( TMO - $(date +%s) - 10 )); [ $left -lt $per ] && per=$left; [ $per -lt 1 ] && per=1; fi
  t0=$(date +%s)
  (cd "$tree" && timeout -k 10 "$per" python -m pytest $xflag -q -p no:cacheprovider $XDIST $sel) > "$OUT/mut_$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  case $rc in 0) v=SURVIVED;; 1) v=CAUGHT;; 124|137) v=TIMEOUT;; *) v=ERROR;; esac
  [ "$name" = baseline ] && { [ $rc -eq 0 ] && v=PASS || v=BASELINE_FAILS; }
  grep -q "keep the Triton kernels" "$OUT/mut_$name.log" && flags="$flags TRITON_FALLBACK"
  grep -qE "building the CUDA backend failed|ninja: build stopped|nvcc.* error" "$OUT/mut_$name.log" && flags="$flags BUILD_ERROR_IN_TEST"
  summary=$(grep -E "(passed|failed|error|no tests ran)" "$OUT/mut_$name.log" | tail -1 | cut -c1-160)
  echo "$name rc=$rc ${secs}s [$v$flags build=$(( t0 - now ))s rebuilt=$objs]: $summary" >> "$res"
  grep -E "^(FAILED|ERROR)" "$OUT/mut_$name.log" | head -3 | cut -c1-220 | sed "s/^/  $name /" >> "$res"
  [ "$name" != baseline ] && (cd "$tree" && git apply -R "$M/$name.patch")
done
exit 0
