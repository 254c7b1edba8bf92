#!/usr/bin/env bash
# One prepared run for a lent GPU machine (issue 10): the CUDA-vs-CPU tests, a full native capture
# and its comparison.  Results land in $OUT (the device tool copies them back); commit the capture
# under reports/captures/ and the report under reports/.  Budget: about 5 minutes on an H200.
set -uo pipefail
OUT=${OUT:-/tmp/fp8sim-gpu}
mkdir -p "$OUT"
python -m pip install -q --no-deps -e . 2>&1 | tail -1
python - <<'PY' | tee "$OUT/device.txt"
import torch, platform
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0),
      "cc", torch.cuda.get_device_capability(0), "python", platform.python_version())
PY
timeout 240 python -m pytest tests/test_gpu.py -q -p no:cacheprovider 2>&1 | tail -30 | tee "$OUT/gpu_tests.txt"
# issue 15: the torch-ops tensor-core chains on CUDA (bits vs the numpy path, then throughput)
timeout 120 python -m pytest tests/test_gemm_torch_chain.py tests/test_gemm_torch_chain_models.py -q -p no:cacheprovider -k cuda 2>&1 | tail -5 | tee "$OUT/torch_chain_tests.txt"
(cd benchmarks && timeout 180 python bench_gemm.py --torch-device cuda) 2>&1 | tee "$OUT/bench_gemm_cuda.txt"
# issue 15: blackwell_mma, MX, NVFP4 and blockwise scales in torch ops on CUDA (dry run: --device cpu --quick)
timeout 180 python benchmarks/bench_gemm_torch_models.py --device cuda 2>&1 | tee "$OUT/bench_gemm_torch_models_cuda.txt"
name=$(python -c "import torch; print(torch.cuda.get_device_name(0).lower().replace(' ', '-'))")
timeout 240 fp8sim capture --device cuda --suite full --out "$OUT/$name.fp8cap" --no-progress
fp8sim compare "$OUT/$name.fp8cap" --report "$OUT/$name-report" --no-progress | tail -40 | tee "$OUT/compare.txt"
ls -la "$OUT"
