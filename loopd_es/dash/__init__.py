"""The live terminal dashboard (``loopd-es dash``); the only package that imports Textual."""
