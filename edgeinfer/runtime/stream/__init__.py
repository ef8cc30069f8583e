"""Streams: the stage planner (``planner``), the local pipeline of stages over threads
(``pipeline``) and the same plan as Ray actors (``ray``)."""
