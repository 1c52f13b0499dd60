"""rwkv: a fast, safe drop-in replacement for the ``rwkv`` 0.8.32 inference package.

Importing this package does no work: no torch import, no compiling, no environment reads.
Use ``from rwkv.model import RWKV`` and ``from rwkv.utils import PIPELINE, PIPELINE_ARGS``.
"""

from ._version import __version__

__all__ = ["__version__"]
