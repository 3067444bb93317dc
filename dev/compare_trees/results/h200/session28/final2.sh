R=$PWD
for t in new old; do mkdir -p /tmp/$t && tar -xzf .device/tree-$t.tgz -C /tmp/$t && ln -sfn ../shaders /tmp/$t/istanbul/shaders; done
export ISTANBUL_VOCAB_DIR=$R/.device/vocab ISTANBUL_SHARED_VOCAB=$R/.device/vocab XDG_RUNTIME_DIR=/tmp
run_in() { local t=$1; shift; (cd /tmp/$t && PYTHONPATH=/tmp/site:/tmp/$t "$@"); }
for r in 1 2; do for t in old new; do run_in $t timeout 50 python bench/tokenize_bench.py --vocab gpt2 --mb 16 --passes 3 --peers none --no-extras --out /tmp/tok-$t-$r 2>&1 | grep -vE "^ +|Warning|warn" | tail -3 | sed "s/^/$t r$r: /"; done; done
