#!/bin/bash
# Issue 7's throughput runs: ../shared/bench/compare.py (ours, Zephon 0.2.0 and the limit in
# fresh processes, side by side in every round) for each "JOB ALGORITHM SHUFFLE" given.
#
#   benchmarks/reordering.sh "pretok first_fit 0" "pretok best_fit_wrap 0" "text wrap 8192"
#
# Environment: CORPUS=small|large (benchmarks/data/<CORPUS>), ROUNDS (3), TREE (the checkout ours
# runs from; default: a `git worktree` of HEAD made for the run, so editing the checkout during a
# run cannot leak into it), ZEPHON_PYTHON ('' skips Zephon), OUT (results/issue7_<corpus>_...).
# Writes one summary JSON line per spec to $OUT<corpus>_<job>_<alg>_s<shuffle>.jsonl and the
# per-round lines (tokens, first batch, peak RSS) next to it as .rounds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CORPUS=${CORPUS:-small}
ZPY=${ZEPHON_PYTHON-$ROOT/benchmarks/.venv-zephon/bin/python}
OUT=${OUT:-$ROOT/benchmarks/results/issue7_}
if [ -z "${TREE:-}" ]; then
  TREE=$(mktemp -d /tmp/zc-bench-XXXXXX)
  git -C "$ROOT" worktree add -q --detach "$TREE" HEAD
  trap 'git -C "$ROOT" worktree remove --force "$TREE"' EXIT
fi
echo "ours: $(git -C "$TREE" rev-parse --short HEAD) ($TREE)" >&2
cd "${ZC_SHARED_BENCH:-$ROOT/../shared/bench}"
for spec in "$@"; do
  read -r job alg shuffle <<< "$spec"
  dest="$OUT${CORPUS}_${job}_${alg}_s${shuffle}"
  PYTHONPATH=$TREE "$ROOT/.venv/bin/python" compare.py --corpus "$ROOT/benchmarks/data/$CORPUS" \
    --tokenizer "$ROOT/benchmarks/data/tok32k" --job "$job" --zc-python "$ROOT/.venv/bin/python" \
    --z-python "$ZPY" --rounds "${ROUNDS:-3}" --algorithm "$alg" --num-bins 16 --shuffle "$shuffle" \
    > "$dest.jsonl" 2> "$dest.rounds"
  echo "done $spec $(date -u +%H:%M)" >&2
done
