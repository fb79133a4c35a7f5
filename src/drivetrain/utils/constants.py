"""Accelerate's file-name constants (``from accelerate.utils import SAFE_WEIGHTS_NAME``), as drivetrain uses them.

The model files are what ``Accelerator.save_model`` writes (Hugging Face's layout): one
``model.safetensors`` (``pytorch_model.bin`` with ``safe_serialization=False``), or shards named by
the pattern (``{suffix}`` is ``-00001-of-00002``) with an index. ``PROFILE_PATTERN_NAME`` is the
trace ``Accelerator.profile`` writes per process.

The training-state names (``SCALER_NAME`` … ``SAMPLER_NAME``) are Accelerate's ``save_state`` file
stems, given for programs that import them; drivetrain's ``save_state`` writes one
``state.ckpt`` holding all of that, so files with these names are not in its folders.
"""

from __future__ import annotations

MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"

SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"

#: ``torch.compile``'s modes, as Accelerate lists them.
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]
