"""Time ``import torch`` and then one more import statement, in this fresh process.

Deliberately imports nothing of the benchmark package before timing (its helpers import torch).
The statement comes from ``BENCH_CONFIG``; the answer is one ``BENCH_RESULT`` line, as for every
benchmark script. With ``"torch_first": false`` in the config torch is not imported first: the
statement's time is then its whole cost over the interpreter's start (a command such as
``drivetrain --help``), and the result says whether it imported torch itself.
"""

import json
import os
import resource
import sys
import time

config = json.loads(os.environ["BENCH_CONFIG"])
statement = config["statement"]
torch_first = config.get("torch_first", True)

start = time.perf_counter()
if torch_first:
    import torch  # noqa: F401

after_torch = time.perf_counter()
exec(statement)
done = time.perf_counter()

loaded_torch = sys.modules.get("torch")
result = {
    "torch_s": after_torch - start if torch_first else None,
    "import_s": done - after_torch,
    "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "modules": len(sys.modules),
    "torch": loaded_torch.__version__ if loaded_torch is not None else None,
    "drivetrain_file": getattr(sys.modules.get("drivetrain"), "__file__", None),
}
# Same marker as benchmarks.cases.common.RESULT_PREFIX (not imported: it would import torch first).
print("BENCH_RESULT " + json.dumps(result), flush=True)
