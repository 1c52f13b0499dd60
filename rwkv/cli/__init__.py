"""Command-line programs: ``python -m rwkv chat`` and ``python -m rwkv generate`` (see rwkv/__main__.py)."""
