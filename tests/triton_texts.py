"""Parts of Triton's refusal texts that many tests compare whole (seen on Triton 2.51)."""

from __future__ import annotations

#: How Triton's core begins its refusal of a wrong input of a request that has no id.
NO_ID = "[request id: <id_unknown>] "

#: What it adds to ``unexpected shape`` for a model that batches.
BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)
