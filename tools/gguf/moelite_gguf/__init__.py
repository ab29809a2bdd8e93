"""moelite_gguf: minimal GGUF v3 writer/reader and ggml quantization in numpy.

Import by putting the ``tools/gguf`` directory on sys.path::

    sys.path.insert(0, "<repo>/tools/gguf")
    from moelite_gguf import GGUFWriter, GGUFReader, quants
"""

from . import quants
from .writer import GGUFWriter, GGUFValueType
from .reader import GGUFReader

__all__ = ["quants", "GGUFWriter", "GGUFValueType", "GGUFReader"]
