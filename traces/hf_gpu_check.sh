#!/bin/sh
# One batched GPU check of traces/record_hf.py (see traces/README.md): run
# from a directory holding record_hf.py, the fixtures tests/fixtures/hf as
# hf/, the prompts MODEL.pP.ids and the sfi-ref traces ref-MODEL-pP.db made
# on the CPU by the README's commands; OUT names the output directory.
set -u
cd "$(dirname "$0")"
mkdir -p "$OUT"
log="$OUT/log.txt"
python3 -c "import torch, transformers; print('device', torch.cuda.get_device_name(0), 'torch', torch.__version__, 'transformers', transformers.__version__)" >"$log" 2>&1
for mdl in tiny-qwen3 tiny-qwen3-moe; do
  for p in 0 1; do
    python3 record_hf.py --model hf/$mdl --device cuda --prompt-ids-file $mdl.p$p.ids --max-new 24 \
      --param T_max=5 --level full --top-m 8 --out "$OUT/gpu-$mdl-p$p.db" >>"$log" 2>&1
    echo "compare sfi-ref vs GPU $mdl p$p:" >>"$log"
    python3 record_hf.py --compare ref-$mdl-p$p.db "$OUT/gpu-$mdl-p$p.db" --top-m 8 >>"$log" 2>&1; echo "rc=$?" >>"$log"
  done
done
# A larger random-weight Qwen3 in bf16: 2K prompt, 64 steps, top-64, q/k/v of layer 0 every 32 steps.
python3 - >>"$log" 2>&1 <<'PY'
import torch, random
from transformers import Qwen3Config, Qwen3ForCausalLM
torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                  max_position_embeddings=4096, tie_word_embeddings=False)
m = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained("/tmp/rnd-qwen3")
random.seed(1)
open("/tmp/rnd.ids", "w").write(" ".join(str(random.randrange(4096)) for _ in range(2048)))
print("random model saved")
PY
t0=$(date +%s)
python3 record_hf.py --model /tmp/rnd-qwen3 --device cuda --dtype bfloat16 --prompt-ids-file /tmp/rnd.ids \
  --max-new 64 --param T_max=16 --level full --top-m 64 --snapshot-layers 0 --snapshot-every 32 \
  --out "$OUT/gpu-rnd-2k.db" >>"$log" 2>&1; echo "rc=$?" >>"$log"
t1=$(date +%s)
echo "rnd-2k seconds: $((t1 - t0))" >>"$log"
cat "$log"
