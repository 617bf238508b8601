"""Embedding training on a torch device: the step (``step``) and the backend the Rust epoch
loop calls through the compute seam (``backend``). Importing this package needs torch only
when its modules are imported."""
