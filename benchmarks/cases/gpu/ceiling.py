# ruff: noqa: RUF002 (tables and messages use typographic signs on purpose)
"""The card's measured bf16 matrix-product rate: the denominator of MFU.

An 8192×8192×8192 bf16 product on random data (never zeros: they run faster), timed with CUDA
events after warm-up; the median of the timed repeats is reported.
"""

import json
import subprocess

import torch

from benchmarks.cases.common import RESULT_PREFIX


def main() -> None:
    size = 8192
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    median = sorted(times)[len(times) // 2]
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except OSError:
        driver = None
    result = {
        "tflops": 2 * size**3 / median / 1e12,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": driver,
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
