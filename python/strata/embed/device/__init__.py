"""Embedding training on a torch device: the negative-sampling step (``step``), the 1vsAll and
KvsAll step (``vs_all``) and the backend the Rust epoch loop calls through the compute seam
(``backend``). Importing this package needs torch only when its modules are imported."""
