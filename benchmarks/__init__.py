"""The lab: benchmark suites, the cluster simulator and their results. Not installed with Tessera
(pyproject's package list leaves it out), so it may import ``tests`` (the transformers oracle, the
test images); ``tessera bench --suite NAME`` finds it in a checkout."""
