"""Time ``import torch`` and then one more import statement, in this fresh process.

Deliberately imports nothing of the benchmark package before timing (its helpers import torch).
The statement comes from ``BENCH_CONFIG``; the answer is one ``BENCH_RESULT`` line, as for every
benchmark script.
"""

import json
import os
import resource
import sys
import time

statement = json.loads(os.environ["BENCH_CONFIG"])["statement"]

start = time.perf_counter()
import torch  # noqa: E402

after_torch = time.perf_counter()
exec(statement)
done = time.perf_counter()

result = {
    "torch_s": after_torch - start,
    "import_s": done - after_torch,
    "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "modules": len(sys.modules),
    "torch": torch.__version__,
    "drivetrain_file": getattr(sys.modules.get("drivetrain"), "__file__", None),
}
# Same marker as benchmarks.cases.common.RESULT_PREFIX (not imported: it would import torch first).
print("BENCH_RESULT " + json.dumps(result), flush=True)
