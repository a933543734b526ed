"""polyml's SCoP layer: Polly's static control parts as data, analyzed and transformed with isl.

Upstream Polly has no C++ pass API left; its JSCoP export/import is the hook.  This package is
laid out like Polly's ``lib/``:

* exchange — :mod:`.jscop` (the JSCoP format: read, write, hash, isl views) and
  :mod:`.exchange` (the round trip through ``opt``: export, legality-checked import);
* analysis — :mod:`.detect` (Polly's SCoP detection and its rejection reasons),
  :mod:`.dependences` (raw/war/waw with isl's dataflow analysis), :mod:`.legality` (a new
  schedule against the dependences), :mod:`.schedule` (flat schedules as schedule trees, bands);
* printers — :mod:`.printer` (text and JSON dumps, the isl AST of a schedule).

Transforms live in ``passes/`` (installed as :mod:`polyml.passes`).
"""
