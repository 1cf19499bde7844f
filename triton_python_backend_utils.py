"""The module Triton's python models import: ``import triton_python_backend_utils as pb_utils``.

It is tensorgate's ``backends.python.pb_utils`` under Triton's name (installed with the
package as a top-level module; the python backend also registers the name before it imports a
model, wherever the server runs from).
"""

from backends.python.pb_utils import *  # the whole surface, under this name
from backends.python.pb_utils import __all__  # noqa: F401 - what * exports
