"""The module Triton's python models import: ``import triton_python_backend_utils as pb_utils``.

It is tensorgate's ``backends.python.pb_utils`` under Triton's name (installed with the
package as a top-level module; the python backend also registers the name before it imports a
model, wherever the server runs from).
"""

from backends.python import pb_utils as _pb_utils
from backends.python.pb_utils import *  # the whole surface, under this name

__all__ = _pb_utils.__all__  # what * exports
