"""The ``.eim`` model file: ``save_model`` writes one atomically, ``load_model`` maps one.

See ``edgeinfer.format.eim`` for the byte layout and ``edgeinfer.format.document`` for the
JSON encoding of graphs.
"""

from edgeinfer.format.eim import FORMAT_VERSION, MAGIC, load_model, save_model

__all__ = ["save_model", "load_model", "FORMAT_VERSION", "MAGIC"]
