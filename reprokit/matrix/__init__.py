"""Where does an archive's divergence reproduce: engine versions and GPU kinds as a matrix.

``specs`` parses ``--versions`` and lists releases from the package index; ``envs`` builds one
isolated, cached uv environment per requirement set; ``cells`` runs an archive's repro.py in one
environment and names the outcome; ``executor`` fans cells out (a local process pool or Ray);
``bisect`` finds where the outcome changes with few environments; ``table`` words the result
(console, matrix.json, ISSUE.md); ``run`` ties them together for ``reprokit verify --versions``.

This wing never imports an engine: the engines run inside the cells' own environments.
"""
