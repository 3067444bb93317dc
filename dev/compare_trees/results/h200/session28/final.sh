# Final GPU check of issue 48 (and 49's staging): acceptance on the new tree; the 124M f16 step
# in the old tree (e6dbc2e), the new tree without the 16-byte staging (ns) and the new tree
# (ff3d4d6), alternated; the tokenize bench old vs new.
R=$PWD
for t in new old ns; do mkdir -p /tmp/$t && tar -xzf .device/tree-$t.tgz -C /tmp/$t && ln -sfn ../shaders /tmp/$t/istanbul/shaders; done
export ISTANBUL_VOCAB_DIR=$R/.device/vocab ISTANBUL_SHARED_VOCAB=$R/.device/vocab XDG_RUNTIME_DIR=/tmp
run_in() { local t=$1; shift; (cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t "$@"); }
nvidia-smi -L
run_in new timeout 330 python bench/acceptance.py --commit ff3d4d6 --results $OUT --work /tmp/acc 2>&1 | tail -14
mkdir -p $OUT/step
for r in 1; do for t in old ns new; do
  run_in $t timeout 55 python bench/train.py --batch 8 --torch none --steps 8 --warmup 2 --out /tmp/tr-$t-$r 2>&1 | grep -iE "tokens/s|error" | tail -2 | sed "s/^/$t r$r: /"
  cp /tmp/tr-$t-$r/train.json $OUT/step/$t-$r.json 2>/dev/null
done; done
for t in old new; do run_in $t timeout 45 python bench/tokenize_bench.py --vocab gpt2 --mb 16 --passes 3 --peers none --no-extras --out /tmp/tok-$t 2>&1 | grep -E "gpt2 +all" | sed "s/^/$t: /"; done
