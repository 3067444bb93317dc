# Sourced by the dev/*_next.sh device calls once they have set $out (their output folder):
# makes $out and makes it absolute, sets $py ($PYTHON, else python3), unbuffers Python's
# output. `step NAME LIMIT_S COMMAND...` runs one step into $out/NAME.txt under a time limit,
# counts it in $failed when it fails (a failing step does not stop the others) and prints
# its last lines.
# `choose_steps "DEFAULT STEPS" ARGS...`: the steps the call asked for (ARGS, else the
# defaults); `wanted NAME` says whether NAME is one of them.
mkdir -p "$out"
out=$(realpath "$out")
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
failed=0
step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    if ! timeout "$limit" "$@" > "$out/$name.txt" 2>&1; then
        failed=$((failed + 1))
        echo "   failed: $out/$name.txt"
    fi
    tail -4 "$out/$name.txt"
}
choose_steps() {
    local default=$1
    shift
    want=" ${*:-$default} "
}
wanted() { [[ "$want" == *" $1 "* ]]; }
