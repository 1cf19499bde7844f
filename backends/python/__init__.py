"""Python backend: models written as a Python class, run in the server's own process.

A model folder holds ``config.pbtxt`` with ``backend: "python"`` and ``<version>/model.py``,
which defines a class named ``TensorgateModel``::

    class TensorgateModel:
        def initialize(self, config: dict) -> None: ...      # optional
        def execute(self, inputs: dict) -> dict: ...          # required, one whole batch
        def finalize(self) -> None: ...                       # optional

``execute`` gets every input of the batch by name and returns a mapping that holds at least
every requested output. On KIND_CPU instances the arrays are numpy arrays; on KIND_GPU
instances numeric inputs are CuPy arrays on the instance's device, with the instance's stream
current, and CuPy outputs are copied back to the host. The code runs inside the server
process, one call at a time per instance, always on the instance's worker thread: a crash in
it (a segfault in an extension, ``os._exit``) takes the whole server down, and an endless loop
hangs that instance.
"""
