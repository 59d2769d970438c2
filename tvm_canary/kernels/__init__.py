"""TensorIR kernel definitions: one file per kernel, each a factory ``make(spec, geometry)``.

Every kernel is written once as TensorIR with two kinds of loops: *grid* loops (blocks) and *lane*
loops (threads of a block). A ``Geometry`` binds them: to ``blockIdx.x`` / ``threadIdx.x`` on CUDA, or
to serial loops of extent 1 on CPU, where the same code then runs in reference order.
"""

from .._sources import require_sources_as_read

require_sources_as_read()  # a kernel imported after an edit of the sources would mix two versions
