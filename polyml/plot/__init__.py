"""Pictures of what polyml reasons about (the ``plot`` extra: ``pip install 'polyml[plot]'``).

One module per picture, each drawing from live data:

* :mod:`polyml.plot.domain` — a statement's iteration domain (a 2-D slice), its tiles, the
  order a schedule visits it and the dependences between its points (``polyml scops --plot``);
* :mod:`polyml.plot.fusion` — the graph after fusion: nests as boxes, refused edges with their
  reason (``polyml build --emit fusion.svg``);
* :mod:`polyml.plot.roofline` — op functions against the host's measured compute and memory
  roofs (``polyml bench --profile N --plot roofline.svg``);
* :mod:`polyml.plot.latency` — per-runner latency distributions (``polyml bench --plot latency.svg``).

Every mark carries an SVG id (matplotlib's ``gid``) naming what it stands for, so tests (and
people) can count what was drawn: ``point``, ``tile-K``, ``dep-KIND-K``, ``nest-K``,
``refused-K``, ``op-K``, ``runner-NAME``.  matplotlib and graphviz are imported only when a
picture is drawn (:mod:`polyml.plot._extra`).
"""
