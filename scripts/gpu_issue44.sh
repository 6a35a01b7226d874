#!/usr/bin/env bash
# Issue 44, items 3-5, in ONE call on a lent GPU: `bash scripts/gpu_issue44.sh`, carry [".gpu_carry"]
# (.gpu_carry/smollm2: SmolLM2-135M-Instruct's config.json and tokenizer files, no weights), timeout_s 480;
# make the carry folder first, here, from the converted SmolLM2 in mini's cache (scripts/setup.sh makes it):
#   mkdir -p .gpu_carry/smollm2 && cp ~/.cache/mini/gguf/SmolLM2-135M-Instruct*/{config.json,tokenizer*.json,\
#       generation_config.json,chat_template.jinja} .gpu_carry/smollm2/ && echo /.gpu_carry/ >> .git/info/exclude
# COMMIT=<hash> names the tree's commit where the copy on the device has no .git.
#
#   0. the card and the software (nvidia-smi, torch, triton, transformers), in report.json;
#   1. `LLM()` start-up, each in a fresh process: the shipped model (its default float32) and the SmolLM2-135M
#      architecture (seeded random bf16 weights beside its config and tokenizer, as `bench gpu --random-weights`):
#      seconds per start-up phase and the KV pool chosen (blocks, budget, policy); the shipped model again, warm;
#   2. `bench async_scheduling` on SmolLM2 (bench gpu step 5: bf16, CUDA graphs, 64 requests x 128 tokens, 3
#      rounds; the bench fails if async gives other tokens than sync);
#   3. `bench compile` on SmolLM2 (bench gpu step 4: torch.compile vs eager, 64 prompts, 3 rounds, inductor's
#      cache empty; tokens compared), with all the time left before DEADLINE_S (default 420 s after the start).
#
# Writes under $OUT (default bench-results/gpu-issue44-<time>/): run.log (everything), startup.jsonl,
# async-smollm2.log, compile-smollm2.log (-shipped instead if the random weights could not be made), and
# report.json + report.md, rewritten after every step (a run cut short keeps its figures), every table naming the
# card. A step that fails or runs out of time does not stop the next one. Nothing is installed.
# The GPU image has no msgspec or pyzmq (mini's engine-core messages and sockets) and no wheel of them for its
# Python 3.12 is at hand: when they are missing, stand-ins that fail on use go on the path. Every step here keeps
# the engine core in its process (MINI_ENABLE_V1_MULTIPROCESSING=0), which never uses them.
# Dry run on a CPU: DEVICE=cpu SMALL=1 OUT=/tmp/issue44 bash scripts/gpu_issue44.sh
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-bench-results/gpu-issue44-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
DEADLINE_S=${DEADLINE_S:-420}
SMOLLM2_DIR=${SMOLLM2_DIR:-.gpu_carry/smollm2}
if [ "${SMALL:-0}" = 1 ]; then SIZE=(2 3 1); else SIZE=(64 128 3); fi   # requests/prompts, async tokens, rounds
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MINI_ENABLE_V1_MULTIPROCESSING=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec > >(tee -a "$OUT/run.log") 2>&1
TEE_PID=$!

if [ "${FORCE_STUBS:-0}" = 1 ] || ! "$PY" -c "import msgspec, zmq" 2>/dev/null; then
  STUBS=$(mktemp -d) && mkdir -p "$STUBS/zmq" && export PYTHONPATH="$PYTHONPATH:$STUBS" MINI_STUBS=1
  cat >"$STUBS/msgspec.py" <<'EOF'
"""Stand-in for msgspec (scripts/gpu_issue44.sh): Struct as a keyword container; any encoding raises."""
import copy


class Struct:
    def __init_subclass__(cls, **options):
        super().__init_subclass__()

    def __init__(self, **values):
        for klass in reversed(type(self).__mro__):
            for name in vars(klass).get("__annotations__", {}):
                setattr(self, name, values.pop(name) if name in values else copy.copy(getattr(klass, name)))
        if values:
            raise TypeError(f"{type(self).__name__}: unknown fields {sorted(values)}")


class _Codec:
    def __init__(self, *args, **kwargs):
        pass

    def encode(self, *args, **kwargs):
        raise RuntimeError("msgspec is a stand-in here: only the in-process engine core runs")

    decode = encode


class msgpack:
    Encoder = Decoder = _Codec


convert = _Codec().encode
EOF
  cat >"$STUBS/zmq/__init__.py" <<'EOF'
"""Stand-in for pyzmq (scripts/gpu_issue44.sh): importable; any socket raises."""
PUSH, PULL, LINGER, POLLIN = 8, 7, 17, 1


class Context:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("pyzmq is a stand-in here: only the in-process engine core runs")


Socket = Poller = Context
EOF
  echo 'from zmq import Context as Socket' >"$STUBS/zmq/asyncio.py"
fi

left() { echo $((DEADLINE_S - SECONDS)); }

record() {  # record STEP EXIT SECONDS LIMIT: fold the step's figures into report.json and rewrite report.md
  "$PY" - "$OUT" "$@" <<'EOF' || echo "(the report could not be written: see above)"
import json, re, sys
from pathlib import Path

out, step, code, seconds, limit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
path = out / "report.json"
report = json.loads(path.read_text()) if path.exists() else {}
result = {"exit": code, "seconds": seconds, "limit_s": limit, "timed_out": code in (124, 137)}
log = out / f"{step}.log"
if log.exists():
    lines = log.read_text(errors="replace").splitlines()
    figures = {}
    for line in lines:
        if match := re.match(r"(eager|compiled) engine built in ([\d.]+) s", line):
            figures[f"{match[1]}_build_s"] = float(match[2])
        elif match := re.match(r"\s*(eager|compiled):\s+(.+) output tok/s", line):
            figures[f"{match[1]}_tok_s"] = match[2]
        elif match := re.match(r"\s*(sync|async) scheduling: (.+)", line):
            figures[f"{match[1]}_scheduling"] = match[2]
        elif re.match(r"\w+=\S", line):
            figures.update(re.findall(r"(\w+)=(\S+)", line))
    result.update(figures=figures, tail=lines[-12:])
if (out / "startup.jsonl").exists():
    report["startup"] = [json.loads(line) for line in (out / "startup.jsonl").read_text().splitlines() if line]
report.setdefault("steps", {})[step] = result
path.write_text(json.dumps(report, indent=1))

env, card = report.get("env", {}), report.get("env", {}).get("card", "(card not read)")
md = [f"# Issue 44 on {card}", "", ", ".join(f"{k} {v}" for k, v in env.items()), "",
      "## LLM() start-up (engine core in process), " + card, "",
      "| model | dtype | LLM() s | load | profile + size KV | KV alloc + graphs | graph capture | block pool | "
      "num_gpu_blocks | KV GiB | KV tokens | mini's CPU cap (blocks) | card |", "|" + "---|" * 13]
for r in report.get("startup", []):
    md.append(f"| {r['case']} | {r['dtype']} | {r['llm_build_s']:.1f} | {r.get('load_model_s', 0):.1f} | "
              f"{r.get('profile_and_size_kv_s', 0):.1f} | {r.get('allocate_kv_and_capture_s', 0):.1f} | "
              f"{r.get('cuda_graph_capture_s', 0):.1f} | {r.get('block_pool_s', 0):.1f} | {r['num_gpu_blocks']:,} | "
              f"{r['kv_gib']:.1f} | {r['kv_cache_tokens']:,} | {r['cpu_cap_blocks']:,} | {r['card']} |")
md += ["", "## Steps (figures from each benchmark's output), " + card, "", "| step | exit | s (limit) | figures |",
       "|---|---|---|---|"]
for name, r in report["steps"].items():
    shown = ", ".join(f"{k}={v}" for k, v in r.get("figures", {}).items())
    shown = "skipped: no time left" if r["limit_s"] == 0 else shown + (" (timed out)" if r["timed_out"] else "")
    md.append(f"| {name} | {r['exit']} | {r['seconds']} ({r['limit_s']}) | {shown} |")
(out / "report.md").write_text("\n".join(md) + "\n")
EOF
}

step() {  # step NAME CAP_S LOG(yes|no) COMMAND...: run under min(CAP_S, time left); never stops the script
  local name=$1 cap=$2 keep_log=$3 limit begun code
  shift 3
  limit=$(left)
  [ "$limit" -gt "$cap" ] && limit=$cap
  if [ "$limit" -lt 30 ]; then
    echo "== $name: skipped, $(left) s left before the deadline"
    record "$name" 125 0 0
    return
  fi
  echo "== $name (limit $limit s, $(left) s left): $(echo "$*" | tr '\n' ' ' | cut -c 1-160)"
  begun=$SECONDS
  if [ "$keep_log" = yes ]; then
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    code=${PIPESTATUS[0]}
  else
    timeout -k 10 "$limit" "$@"
    code=$?
  fi
  echo "== $name: exit $code after $((SECONDS - begun)) s"
  record "$name" "$code" $((SECONDS - begun)) "$limit"
}

STARTUP_PY='
import dataclasses, json, resource, sys, time
begun = time.perf_counter()
import torch
from mini import LLM, SamplingParams
from mini.core.kv_cache_manager import KVCacheManager
from mini.utils import cdiv
from mini.worker import cuda_graph
from mini.worker.worker import Worker

case, model, dtype, device, out = sys.argv[1:6]
imports_s, phases = time.perf_counter() - begun, {}


def timed(owner, name, label):  # wall seconds of one start-up phase, summed over its calls
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            phases[label] = phases.get(label, 0.0) + time.perf_counter() - started
    setattr(owner, name, wrapper)


for owner, name, label in ((Worker, "load_model", "load_model_s"),
                           (Worker, "determine_num_blocks", "profile_and_size_kv_s"),
                           (Worker, "initialize_cache", "allocate_kv_and_capture_s"),
                           (cuda_graph.CudaGraphRunner, "capture", "cuda_graph_capture_s"),
                           (KVCacheManager, "__init__", "block_pool_s")):
    timed(owner, name, label)
started = time.perf_counter()
llm = LLM(model=model or None, device=device, dtype=dtype)
llm_build_s = time.perf_counter() - started
started = time.perf_counter()
llm.generate([{"prompt_token_ids": list(range(1, 17))}],
             SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False)
first_generate_s = time.perf_counter() - started
engine, cuda = llm.llm_engine, device.startswith("cuda")
config, report = engine.config, engine.startup_report
record = {"case": case, "model": model or "shipped (mini/assets/tiny-llama)", "dtype": dtype,
          "card": torch.cuda.get_device_name() if cuda else "cpu", "imports_s": imports_s, "llm_build_s": llm_build_s,
          **phases, "first_generate_16_tokens_s": first_generate_s, **dataclasses.asdict(report),
          "kv_gib": report.num_gpu_blocks * report.bytes_per_block / 2**30, "max_model_len": config.max_model_len,
          "block_size": config.block_size, "max_num_seqs": config.max_num_seqs,
          "gpu_memory_utilization": config.gpu_memory_utilization,
          "cpu_cap_blocks": config.max_num_seqs * cdiv(config.max_model_len, config.block_size) + 1,
          "host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
if cuda:
    free, total = torch.cuda.mem_get_info()
    record.update(gpu_total_gib=total / 2**30, gpu_free_after_gib=free / 2**30,
                  torch_reserved_gib=torch.cuda.memory_reserved() / 2**30)
with open(out, "a") as handle:
    handle.write(json.dumps(record) + "\n")
print(json.dumps(record, indent=1))
'

ENV_PY='
import json, os, platform, subprocess, sys
import torch, transformers
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = None
commit = os.environ.get("COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                     text=True).stdout.strip() or "unknown"
cuda = torch.cuda.is_available()
env = {"card": torch.cuda.get_device_name() if cuda else "no CUDA device",
       "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
       "torch": torch.__version__, "triton": triton_version, "transformers": transformers.__version__,
       "python": platform.python_version(), "cpus": os.cpu_count(), "commit": commit,
       "msgspec_pyzmq": "stand-ins" if os.environ.get("MINI_STUBS") else "installed"}
path = os.path.join(sys.argv[1], "report.json")
report = json.load(open(path)) if os.path.exists(path) else {}
report["env"] = env
json.dump(report, open(path, "w"), indent=1)
print(env)
'

echo "== issue 44 on $(hostname), $(date -u +%FT%TZ), deadline $DEADLINE_S s, output in $OUT"
nvidia-smi -L 2>&1 || echo "(no nvidia-smi)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
step env 60 no "$PY" -c "$ENV_PY" "$OUT"
[ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" &&
  echo "error: torch sees no CUDA device here; DEVICE=cpu runs the same steps on the CPU" && exit 2

RANDOM_DIR=$(mktemp -d)   # the weights step writes the random-weight folder's path here
step weights 120 no "$PY" -c "from mini.bench.gpu import random_weights_copy as r
open('$RANDOM_DIR/path', 'w').write(r('$SMOLLM2_DIR'))"
SMOLLM2=$(cat "$RANDOM_DIR/path" 2>/dev/null)
if [ -n "$SMOLLM2" ]; then TAG=smollm2 MODEL=(--model "$SMOLLM2"); else TAG=shipped MODEL=(); fi
echo "SmolLM2 architecture, random bf16 weights: ${SMOLLM2:-not made, the benchmarks run on the shipped model}"

step startup-shipped 120 no "$PY" -c "$STARTUP_PY" shipped "" float32 "$DEVICE" "$OUT/startup.jsonl"
[ -n "$SMOLLM2" ] && step startup-smollm2 120 no "$PY" -c "$STARTUP_PY" smollm2 "$SMOLLM2" bfloat16 "$DEVICE" \
  "$OUT/startup.jsonl"
# Again, now that Triton's cache holds mini's attention kernels (the first start-up on a fresh machine compiles them).
step startup-shipped-warm 90 no "$PY" -c "$STARTUP_PY" "shipped, 2nd" "" float32 "$DEVICE" "$OUT/startup.jsonl"

step "async-$TAG" 180 yes "$PY" -m mini bench async_scheduling ${MODEL[@]+"${MODEL[@]}"} --device "$DEVICE" \
  --dtype bfloat16 --requests "${SIZE[0]}" --output-len "${SIZE[1]}" --rounds "${SIZE[2]}"

export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)   # cold: compile seconds as a first `LLM(compilation_config=3)` pays
step "compile-$TAG" 600 yes "$PY" -m mini bench compile ${MODEL[@]+"${MODEL[@]}"} --device "$DEVICE" \
  --dtype bfloat16 --num-prompts "${SIZE[0]}" --rounds "${SIZE[2]}"

echo "== done after $SECONDS s"
cat "$OUT/report.md"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null   # run.log complete before the call returns
