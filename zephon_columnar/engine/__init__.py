"""The engine: the plan compiler, the runners, the lanes, checkpoints and their restore, rank
aggregation.

One of its classes is public: `PipelineSpec` (`engine/spec.py`), the frozen description of a
run that ``Pipeline.spec`` returns. The rest is what `Pipeline` and `Session` use; their
interfaces may change between releases.
"""
